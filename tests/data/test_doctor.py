"""``hpcml data doctor``: the scan against files written here, each recommendation branch, the CLI."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcml.data import doctor as d
from hpcml.data.cli import app as data_app
from hpcml.data.sources import readable_by_mode
from hpcml.errors import UsageError

GB = 10**9


def _write(path: Path, size: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return size


@pytest.fixture
def images(tmp_path: Path) -> tuple[Path, list[int]]:
    """240 samples of .jpg + .cls in 6 directories, sizes drawn from a fixed seed."""
    rng = random.Random(7)
    root, sizes = tmp_path / "images", []
    for i in range(240):
        sub = root / f"part{i % 6}"
        sizes.append(_write(sub / f"s{i:04d}.jpg", rng.randint(0, 70_000)))
        sizes.append(_write(sub / f"s{i:04d}.cls", len(str(i % 10))))
    return root, sizes


def _nearest_rank(values: list[int], p: int) -> int:
    s = sorted(values)
    return s[max(1, math.ceil(p / 100 * len(s))) - 1]


def _res(ram: int = 100 * GB, local: int = 1000 * GB, tasks: int = 1, shm: int | None = None) -> d.Resources:
    return d.Resources(ram_free=ram, local_dir="/local", local_free=local, tasks=tasks, ram_dir_free=shm)


def _fake(files: int, median: int, total: int, largest: int = 0) -> d.ScanResult:
    """A scan result as recommend() reads it, for datasets too big to write in a test."""
    return d.ScanResult("/data", files=files, bytes=total, tar_bytes=total,
                        sizes=d.SizeStats(0, largest, total / max(files, 1), {"p50": median}),
                        samples=files, largest_sample_bytes=largest or median)


# --- the scan ------------------------------------------------------------------------

def test_counts_sizes_and_percentiles_match_what_was_written(images):
    root, sizes = images
    r = d.scan(root, jobs=4)
    assert r.files == len(sizes) == 480
    assert r.bytes == sum(sizes)
    assert r.directories == 7                      # root + 6 parts
    assert r.sizes.min == min(sizes) and r.sizes.max == max(sizes)
    assert r.sizes.mean == pytest.approx(sum(sizes) / len(sizes))
    assert r.sizes.percentiles == {f"p{p}": _nearest_rank(sizes, p) for p in (10, 50, 90, 99)}
    assert r.tar_bytes == sum(512 + -(-s // 512) * 512 for s in sizes)
    assert not r.unreadable and r.ungroupable_count == 0
    assert r.extensions == [("cls", 240), ("jpg", 240)]


def test_histogram_has_power_of_two_buckets_and_counts_every_file(images):
    root, sizes = images
    hist = d.scan(root).sizes.histogram
    assert sum(b.files for b in hist) == len(sizes)
    for b in hist:
        expected = sum(1 for s in sizes if (s == 0 if b.high == 1 else b.low <= s < b.high))
        assert b.files == expected, b
        assert b.high == 1 or b.high == 2 * b.low
    assert [b.low for b in hist] == sorted(b.low for b in hist)   # contiguous, ascending


def test_samples_follow_the_webdataset_key_rule(tmp_path):
    root = tmp_path / "wds"
    _write(root / "a" / "x.jpg", 100)
    _write(root / "a" / "x.cls", 1)          # same key a/x: one sample of 101 bytes
    _write(root / "a" / "y.seg.png", 300)
    _write(root / "a" / "y.jpg", 50)         # key a/y (up to the first '.'): 350 bytes
    _write(root / "b" / "x.jpg", 10)         # b/x differs from a/x
    _write(root / "README", 5)               # no extension
    _write(root / "a" / ".hidden", 5)        # dot-file
    _write(root / "b" / "trailing.", 5)      # a dot but no extension
    r = d.scan(root)
    assert r.files == 8
    assert r.samples == 3
    assert r.largest_sample_bytes == 350
    assert r.ungroupable_count == 3
    assert r.ungroupable == sorted(str(root / p) for p in ("README", "a/.hidden", "b/trailing."))
    assert dict(r.extensions)["seg.png"] == 1 and dict(r.extensions)[""] == 3


def test_ungroupable_list_is_capped_but_the_count_is_exact(tmp_path):
    for i in range(30):
        _write(tmp_path / "d" / f"noext{i}", 1)
    r = d.scan(tmp_path / "d", listed_limit=10)
    assert r.ungroupable_count == 30 and len(r.ungroupable) == 10


def test_dangling_symlink_directory_link_and_fifo_are_listed_not_counted(tmp_path):
    root = tmp_path / "ds"
    _write(root / "ok.bin", 1000)
    (root / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (root / "sub").mkdir()
    (root / "linked").symlink_to(root / "sub")
    os.mkfifo(root / "pipe.dat")
    _write(tmp_path / "elsewhere.bin", 77)
    (root / "good_link.bin").symlink_to(tmp_path / "elsewhere.bin")   # followed: counted
    r = d.scan(root)
    assert r.files == 2 and r.bytes == 1077
    reasons = {Path(p.path).name: p.reason for p in r.unreadable}
    assert reasons == {"gone.jpg": f"dangling symlink -> {tmp_path / 'nowhere.jpg'}",
                       "linked": "symlink to a directory (not followed)",
                       "pipe.dat": "not a regular file"}
    rec = d.recommend(r, _res())
    assert any("3 entries could not be read" in n for n in rec.notes)


def test_mode_bits_decide_readability_for_a_non_root_user():
    st = os.stat_result((0o100040, 1, 1, 1, 1000, 100, 1, 0, 0, 0))   # r for the group only
    assert not readable_by_mode(st, euid=1000, groups={100})   # the owner's bit wins, and it is unset
    assert readable_by_mode(st, euid=1001, groups={100})
    assert not readable_by_mode(st, euid=1001, groups={200})
    assert readable_by_mode(st, euid=0, groups=set())


def test_missing_path_and_file_path_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such directory") as exc:
        d.scan(tmp_path / "absent")
    assert exc.value.file == str(tmp_path / "absent")
    _write(tmp_path / "file.txt", 3)
    with pytest.raises(UsageError, match="not a directory"):
        d.scan(tmp_path / "file.txt")


def test_progress_callback_sees_the_final_totals(images):
    root, sizes = images
    seen = []
    d.scan(root, on_progress=lambda n, b: seen.append((n, b)))
    assert len(seen) == 7 and seen[-1] == (len(sizes), sum(sizes))


# --- operations per epoch ------------------------------------------------------------

def test_epoch_ops_for_loose_files_and_for_shards(images):
    root, sizes = images
    sizes = [*sizes, _write(root / "empty.txt", 0)]     # an empty file still costs one read
    r = d.scan(root)
    ops = d.epoch_ops(r, shard_bytes=1_000_000, read_size=16_384)
    assert ops.loose.units == 481 and ops.loose.metadata_ops == 3 * 481
    assert ops.loose.read_ops == sum(max(1, -(-s // 16_384)) for s in sizes)
    shards = -(-r.tar_bytes // 1_000_000)
    assert ops.packed.units == shards and ops.packed.metadata_ops == 6 * shards
    assert ops.packed.read_ops == -(-r.tar_bytes // 16_384) + (shards - 1)   # 1e6 is not a multiple


# --- recommendation branches ---------------------------------------------------------

def test_small_median_packs_and_says_why(images):
    rec = d.recommend(d.scan(images[0]), _res())
    assert rec.pack and "median file" in rec.pack_reason and "10,000" not in rec.pack_reason


def test_many_large_files_pack_by_count():
    rec = d.recommend(_fake(files=20_000, median=4 * d.MiB, total=80 * GB), _res())
    assert rec.pack and "20,000 files (> 10,000)" in rec.pack_reason and "median" not in rec.pack_reason


def test_few_large_files_are_read_as_they_are(tmp_path):
    for i in range(5):
        with open(tmp_path / f"big{i}.dat", "wb") as f:   # .npy would be token arrays (below)
            f.truncate(3 * d.MiB)            # sparse: the size is what counts
    r = d.scan(tmp_path)
    rec = d.recommend(r, _res())
    assert not rec.pack and rec.pack_reason.startswith("Read as is")
    assert rec.stage_bytes == r.bytes == 15 * d.MiB     # not the tar size when not packing


def test_placement_ram_then_local_disk_then_stream():
    scan = _fake(files=50_000, median=100_000, total=30 * GB)
    ram = d.recommend(scan, _res(ram=100 * GB))
    assert ram.placement == "ram" and ram.target == "/dev/shm" and "40% of 100 GB" in ram.placement_reason
    disk = d.recommend(scan, _res(ram=50 * GB, local=100 * GB))
    assert disk.placement == "local-disk" and disk.target == "/local" and "80%" in disk.placement_reason
    stream = d.recommend(scan, _res(ram=50 * GB, local=30 * GB))
    assert stream.placement == "stream" and stream.target == "/data"
    assert "packed shards" in stream.placement_reason


def test_ram_fraction_tasks_and_tmpfs_limit_shrink_the_ram_budget():
    scan = _fake(files=50_000, median=100_000, total=30 * GB)
    assert d.recommend(scan, _res(ram=100 * GB), ram_fraction=0.2).placement == "local-disk"
    shared = d.recommend(scan, _res(ram=100 * GB, tasks=2))
    assert shared.placement == "local-disk" and "2 tasks" in shared.placement_reason
    capped = d.recommend(scan, _res(ram=100 * GB, shm=10 * GB))
    assert capped.placement == "local-disk" and "capped by /dev/shm" in capped.placement_reason


def test_large_dataset_gets_default_shards():
    rec = d.recommend(_fake(files=1_000_000, median=100_000, total=100 * GB), _res(), readers=64)
    assert rec.shard_bytes == 256 * 10**6 and rec.shards == math.ceil(100 * GB / (256 * 10**6))


def test_small_dataset_gets_smaller_shards_enough_for_every_reader():
    rec = d.recommend(_fake(files=20_000, median=50_000, total=GB), _res(), readers=64)
    assert rec.shard_bytes < 256 * 10**6 and rec.shards >= 64
    assert math.ceil(GB / (2 * rec.shard_bytes)) < 64        # the largest size that still suffices
    assert "small" in rec.shard_reason


def test_shard_never_smaller_than_the_largest_sample():
    rec = d.recommend(_fake(files=20_000, median=50_000, total=GB, largest=50 * 10**6), _res(), readers=64)
    assert rec.shard_bytes == 50 * 10**6 and "largest sample" in rec.shard_reason


def test_tiny_dataset_says_it_has_fewer_shards_than_readers():
    rec = d.recommend(_fake(files=100, median=1000, total=100_000), _res(), readers=64)
    assert rec.shard_bytes == d.MIN_SHARD and rec.shards == 1 and "fewer than the 64 readers" in rec.shard_reason


def test_ungroupable_files_are_a_note_when_packing(tmp_path):
    _write(tmp_path / "x.jpg", 10)
    _write(tmp_path / "LICENSE", 10)
    rec = d.recommend(d.scan(tmp_path), _res())
    assert rec.pack and any("1 file has no extension" in n for n in rec.notes)


def test_detect_resources_reads_slurm_tmpdir_and_keeps_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path))
    res = d.detect_resources(ram_free=123, tasks=3)
    assert res.local_dir == str(tmp_path) and res.ram_free == 123 and res.tasks == 3
    assert res.local_free > 0
    assert d.detect_resources(local_free=5).local_free == 5
    with pytest.raises(UsageError, match="does not exist"):
        d.detect_resources(local_dir=str(tmp_path / "absent"))


# --- the CLI -------------------------------------------------------------------------

def _invoke(*args: str):
    return CliRunner().invoke(data_app, ["doctor", *args], env={"COLUMNS": "250"})


def test_cli_json_parses_and_carries_the_overrides(images, tmp_path):
    root, sizes = images
    out = _invoke(str(root), "--json", "--ram", "8 GiB", "--local-disk", str(tmp_path),
                  "--local-free", "2 TB", "--readers", "4", "--read-size", "64 KiB")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["scan"]["files"] == len(sizes) and data["scan"]["bytes"] == sum(sizes)
    assert data["resources"]["ram_free"] == 8 * 2**30
    assert data["resources"]["local_dir"] == str(tmp_path)
    assert data["resources"]["local_free"] == 2 * 10**12
    assert data["readers"] == 4 and data["epoch_ops"]["read_size"] == 65536
    assert data["recommendation"]["placement"] == "ram"


def test_cli_human_output_lists_unreadable_entries_and_exits_0(tmp_path):
    root = tmp_path / "ds"
    _write(root / "a.jpg", 10)
    (root / "gone.jpg").symlink_to(tmp_path / "nowhere")
    out = _invoke(str(root), "--ram", "1 GB", "--local-free", "1 TB")
    assert out.exit_code == 0, out.output
    assert f"{root / 'gone.jpg'}: dangling symlink" in out.stdout
    assert "1 unreadable entry" in out.stdout
    assert "pack: yes" in out.stdout and "placement: ram" in out.stdout


def test_cli_missing_path_is_one_line_and_exit_2(tmp_path):
    out = _invoke(str(tmp_path / "absent"))
    assert out.exit_code == 2
    assert out.stderr.strip() == f"hpcml data doctor: error: {tmp_path / 'absent'}: no such directory"
    assert "Traceback" not in out.output


def test_cli_bad_size_names_the_option(tmp_path):
    out = _invoke(str(tmp_path), "--ram", "lots")
    assert out.exit_code == 2
    assert out.stderr.startswith("hpcml data doctor: error: flag '--ram': expected a size")
    assert _invoke(str(tmp_path), "--read-size", "0").exit_code == 2


def test_help_has_an_example():
    out = _invoke("--help")
    assert out.exit_code == 0 and "hpcml data doctor data/" in out.stdout


# --- memmapped token arrays (issue 70): named as such, never packed ------------------------------

def _nanogpt(root: Path) -> None:
    """What nanoGPT's data/openwebtext/prepare.py leaves: np.memmap'd uint16 tokens, meta.pkl."""
    import pickle

    import numpy as np
    root.mkdir(parents=True)
    for name, n in (("train.bin", 2_000_000), ("val.bin", 100_000)):
        arr = np.memmap(root / name, dtype=np.uint16, mode="w+", shape=(n,))
        arr[:] = np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16)
        arr.flush()
    with open(root / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 50257}, f)


def _megatron(root: Path) -> None:
    """Megatron-LM's indexed dataset pair: tokens in PREFIX.bin, PREFIX.idx beside it (its
    header: the magic 'MMIDIDX', version 1, the dtype code, the sizes and pointers)."""
    import struct

    import numpy as np
    root.mkdir(parents=True)
    sizes = np.full(1000, 1024, np.int32)
    np.random.default_rng(1).integers(0, 32000, int(sizes.sum()), dtype=np.uint16).tofile(root / "corpus_text_document.bin")
    with open(root / "corpus_text_document.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", len(sizes))
                + struct.pack("<Q", len(sizes) + 1))
        f.write(sizes.tobytes() + (np.arange(len(sizes), dtype=np.int64) * 2048).tobytes()
                + np.arange(len(sizes) + 1, dtype=np.int64).tobytes())


def _hf_arrow(root: Path) -> None:
    """A Hugging Face datasets save_to_disk directory: Arrow stream files and its JSON."""
    import pyarrow as pa
    root.mkdir(parents=True)
    ids = pa.array([list(range(i, i + 512)) for i in range(600)], type=pa.list_(pa.int32()))
    table = pa.table({"input_ids": ids})
    with pa.OSFile(str(root / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (root / "dataset_info.json").write_text("{}")
    (root / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')


@pytest.mark.parametrize("make, first", [(_nanogpt, "train.bin"), (_megatron, "corpus_text_document.bin"),
                                         (_hf_arrow, "data-00000-of-00001.arrow")])
def test_token_arrays_are_named_and_never_packed(tmp_path, make, first):
    make(tmp_path / "data")
    res = d.detect_resources(ram_free=10**9, local_free=10**9, local_dir=str(tmp_path))
    rep = d.diagnose(tmp_path / "data", res, readers=2)
    assert d.token_arrays(rep.scan) and rep.scan.token_array_names[0] == first
    assert rep.recommendation.pack is False and "memmapped token array" in rep.recommendation.pack_reason
    assert "Pack into shards" not in rep.recommendation.pack_reason


def test_the_doctor_counts_this_machines_readers_and_a_dataset_of_small_files_is_still_packed(tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    for i in range(200):
        (root / f"{i:05d}.jpg").write_bytes(os.urandom(2000))
    (root / "labels.bin").write_bytes(os.urandom(100))        # a small .bin beside the images is no token array
    out = CliRunner().invoke(data_app, ["doctor", str(root), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["readers"] == len(os.sched_getaffinity(0)) and doc["scan"]["token_arrays"] == 0
    assert doc["recommendation"]["pack"] is True
