"""``hpcml data bench``: exact counts of every pass, the ceiling, failures, the CLI."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcml.data import loadbench as lb
from hpcml.data.cli import app as data_app
from hpcml.errors import UsageError
from tests.data.gen import make_shards

SAMPLES = 200


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    """(loose files, shard set of the same files): 200 samples of .jpg + .cls, ~10 shards."""
    return make_shards(tmp_path_factory.mktemp("bench"), samples=SAMPLES, target=300_000)


def _files(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _cli(*args: str):
    return CliRunner().invoke(data_app, ["bench", *args], env={"COLUMNS": "200"})


@pytest.mark.parametrize("kind", ["files", "shards"])
@pytest.mark.parametrize("order", ["sequential", "shuffled"])
@pytest.mark.parametrize("workers", [1, 2])
def test_every_pass_reads_the_whole_dataset_exactly(data, kind, order, workers):
    src, shards = data
    sizes = _files(src)
    target = lb.open_target(src if kind == "files" else shards)
    seen = []
    r = lb.run_pass(target, order, workers, seed=3, on_progress=seen.append)
    assert r.samples == (len(sizes) if kind == "files" else SAMPLES)
    assert r.payload_bytes == sum(sizes.values())
    assert sum(seen) == r.samples
    assert (r.kind, r.order, r.workers) == (kind, order, workers)
    if kind == "shards":
        assert r.reads * 10 <= r.samples          # large reads, not one per sample
        assert r.read_bytes >= r.payload_bytes    # tar headers and padding come along
    else:
        assert r.reads >= len(sizes)
        assert r.read_bytes == r.payload_bytes


def test_limits_take_samples_or_bytes_and_shuffle_changes_which(data):
    src, shards = data
    ordered = sorted(_files(src).items())
    files = lb.open_target(src)
    first = lb.run_pass(files, "sequential", 2, limit=50)
    assert (first.samples, first.payload_bytes) == (50, sum(s for _p, s in ordered[:50]))
    mixed = lb.run_pass(files, "shuffled", 2, limit=50, seed=1)
    assert mixed.samples == 50 and mixed.payload_bytes != first.payload_bytes
    by_bytes = lb.run_pass(files, "sequential", 1, limit_bytes=100_000)
    prefix = [s for _p, s in ordered]
    n = next(i for i in range(len(prefix)) if sum(prefix[:i + 1]) >= 100_000) + 1
    assert (by_bytes.samples, by_bytes.payload_bytes) == (n, sum(prefix[:n]))
    st = lb.open_target(shards)
    a = lb.run_pass(st, "sequential", 2, limit=51)
    b = lb.run_pass(st, "shuffled", 2, limit=51, seed=1)
    assert a.samples == b.samples == 51 and a.payload_bytes != b.payload_bytes


def test_bench_reports_ceiling_and_consistent_percentages(data, tmp_path):
    src, _ = data
    before = _files(src)
    r = lb.bench(src, workers=(1, 2), ceiling_dir=tmp_path)
    assert _files(src) == before and not list(tmp_path.iterdir())      # the temporary ceiling file is gone
    c = r.ceiling
    assert c.method == "temp-file" and c.bytes == sum(before.values()) and c.mb_per_s > 0
    assert [(p.order, p.workers) for p in r.passes] == [("sequential", 1), ("sequential", 2),
                                                         ("shuffled", 1), ("shuffled", 2)]
    for p in r.passes:
        assert p.mb_per_s == pytest.approx(p.payload_bytes / p.seconds / 1e6)
        assert p.samples_per_s == pytest.approx(p.samples / p.seconds)
        assert p.pct_of_ceiling == pytest.approx(100 * p.mb_per_s / c.mb_per_s)
    assert r.cache == "cold" and "posix_fadvise" in r.notes[0]
    assert any("one file" in n for n in r.notes)
    doc = r.to_json()
    assert doc["ceiling"]["mb_per_s"] == pytest.approx(c.mb_per_s, rel=1e-3)
    assert doc["passes"][0]["pct_of_ceiling"] == r.passes[0].pct_of_ceiling


def test_shard_ceiling_reads_the_shards(data):
    _, shards = data
    target = lb.open_target(shards)
    c = lb.measure_ceiling(target)
    assert c.method == "shards" and c.bytes == target.bytes == sum(
        p.stat().st_size for p in shards.glob("*.tar"))
    assert c.reads == len(target.files) and c.mb_per_s > 0
    capped = lb.measure_ceiling(target, max_bytes=100_000)
    assert capped.bytes == 100_000


def test_ceiling_from_the_largest_files_when_no_temporary_file(data):
    src, _ = data
    target = lb.open_target(src)
    c = lb.measure_ceiling(target, max_bytes=60_000)
    assert c.method == "largest-files" and c.bytes == 60_000 and c.mb_per_s > 0
    sizes = sorted((s for _p, s in target.files), reverse=True)
    k = next(i + 1 for i in range(len(sizes)) if sum(sizes[:i + 1]) >= 60_000)
    assert c.reads == k                           # the k largest files, each in one read


def test_temporary_file_removed_when_the_ceiling_fails(data, monkeypatch):
    src, _ = data
    before = _files(src)

    def broken(*a, **k):
        raise UsageError("disk gone")
    monkeypatch.setattr(lb, "read_sequential", broken)
    scratch = src.parent / "scratch"
    scratch.mkdir()
    with pytest.raises(UsageError, match="disk gone"):
        lb.measure_ceiling(lb.open_target(src), temp_dir=scratch)
    assert _files(src) == before
    assert not list(scratch.iterdir())


def test_bench_never_writes_into_the_dataset_unasked(data, tmp_path):
    """Issue 19: the ceiling's 32 MB temporary file went into someone's dataset directory."""
    src, _ = data
    before = {p.name: p.stat().st_mtime_ns for p in src.iterdir()}
    r = lb.bench(src, orders=["sequential"], limit=50)
    assert r.ceiling.method in ("largest-files", "image")
    assert {p.name: p.stat().st_mtime_ns for p in src.iterdir()} == before
    r = lb.bench(src, orders=["sequential"], limit=50, ceiling_dir=tmp_path)
    assert r.ceiling.method == "temp-file" and str(tmp_path) in r.ceiling.detail
    assert not list(tmp_path.iterdir())


def _slow_first_worker(target: lb.Target, marker: Path, then):
    """Worker 0 would finish (and leave ``marker``) only long after worker 1 fails."""
    first = target.files[0][0]

    def fake(paths, report):
        if paths and paths[0] == first:
            time.sleep(30)
            marker.touch()
            return lb.WorkerStats()
        then()
    return fake


def _raise():
    raise RuntimeError("disk on fire")


def test_a_failing_worker_stops_the_others(data, monkeypatch, tmp_path):
    target = lb.open_target(data[0])
    marker = tmp_path / "worker0-finished"
    monkeypatch.setattr(lb, "_read_files", _slow_first_worker(target, marker, _raise))
    with pytest.raises(lb.WorkerError, match="loader worker 1 failed: RuntimeError: disk on fire"):
        lb.run_pass(target, "sequential", 2)
    assert multiprocessing.active_children() == []
    assert not marker.exists()                    # stopped, not waited for


def test_a_dying_worker_is_noticed(data, monkeypatch, tmp_path):
    target = lb.open_target(data[0])
    marker = tmp_path / "worker0-finished"
    monkeypatch.setattr(lb, "_read_files", _slow_first_worker(target, marker, lambda: os._exit(7)))
    outcome: list[BaseException] = []

    def run():
        try:
            lb.run_pass(target, "sequential", 2)
        except BaseException as exc:              # noqa: BLE001 - handed to the test below
            outcome.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)                                   # a guard against a hang, not a speed check
    assert not t.is_alive(), "run_pass hangs on a dead worker"
    assert len(outcome) == 1 and isinstance(outcome[0], lb.WorkerError)
    assert "loader worker 1 died (exit code 7)" in str(outcome[0])
    assert not marker.exists()
    assert multiprocessing.active_children() == []


def test_mount_of_takes_the_longest_mount_point(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\n"
                      "/dev/loop3 /mnt/my\\040data squashfs ro 0 0\n"
                      "squashfuse /mnt/my\\040data/sub fuse.squashfuse rw 0 0\n")
    assert lb.mount_of("/mnt/my data/x", str(mounts)) == lb.Mount("/mnt/my data", "/dev/loop3", "squashfs")
    assert lb.mount_of("/mnt/my data/sub/y", str(mounts)).fstype == "fuse.squashfuse"
    assert lb.mount_of("/mnt/my datab", str(mounts)).fstype == "ext4"


def test_cli_json(data):
    _, shards = data
    out = _cli(str(shards), "--workers", "1,2", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["kind"] == "shards" and doc["samples"] == SAMPLES and doc["ceiling"]["mb_per_s"] > 0
    assert len(doc["passes"]) == 4 and all(p["samples"] == SAMPLES for p in doc["passes"])
    assert doc["fstype"] == lb.mount_of(shards).fstype


def test_cli_table_with_progress_bar(data, monkeypatch):
    src, _ = data
    import hpcml.data.cli.bench as cb
    monkeypatch.setattr(cb, "_want_progress", lambda: True)
    out = _cli(str(src), "--order", "shuffled", "--limit", "100", "--warm")
    assert out.exit_code == 0, out.output
    assert "% ceiling" in out.stdout and "ceiling" in out.stdout and "warm" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.strip().startswith("shuffled")]
    assert len(rows) == 1 and "(100 per pass)" in out.stdout


@pytest.mark.parametrize("setup, expect", [
    ("absent", "absent: does not exist"),
    ("empty", "empty: no files to read"),
    ("garbage", "manifest.json: not JSON"),
])
def test_cli_bad_target_is_one_line_exit_2(tmp_path, setup, expect):
    path = tmp_path / setup
    if setup != "absent":
        path.mkdir()
    if setup == "garbage":
        (path / "manifest.json").write_text("{nope")
    out = _cli(str(path))
    assert out.exit_code == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("hpcml data bench: error: ") and expect in out.stderr


def test_cli_truncated_shard_exit_2_naming_it(data, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(data[1], shards)
    victim = shards / "shard-000001.tar"
    os.truncate(victim, victim.stat().st_size // 2)
    out = _cli(str(shards), "--workers", "2")
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(victim) in lines[0] and "offset" in lines[0]


def test_cli_worker_failure_exit_1(data, monkeypatch):
    src, _ = data

    def fake(paths, report):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(lb, "_read_files", fake)
    out = _cli(str(src), "--order", "sequential")
    assert out.exit_code == 1
    assert out.stderr.strip() == "hpcml data bench: error: loader worker 0 failed: RuntimeError: disk on fire"


def test_cli_contradicting_cache_options(data):
    out = _cli(str(data[0]), "--warm", "--drop-caches")
    assert out.exit_code == 2 and "--drop-caches" in out.stderr


def test_the_ceiling_file_killed_at_random_leaves_nothing(tmp_path):
    """Issue 61: the ceiling's temporary file (up to 1 GB) must not outlive a bench killed
    with SIGKILL; 40 kills at random moments while it is written, read and closed."""
    from tests.killloop import kill_loop, left

    def work(i):
        fd = lb._write_temp(tmp_path, 4 << 20)
        lb.read_sequential([lb.scratch.fd_path(fd)], 4 << 20, threads=2)
        os.close(fd)
    k = kill_loop(work)
    assert k.killed == 40 and k.done > 0, k
    assert left(tmp_path) == []
