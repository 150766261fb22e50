"""The reader treats every file as hostile: a forged index, manifest, compressed shard or
resume state is refused in one line naming the file and the key (or bounded by what the
storage really holds) before anything large is allocated, never a MemoryError, a raw
numpy or OS error, or a hang."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import orjson
import pytest

from hpcml.data import CorruptShardError, ResumeStateError, ShardDataset, order
from hpcml.data import index as shard_index
from hpcml.data.manifest import MAX_SAMPLES, load_manifest
from hpcml.data.wdsindex import index_shards
from hpcml.errors import UsageError
from tests.data.gen import make_shards
from tests.data.test_wdsindex import write_tar

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """2 shards of 75 and 45 samples."""
    return make_shards(tmp_path_factory.mktemp("hostile"), samples=120, target=400_000, hi=8000)[1]


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(packed, out)
    return out


def _ds(path, **kw) -> ShardDataset:
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    kw.setdefault("shuffle", False)
    return ShardDataset(path, **kw)


def _keys(ds) -> list[str]:
    return [s["__key__"] for s in ds]


def _edit_json(path: Path, edit) -> None:
    doc = orjson.loads(path.read_bytes())
    edit(doc)
    path.write_bytes(orjson.dumps(doc))


def _first_index(path: Path) -> Path:
    return path / load_manifest(path).shards[0].index


def _one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg.splitlines() == [msg], msg
    return msg


# -- 1. an index's offsets and lengths ----------------------------------------------------

def test_an_index_claiming_a_petabyte_sample_reads_no_more_than_the_shard_holds(copy, monkeypatch):
    """The last sample's end moved to 10**15 (its members untouched): the read stops at the
    shard's length (fstat), so no buffer is asked beyond it and every sample still reads
    whole (was: a MemoryError asking for a petabyte)."""
    from hpcml.data import reader
    expected = _keys(_ds(copy))
    _edit_json(_first_index(copy), lambda d: d["samples"][-1].__setitem__(2, 10**15))
    asked: list[int] = []
    real_take = reader._Shards._take

    def take(self, n):
        asked.append(n)
        return real_take(self, n)
    monkeypatch.setattr(reader._Shards, "_take", take)
    ds = _ds(copy)
    assert _keys(ds) == expected
    largest = max(s.bytes for s in load_manifest(copy).shards)
    assert asked and max(asked) <= largest, (max(asked), largest)
    assert ds.read_bytes <= sum(s.bytes for s in load_manifest(copy).shards)


def test_a_sample_placed_past_the_shard_s_end_is_corrupt_naming_shard_and_offset(copy):
    """Beyond the file: each sample there is what a truncated shard's are, refused (or
    skipped and counted) in one line naming the shard and the offset."""
    m = load_manifest(copy)

    def far(doc):
        row = doc["samples"][-1]
        ext = row[3][0][0]
        row[1:] = [10**12, 2 * 10**12, [[ext, 10**12 + 512, 10]]]
    _edit_json(copy / m.shards[0].index, far)
    with pytest.raises(CorruptShardError) as caught:
        _keys(_ds(copy))
    msg = _one_line(caught.value)
    assert caught.value.offset == 10**12 and m.shards[0].name in msg and "truncated" in msg
    ds = _ds(copy, on_corrupt="skip")
    with pytest.warns(UserWarning, match="skipping corrupt"):
        keys = _keys(ds)
    assert ds.skipped == 1 and len(keys) == m.samples - 1


def test_a_member_whose_header_is_not_a_regular_file_s_is_corrupt(copy):
    """An index that points at a member whose header says sparse (GNU ``S``: its bytes stored
    are not its data, which tarfile, the scanner and webdataset read through its map): the
    reader refuses it, naming the type, and never returns the bytes stored (was: returned)."""
    m = load_manifest(copy)
    shard = copy / m.shards[0].name
    doc = orjson.loads((copy / m.shards[0].index).read_bytes())
    _ext, off, _size = doc["samples"][0][3][0]
    raw = bytearray(shard.read_bytes())
    hdr = bytearray(raw[off - 512:off])
    hdr[156:157] = b"S"
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    raw[off - 512:off] = hdr
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError) as caught:
        _keys(_ds(copy))
    assert "not a regular file's header (type b'S')" in _one_line(caught.value)


def test_a_shard_with_a_crafted_sparse_map_is_refused_by_the_index_and_the_scan(tmp_path):
    """A hostile GNU sparse member whose map sends its first stored block (a pickle that runs
    a command) to an offset no read reaches: tarfile (the scanner, webdataset) reads a
    harmless pickle, a reader of offsets the other. ``hpcml data index`` refuses the shard and
    ``hpcml scan`` does not call it safe (was: indexed, scanned safe, and the reader returned
    the command's pickle)."""
    import pickle

    evil = b"cposix\nsystem\n(Vecho PWNED\ntR."
    stored = evil.ljust(512, b"\n") + pickle.dumps({"label": 1}, protocol=2).ljust(512, b"\0")
    h = bytearray(512)
    h[0:10] = b"000000.pyd"
    for at, width, n in ((100, 8, 0o644), (108, 8, 0), (116, 8, 0), (124, 12, len(stored)), (136, 12, 0)):
        h[at:at + width] = b"%0*o\0" % (width - 1, n)
    h[156:157], h[257:265] = b"S", b"ustar  \0"
    neg = b"\xff" + (256**11 - 512).to_bytes(11, "big")             # base-256: offset -512
    h[386:398], h[398:410] = neg, b"%011o\0" % 512
    h[410:422], h[422:434] = b"%011o\0" % 0, b"%011o\0" % 512
    h[483:495] = b"%011o\0" % 1024
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    d = tmp_path / "sparse"
    d.mkdir()
    (d / "shard-000000.tar").write_bytes(bytes(h) + stored + b"\0" * 1024)
    p = subprocess.run([sys.executable, "-m", "hpcml", "data", "index", str(d)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "is sparse" in p.stderr and "Traceback" not in p.stderr, p.stderr
    scan = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(d / "shard-000000.tar")], capture_output=True,
                          text=True, timeout=120)
    assert scan.returncode != 0 and "safe" not in scan.stdout.split("|")[0], scan.stdout + scan.stderr


def _negative(d):
    d["samples"][0][1] = -512


def _overlapping(d):
    d["samples"][1][1] = d["samples"][0][2] - 512


def _out_of_order(d):
    d["samples"][0], d["samples"][1] = d["samples"][1], d["samples"][0]


def _member_without_header(d):
    d["samples"][0][3][0][1] = d["samples"][0][1]


def _member_past_sample(d):
    d["samples"][0][3][-1][2] = 10**15


def _string_offset(d):
    d["samples"][0][1] = str(d["samples"][0][1])


def _bool_size(d):
    d["samples"][0][3][0][2] = True


def _float_end(d):
    d["samples"][0][2] = float(d["samples"][0][2])


def _key_not_string(d):
    d["samples"][0][0] = 7


def _fewer_rows(d):
    d["samples"].pop()


@pytest.mark.parametrize(("edit", "key", "words"), [
    (_negative, "samples[0]", "negative offset"),
    (_overlapping, "samples[1]", "overlap"),
    (_out_of_order, "samples[1]", "out of order"),
    (_member_without_header, "samples[0]", "after a header of its own"),
    (_member_past_sample, "samples[0]", "not inside the sample's span"),
    (_string_offset, "samples[0]", "must be integers"),
    (_bool_size, "samples[0]", "integers"),
    (_float_end, "samples[0]", "must be integers"),
    (_key_not_string, "samples[0]", "not a string"),
    (_fewer_rows, "samples", "the manifest"),
], ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_a_malformed_index_is_refused_in_one_line_naming_the_index_and_row(copy, edit, key, words):
    """Negative, overlapping, out of order, a member outside its sample, not an integer, a
    count the manifest does not give: refused when the index is loaded, before a read (was:
    an OSError for a negative pread, an IndexError, a silent misread of another sample's
    bytes, or a CorruptShardError blaming the shard)."""
    idx = _first_index(copy)
    _edit_json(idx, edit)
    with pytest.raises(UsageError) as caught:
        _keys(_ds(copy, on_corrupt="skip"))
    assert not isinstance(caught.value, CorruptShardError)
    assert (caught.value.file, caught.value.key, caught.value.exit_code) == (str(idx), key, 2)
    assert words in _one_line(caught.value)


def test_bench_on_a_forged_index_is_one_line_exit_2(copy):
    """The data CLI's door to the reader: bad input, exit 2, one line, no traceback."""
    idx = _first_index(copy)
    _edit_json(idx, _negative)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    r = subprocess.run([sys.executable, "-m", "hpcml", "data", "bench", str(copy), "--order", "sequential",
                        "--ceiling-size", "1 MB", "--warm", "--json"], capture_output=True, text=True, timeout=120,
                       env=env, cwd=copy)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(idx) in lines[0] and "samples[0]" in lines[0] and "negative offset" in lines[0]


def test_a_shard_that_is_a_fifo_is_refused_not_waited_on(copy):
    """A shard replaced by a FIFO: refused naming it (opening it for reading waited for a
    writer for ever)."""
    shard = copy / load_manifest(copy).shards[0].name
    shard.unlink()
    os.mkfifo(shard)
    caught: list[BaseException] = []

    def read() -> None:
        try:
            _keys(_ds(copy))
        except BaseException as exc:  # noqa: BLE001 - what the reader raised is the finding
            caught.append(exc)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():                  # release the reader that waits, then fail
        fd = os.open(shard, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(30)
        pytest.fail("the reader waited on a FIFO")
    assert caught and isinstance(caught[0], CorruptShardError), caught
    assert str(shard) in _one_line(caught[0]) and "not a regular file" in str(caught[0])


# -- 2. compressed shards -----------------------------------------------------------------

@pytest.fixture
def gz_set(tmp_path) -> Path:
    """One gzipped shard of 3 samples, each 256 KiB of zeros (about 1 KB compressed)."""
    src = tmp_path / "gz"
    src.mkdir()
    write_tar(src / "shard-000000.tar.gz", [(f"s{i}.bin", bytes(256 << 10)) for i in range(3)], mode="w:gz")
    index_shards([str(src)])
    return src


def test_a_compressed_shard_whose_index_claims_more_than_the_bound_is_refused_before_reading(gz_set):
    """Its index is checked against ``MAX_INFLATED_BYTES`` (a compressed shard is one block,
    read whole): a claim of 10 TB is refused naming the index (was: a MemoryError)."""
    idx = gz_set / "shard-000000.idx.json"
    _edit_json(idx, lambda d: d["samples"][-1].__setitem__(2, 10**13))
    with pytest.raises(UsageError) as caught:
        _keys(_ds(gz_set))
    assert (caught.value.file, caught.value.key) == (str(idx), "samples")
    assert "compressed shard may hold" in _one_line(caught.value) and "decompress" in str(caught.value)


def test_an_index_claiming_a_gib_inside_the_bound_allocates_what_decompresses_not_the_claim(gz_set):
    """The last sample's end moved to 1 GiB (under the bound): the block's buffer was the
    claim, zero-filled, before a byte decompressed (40 such shards in a window: 40 GiB). Now
    it grows with what the 1 KB shard decompresses to, and every sample is read from that."""
    idx = gz_set / "shard-000000.idx.json"
    _edit_json(idx, lambda d: d["samples"][-1].__setitem__(2, 1 << 30))
    tracemalloc.start()
    try:
        assert sorted(_keys(_ds(gz_set))) == ["s0", "s1", "s2"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_a_compressed_shard_over_one_gib_decompressed_is_within_the_bound():
    """webdataset reads a .tar.gz of any size, and so did hpcml before the bound: 1 GiB, the
    reader's block limit, refused a valid 1.2 GB shard as it was indexed and as it was read."""
    assert shard_index.MAX_INFLATED_BYTES >= 16 << 30


def test_a_decompression_bomb_is_refused_as_it_is_indexed_and_as_it_is_read(gz_set, tmp_path, monkeypatch):
    """With the bound lowered to 512 KiB: ``hpcml data index`` stops at the member that
    crosses it (a bomb costs the walk no more than the bound), and the reader refuses the
    index made under the higher bound, before it decompresses anything."""
    bomb = tmp_path / "bomb"
    bomb.mkdir()
    (bomb / "b.tar.gz").write_bytes(gzip.compress(
        b"".join(_tar_member(f"s{i}.bin", 1 << 20) for i in range(16)) + bytes(1024)))
    assert (bomb / "b.tar.gz").stat().st_size < 64 << 10          # 16 MiB of tar in under 64 KiB
    monkeypatch.setattr(shard_index, "MAX_INFLATED_BYTES", 512 << 10, raising=False)
    with pytest.raises(UsageError) as caught:
        index_shards([str(bomb)], tmp_path / "out")
    msg = _one_line(caught.value)
    assert str(bomb / "b.tar.gz") in msg and "member 's0.bin'" in msg and "524,288 bytes a compressed shard" in msg
    with pytest.raises(UsageError) as read:
        _keys(_ds(gz_set))
    assert read.value.key == "samples" and "524,288 bytes a compressed shard may hold" in _one_line(read.value)


def _tar_member(name: str, size: int) -> bytes:
    import tarfile
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.USTAR_FORMAT) + bytes(shard_index.padded(size))


def test_a_compressed_object_is_read_no_larger_than_the_bound_whatever_the_manifest_claims():
    """A compressed shard in an object store is held whole: at most ``MAX_COMPRESSED_OBJECT``
    is asked of the store, not the manifest's claim of a petabyte."""
    from hpcml.data import reader

    asked: list[int] = []

    class Body:
        def read(self, n: int) -> bytes:
            asked.append(n)
            return b"x" * 10

        def close(self) -> None:
            pass

    class Client:
        def get_object(self, **_kw):
            return {"Body": Body()}
    reader._object_file(Client(), "bucket", "s.tar.gz", 10**15)
    assert asked == [reader.MAX_COMPRESSED_OBJECT + 1]


# -- 3. the plan's memory -----------------------------------------------------------------

def test_a_plan_holds_its_blocks_not_a_number_per_sample():
    """One shard of 10 million samples in one block (a compressed shard's): planning an
    epoch allocates next to nothing (was: the permutation of every window, 80 MB here, in
    every loader worker); the window draws the same order when it is read."""
    layout = order.Layout(seed=3)
    tracemalloc.start()
    try:
        plan = order.rank_plan([10**7], [0], layout, 0, 0, 1, 2, 8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    win = plan.streams[0][0]
    assert len(win) == plan.samples // 2
    assert (win.order == order._rng(3, 0, 0, 0, 0).permutation(len(win))).all()


def test_block_count_is_what_blocks_cuts():
    import random
    rng = random.Random(5)
    for _ in range(200):
        counts = [rng.choice([0, 1, rng.randint(1, 5000)]) for _ in range(rng.randint(1, 6))]
        sizes = [rng.choice([0, rng.randint(1, 10**8)]) for _ in counts]
        bb = rng.choice([1, 4096, 1 << 20])
        assert order.block_count(counts, sizes, bb) == len(order.blocks(counts, sizes, bb))


def test_a_manifest_counting_more_samples_than_its_shards_hold_is_refused(copy):
    """Each sample is at least a 512-byte header, so a shard of B bytes holds B / 512; and
    all shards together at most MAX_SAMPLES (each shard alone was capped, not their sum)."""
    mpath = copy / "manifest.json"
    _edit_json(mpath, lambda d: d["shards"][1].__setitem__("samples", d["shards"][1]["bytes"] // 512 + 1))
    with pytest.raises(UsageError) as caught:
        _ds(copy)
    assert (caught.value.file, caught.value.key) == (str(mpath), "shards.1.samples")
    assert "each sample at least a 512-byte tar header" in _one_line(caught.value)

    def many(d):
        for s in d["shards"]:
            s["samples"], s["bytes"] = MAX_SAMPLES // 2 + 1, 10**15
    _edit_json(mpath, many)
    with pytest.raises(UsageError) as caught:
        load_manifest(copy)
    assert caught.value.key == "shards" and f"more than the {MAX_SAMPLES:,}" in _one_line(caught.value)


def test_a_plan_the_shards_cannot_fill_is_refused_before_it_is_built(copy):
    """A shard that claims a billion samples in a petabyte: a billion blocks to plan, from
    files of a few hundred KB. Refused naming the manifest, nothing planned (was: a plan
    of a billion tuples on the first iteration)."""
    mpath = copy / "manifest.json"
    _edit_json(mpath, lambda d: d["shards"][0].update(samples=10**9, bytes=10**15))
    with pytest.raises(UsageError) as caught:
        ShardDataset(copy, rank=0, world_size=1)
    assert (caught.value.file, caught.value.key) == (str(mpath), "shards")
    m = load_manifest(copy)
    blocks = order.block_count([s.samples for s in m.shards], [s.bytes for s in m.shards], 1 << 20)
    assert blocks > 10**9 and f"{blocks:,} blocks of 1,048,576 bytes" in _one_line(caught.value)
    assert "index the shards again" in str(caught.value)


def test_a_resumed_block_size_that_would_explode_the_plan_is_refused(copy):
    """The same bound where a state's smaller block size is adopted: its plan is counted
    before the state is taken (a billion samples in a TB: 0.95 M blocks of 1 MiB, within the
    free allowance; 15 M of 64 KiB)."""
    _edit_json(copy / "manifest.json", lambda d: d["shards"][0].update(samples=10**9, bytes=10**12))
    ds = ShardDataset(copy, rank=0, world_size=1)
    state = ds.state_dict()
    state["layout"]["block_bytes"] = 1 << 16
    with pytest.raises(ResumeStateError) as caught:
        ShardDataset(copy, rank=0, world_size=1).load_state_dict(state)
    assert caught.value.key == "layout" and "blocks of 65,536 bytes" in _one_line(caught.value)


# -- 4. the resume state ------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "words"), [
    ("position", -1, "not between 0"),
    ("position", "beyond", "beyond the"),
    ("position", True, "not an integer"),
    ("position", 3.0, "not an integer"),
    ("position", "3", "not an integer"),
    ("position", None, "missing"),
    ("epoch", -1, "not between 0"),
    ("epoch", 10**30, "not between 0"),
    ("epoch", True, "not an integer"),
    ("epoch", "1", "not an integer"),
    ("rank", False, "not an integer"),
    ("world_size", True, "not an integer"),
    ("workers", 0, "not between 1"),
    ("workers", 10**9, "not between 1"),
    ("workers", True, "not an integer"),
    ("batch_size", -8, "not between 1"),
    ("batch_size", "8", "not an integer"),
    ("samples", -1, "not between 0"),
])
@pytest.mark.parametrize("legacy", [False, True], ids=["tagged", "before tags"])
def test_a_resume_state_number_out_of_range_or_not_an_integer_is_refused_naming_it(packed, key, value, words, legacy):
    """A state is a file (a checkpoint's): each number is an integer in range, or one line
    naming its key, and nothing of the state is taken (was: ``int()`` of whatever was
    there: ``"3"``, ``True`` or ``3.0`` resumed, ``-1`` counted from -1, a position past
    the epoch started the next)."""
    ds = _ds(packed)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = ds.state_dict()
    if value is None:
        del state[key]
    else:
        state[key] = len(ds) + 1 if value == "beyond" else value
    if legacy:
        state = {"format": "hpcml-shard-state/1", **{k: v for k, v in state.items() if k != "schema"}}
    fresh = _ds(packed)
    with pytest.raises(ResumeStateError) as caught:
        fresh.load_state_dict(state)
    assert caught.value.key == key and words in _one_line(caught.value)
    assert (fresh.epoch, fresh.position) == (0, 0)


def test_the_state_s_own_numbers_still_resume(packed):
    ds = _ds(packed)
    it = iter(ds)
    head = [next(it)["__key__"] for _ in range(7)]
    again = _ds(packed)
    again.load_state_dict(ds.state_dict())
    assert head + _keys(again) == _keys(_ds(packed))


def test_a_numpy_integer_epoch_the_program_set_still_resumes(packed):
    """``set_epoch(np.int64(2))`` is recorded as given: the state it saved must load (the
    type check first refused its own state)."""
    import numpy as np
    ds = _ds(packed)
    ds.set_epoch(np.int64(2))
    it = iter(ds)
    head = [next(it)["__key__"] for _ in range(5)]
    again = _ds(packed)
    again.load_state_dict(ds.state_dict())
    whole = _ds(packed)
    whole.set_epoch(2)
    assert head + _keys(again) == _keys(whole)
