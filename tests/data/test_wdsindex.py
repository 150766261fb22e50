"""WebDataset shards made elsewhere, built the way webdataset's TarWriter writes them
(Python's tarfile, one member per field, in sample order): indexed without a write to
the shards, read exactly as ``webdataset.WebDataset`` groups them, resumed, staged."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import orjson
import pytest

from hpcml.data import ShardDataset
from hpcml.data.doctor import detect_resources, diagnose
from hpcml.data.stage import stage
from hpcml.data.wdsindex import base_plus_ext, expand_braces, index_shards, shard_paths
from hpcml.errors import UsageError
from tests.hostile_tars import B_SIZE, HUGE, MEMBERS, gnu_size_tar, pax_size_tar


def write_tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w", fmt=tarfile.USTAR_FORMAT) -> Path:
    """As webdataset's TarWriter: ``tarfile.open(fileobj, mode)`` and ``addfile`` per field."""
    with tarfile.open(path, mode, format=fmt) as tf:
        for name, data in members:
            if name.endswith("/"):
                info = tarfile.TarInfo(name.rstrip("/"))
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o444
            tf.addfile(info, io.BytesIO(data))
    return path


def webdataset_samples(paths: list[Path]) -> list[dict]:
    wds = pytest.importorskip("webdataset")
    ds = wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False)
    return [{k: v for k, v in s.items() if k != "__url__" and not k.startswith("__local")} for s in ds]


def hpcml_samples(path: Path) -> list[dict]:
    ds = ShardDataset(path, shuffle=False, rank=0, world_size=1, drop_last=False)
    return [{k: v for k, v in s.items() if k not in ("__shard__", "__index__")} for s in ds]


@pytest.fixture
def shards(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    big = os.urandom(3 << 20)                         # larger than a block and a window of a small layout
    write_tar(src / "shard-000000.tar", [
        ("train/", b""),                              # a directory member: skipped
        ("__meta__", b"{}"),                           # webdataset's metadata: skipped
        ("train/a.b/000.jpg", b"\xff\xd8\xff" + b"j" * 700),   # a dot in a directory: key train/a.b/000
        ("train/a.b/000.CLS", b"1"),                   # field lower-cased: cls
        ("train/a.b/000.seg.png", b"\x89PNG\r\n\x1a\n" + b"p" * 30),
        ("README", b"no extension: skipped"),
        ("001.jpg", b"\xff\xd8\xff" + b"k" * 10),
        ("002.txt", b"two"),
        ("001.cls", b"7"),                             # not adjacent to 001.jpg: a second sample 001
        ("003.bin", big),
    ])
    write_tar(src / "shard-000001.tar.gz", [(f"{i:03d}.{ext}", f"{i}{ext}".encode() * 50)
                                            for i in range(10, 20) for ext in ("txt", "json")], mode="w:gz")
    write_tar(src / "shard-000002.tar", [(f"long/{'d' * 120}/{i:03d}.txt", b"x" * i) for i in range(1, 6)],
              fmt=tarfile.PAX_FORMAT)              # names past ustar's 100 bytes: PAX headers
    for p in src.iterdir():
        p.chmod(0o444)
    return src


def test_key_rule_is_webdatasets():
    assert base_plus_ext("a/b.c/x.seg.PNG") == ("a/b.c/x", "seg.png")
    assert base_plus_ext("noext") is None and base_plus_ext(".hidden") is None


def test_brace_notation_keeps_padding_and_lists():
    assert expand_braces("s-{000008..000011}.tar") == [f"s-{i:06d}.tar" for i in range(8, 12)]
    assert expand_braces("{a,b}/x-{1..2}.tar") == ["a/x-1.tar", "a/x-2.tar", "b/x-1.tar", "b/x-2.tar"]


def test_samples_are_webdatasets_and_the_shards_are_not_written(shards, tmp_path):
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in shards.iterdir()}
    r = index_shards([str(shards)], tmp_path / "idx")
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in shards.iterdir()} == before
    assert r.split_keys == 1 and r.compressed == 1 and r.skipped_members == 2   # __meta__ (metadata) and README
    ours = hpcml_samples(tmp_path / "idx")
    theirs = webdataset_samples(sorted(shards.iterdir()))
    assert ours == theirs
    keys = [s["__key__"] for s in ours]
    assert keys[:5] == ["train/a.b/000", "001", "002", "001", "003"]
    assert set(ours[0]) == {"__key__", "jpg", "cls", "seg.png"}


def test_index_beside_writable_shards_names_them_plainly(shards, tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    write_tar(own / "a.tar", [("x.txt", b"1"), ("y.txt", b"2")])
    r = index_shards([str(own)])
    assert r.out == own and [s.name for s in r.manifest.shards] == ["a.tar"]
    assert [s["__key__"] for s in hpcml_samples(own)] == ["x", "y"]


def test_read_only_directory_needs_out_in_one_line(shards):
    shards.chmod(0o555)
    try:
        with pytest.raises(UsageError, match="read-only.*--out"):
            index_shards([str(shards)])
    finally:
        shards.chmod(0o755)
    assert not (shards / "manifest.json").exists()


def test_resume_mid_epoch_is_exact(shards, tmp_path):
    idx = tmp_path / "idx"
    index_shards([str(shards / "shard-{000000..000002}.tar*")], idx)
    full = [s["__key__"] for s in ShardDataset(idx, seed=5, rank=0, world_size=1, block_bytes=4096, window=2)]
    first = ShardDataset(idx, seed=5, rank=0, world_size=1, block_bytes=4096, window=2)
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(9)]
    again = ShardDataset(idx, seed=5, rank=0, world_size=1, block_bytes=4096, window=2)
    again.load_state_dict(first.state_dict())
    assert head + [s["__key__"] for s in again] == full


def test_staged_copy_reads_the_same(shards, tmp_path):
    idx = tmp_path / "idx"
    r = index_shards([str(shards)], idx)
    res = stage(idx, str(tmp_path / "local"), env={})
    assert res.staged and res.dataset == r.manifest.dataset
    assert sorted(os.listdir(res.path)) == sorted(
        [".hpcml-stage.json", ".hpcml-stage.lock", "manifest.json"] + [p.name for p in shards.iterdir()]
        + [p.name for p in idx.glob("*.idx.json")])
    assert hpcml_samples(Path(res.path)) == hpcml_samples(idx)


def test_doctor_says_read_as_is_not_repack(shards):
    rep = diagnose(shards, detect_resources(ram_free=1 << 34, local_free=1 << 40))
    assert rep.scan.shards == 3 and rep.scan.compressed_shards == 1
    assert not rep.recommendation.pack and "hpcml data index" in rep.recommendation.pack_reason


@pytest.mark.parametrize("members, problem", [
    ([("a.txt", b"1"), ("a.TXT", b"2")], "second 'txt'"),
])
def test_bad_shards_are_one_line_naming_the_file(tmp_path, members, problem):
    bad = write_tar(tmp_path / "bad.tar", members)
    with pytest.raises(UsageError, match=problem) as exc:
        index_shards([str(bad)], tmp_path / "i")
    assert str(bad) in str(exc.value)


def test_not_a_tar_and_nothing_named(tmp_path):
    (tmp_path / "x.tar").write_bytes(b"hello" * 300)
    with pytest.raises(UsageError, match="not a readable tar") as exc:
        index_shards([str(tmp_path / "x.tar")], tmp_path / "i")
    assert "x.tar" in str(exc.value)
    with pytest.raises(UsageError, match="no such shard"):
        shard_paths([str(tmp_path / "s-{0..1}.tar")])


def test_unindexed_directory_says_how_to_index(shards):
    with pytest.raises(UsageError, match="hpcml data index"):
        ShardDataset(shards)


def test_gzip_member_bytes_are_kept_as_written(tmp_path):
    src = tmp_path / "s"
    src.mkdir()
    write_tar(src / "g.tar", [("0.txt.gz", gzip.compress(b"hello\n"))])
    index_shards([str(src)])
    assert gzip.decompress(hpcml_samples(src)[0]["txt.gz"]) == b"hello\n"


def _index_cli(*args: str) -> subprocess.CompletedProcess:
    """``hpcml data index`` as a user runs it, bounded: a hang fails the test, never the run."""
    return subprocess.run([sys.executable, "-m", "hpcml", "data", "index", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped"])
@pytest.mark.parametrize("build", [pax_size_tar, gnu_size_tar], ids=["pax size", "gnu base-256 size"])
def test_a_member_claiming_10_20_bytes_is_one_line_exit_2(tmp_path, build, gz):
    """A 10 KB shard whose header claims 10**20 bytes: tarfile's stream skip would spin for ever."""
    raw = build(HUGE)
    shard = tmp_path / ("s.tar.gz" if gz else "s.tar")
    shard.write_bytes(gzip.compress(raw) if gz else raw)
    r = _index_cli(str(shard), "--out", str(tmp_path / "i"))
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    line = r.stderr.strip()
    assert str(shard) in line and "member 'b.txt' claims 100,000,000,000,000,000,000 bytes" in line
    assert not (tmp_path / "i" / "manifest.json").exists()


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped"])
@pytest.mark.parametrize("build", [pax_size_tar, gnu_size_tar], ids=["pax size", "gnu base-256 size"])
def test_honest_pax_and_base256_sizes_still_index(tmp_path, build, gz):
    src = tmp_path / "s"
    src.mkdir()
    raw = build(B_SIZE)
    (src / ("s.tar.gz" if gz else "s.tar")).write_bytes(gzip.compress(raw) if gz else raw)
    r = index_shards([str(src)])
    assert r.manifest.samples == 2
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:     # where tarfile itself finds each member
        where = {m.name.split(".")[0]: (m.offset_data, m.size) for m in tf}
    rows = orjson.loads(next(src.glob("*.idx.json")).read_bytes())["samples"]
    assert [(row[0], row[3]) for row in rows] == [("a", [["txt", *where["a"]]]), ("b", [["txt", *where["b"]]])]
    assert hpcml_samples(src) == [{"__key__": name.split(".")[0], "txt": data} for name, data in MEMBERS]
    # a compressed shard's reads wait on decompression: 8 per worker
    from hpcml.data.reader import READ_THREADS
    assert ShardDataset(src, rank=0, world_size=1).threads(4) == (READ_THREADS if gz else 2)
