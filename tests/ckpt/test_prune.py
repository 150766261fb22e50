"""Prune never removes the checkpoint a restart needs: it counts checkpoints that verify,
leaves corrupt ones and symbolic links in place and says so, and clears dead attempts'
partial directories (which filled the disk over many kills)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hpcml.ckpt import Checkpointer, layout

TASK = Path(__file__).with_name("task.py")


def _save(ck: Path, *steps: int, keep: int = 5, mb: float = 0.1) -> None:
    with Checkpointer(ck, keep=keep, max_write_rate=None) as c:
        for s in steps:
            c.save({"w": np.full(int(mb * (1 << 17)), s), "step": s}, s)
            c.wait()


def _corrupt(ck: Path, step: int) -> None:
    """One flipped byte: the size is right, the crc32 is not."""
    path = ck / layout.step_name(step) / "rank-00000.bin"
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(data)


def _hpcml(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True, timeout=120)


def _load(ck: Path) -> int | None:
    state, step = Checkpointer(ck, read_only=True).load_latest()
    assert state is None or int(state["step"]) == step and (state["w"] == step).all()
    return step


def test_prune_keeps_the_newest_checkpoint_that_verifies_when_the_newest_is_corrupt(tmp_path):
    ck = tmp_path / "ck"
    _save(ck, 1, 2, 3)
    _corrupt(ck, 3)
    out = _hpcml("ckpt", "prune", str(ck), "--keep", "1")
    assert out.returncode == 0, out.stderr
    assert _load(ck) == 2                                     # the previous good one is still there
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000002", "step-00000003"]
    assert f"removed {ck / 'step-00000001'}" in out.stdout
    assert f"skipped {ck / 'step-00000003'}: corrupt" in out.stdout and "checksum" in out.stdout


def _index_outside(ck: Path, step: int) -> None:
    """Step ``step``'s index says its first leaf lies at offset 10**12, with every size and
    checksum in the manifest made to match (a buggy or hostile writer's checkpoint)."""
    import json
    import zlib
    d = ck / layout.step_name(step)
    idx = d / "rank-00000.json"
    doc = json.loads(idx.read_text())
    doc["entries"][0]["offset"] = 10**12
    idx.write_text(json.dumps(doc))
    man = json.loads((d / "manifest.json").read_text())
    rec = man["ranks"]["0"]
    rec["json_size"], rec["json_crc32"] = idx.stat().st_size, zlib.crc32(idx.read_bytes())
    (d / "manifest.json").write_text(json.dumps(man))


def test_a_checkpoint_whose_index_points_outside_its_shard_does_not_verify_nor_outlive_a_good_one(tmp_path):
    """Its files match their checksums, but no load can follow its index: verify names it
    (was: "all checkpoints verify"), and prune --keep 1 keeps the good step 1 (was: removed,
    leaving only the one that does not load)."""
    ck = tmp_path / "ck"
    _save(ck, 1, 2)
    _index_outside(ck, 2)
    out = _hpcml("ckpt", "verify", str(ck))
    assert out.returncode != 0 and "1 of 2 checkpoints corrupt (step 2)" in out.stdout, out.stdout + out.stderr
    out = _hpcml("ckpt", "prune", str(ck), "--keep", "1")
    assert out.returncode == 0, out.stderr
    assert (ck / "step-00000001").is_dir() and _load(ck) == 1


def test_a_forged_world_size_is_refused_before_it_is_counted_out(tmp_path):
    """world_size 10**12 in a replicated checkpoint's manifest: refused at once in one line
    (was: a set of 10**12 rank names built until memory ran out)."""
    import json
    ck = tmp_path / "ck"
    _save(ck, 1)
    m = ck / "step-00000001" / "manifest.json"
    doc = json.loads(m.read_text())
    doc.update(replicated=True, world_size=10**12, per_rank={})
    m.write_text(json.dumps(doc))
    out = _hpcml("ckpt", "ls", str(ck))
    assert "per_rank" in out.stdout + out.stderr and "Traceback" not in out.stderr, out.stdout + out.stderr


def test_the_checkpointers_own_prune_counts_only_checkpoints_that_verify(tmp_path, capfd):
    """keep=2 with step 2 corrupt: after step 3 commits, step 1 stays (2 verified: 1 and 3),
    so when step 3 is lost too the job still resumes at step 1."""
    ck = tmp_path / "ck"
    _save(ck, 1, 2)
    (ck / "step-00000002" / "rank-00000.bin").write_bytes(b"")      # truncated
    _save(ck, 3, keep=2)
    assert "prune skipped" in capfd.readouterr().err
    _corrupt(ck, 3)
    assert _load(ck) == 1


def test_prune_with_nothing_that_verifies_removes_no_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    _save(ck, 1, 2)
    _corrupt(ck, 1)
    _corrupt(ck, 2)
    out = _hpcml("ckpt", "prune", str(ck), "--keep", "1")
    assert out.returncode == 0 and "removed" not in out.stdout, out.stdout
    assert len(list(ck.glob("step-*"))) == 2


def test_prune_never_follows_nor_claims_to_remove_a_symbolic_link(tmp_path):
    ck, outside = tmp_path / "ck", tmp_path / "outside"
    _save(ck, 1, 2, 3)
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (ck / "step-00000000").symlink_to(outside, target_is_directory=True)
    out = _hpcml("ckpt", "prune", str(ck), "--keep", "1")
    assert out.returncode == 0, out.stderr
    assert (outside / "precious").read_text() == "keep me"
    assert (ck / "step-00000000").is_symlink()
    assert "step-00000000" not in "".join(line for line in out.stdout.splitlines() if line.startswith("removed"))
    assert f"skipped {ck / 'step-00000000'}: a symbolic link" in out.stdout
    assert _load(ck) == 3


def _dead_attempt(ck: Path, step: int, mb: float) -> None:
    """A job killed with SIGKILL while writing ``step``: at least half its shard on disk."""
    p = subprocess.Popen([sys.executable, str(TASK), str(ck), "--at", str(step), "--size-mb", str(mb),
                          "--rate", "4 MB/s"], stdout=subprocess.PIPE, text=True)
    tmp = ck / layout.partial_name(step) / "rank-00000.bin.tmp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        if tmp.exists() and tmp.stat().st_size >= mb * (1 << 19):
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert tmp.exists(), "the attempt did not get to write"


def test_dead_attempts_partials_are_removed_by_prune(tmp_path):
    ck = tmp_path / "ck"
    _save(ck, 1)
    for step in (5, 6):
        _dead_attempt(ck, step, 1)
    out = _hpcml("ckpt", "prune", str(ck), "--keep", "1")
    assert out.returncode == 0, out.stderr
    assert not list(ck.glob(".partial-*")), out.stdout
    assert _load(ck) == 1


def test_dead_attempts_do_not_fill_the_disk_for_the_next_one(small_disk):
    """A 20 MB file system: one 4 MB checkpoint and three dead attempts of 5 MB each leave
    no room for another save, unless the next job clears them; it does, commits, and the
    last checkpoint loads."""
    ck = small_disk / "ck"
    _save(ck, 1, mb=4)
    for step in (5, 6, 7):
        _dead_attempt(ck, step, 5)
    out = subprocess.run([sys.executable, str(TASK), str(ck), "--at", "2", "--size-mb", "4", "--keep", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not list(ck.glob(".partial-*"))
    assert _load(ck) == 2


def _pair(ck: Path, token: str, monkeypatch, **kw) -> list[Checkpointer]:
    monkeypatch.setenv("HPCML_CKPT_TOKEN", token)
    return [Checkpointer(ck, max_write_rate=None, rank=r, world_size=2, commit_timeout=30, **kw) for r in (0, 1)]


def test_prune_leaves_the_live_jobs_partial_below_a_corrupt_newer_checkpoint(tmp_path, monkeypatch):
    """Two ranks resumed from step 1 because steps 2 and 3 are corrupt; rank 1 has written
    its shard of step 2 and rank 0 has not yet: ``hpcml ckpt prune`` (or rank 0's own prune)
    must not take the live partial for a dead one because step 3 is newer, or rank 0's
    commit of step 2 waits for a shard that is gone and fails."""
    ck = tmp_path / "ck"
    ranks = _pair(ck, "first", monkeypatch, keep=5)
    for s in (1, 2, 3):
        for c in ranks:
            c.save({"w": np.full(100, s), "step": s}, s)
        for c in reversed(ranks):
            c.wait()
    for c in ranks:
        c.close()
    for s in (2, 3):                           # both ranks' shards: each checks its own crc32
        for r in (0, 1):
            path = ck / layout.step_name(s) / f"rank-{r:05d}.bin"
            path.write_bytes(b"\xff" + path.read_bytes()[1:])
    ranks = _pair(ck, "second", monkeypatch, keep=5)
    assert [c.load_latest()[1] for c in ranks] == [1, 1]
    ranks[1].save({"w": np.full(100, 2), "step": 2}, 2)
    ranks[1].wait()
    out = _hpcml("ckpt", "prune", str(ck), "--keep", "3")
    assert out.returncode == 0, out.stderr
    assert not any(".partial-" in line for line in out.stdout.splitlines() if line.startswith("removed"))
    ranks[0].save({"w": np.full(100, 2), "step": 2}, 2)
    ranks[0].wait()
    for c in ranks:
        c.close()
    assert [Checkpointer(ck, read_only=True, rank=r, world_size=2).load_latest()[1] for r in (0, 1)] == [2, 2]


def test_a_local_copy_whose_shared_checkpoint_never_came_is_pruned(tmp_path):
    """Killed during the drain: the node keeps local step-N, the next owner clears the shared
    partial as a dead attempt's, and nothing removed the local copy (a kill -9 loop with
    local_dir left two 4 MB ones). Prune, the CLI's and the one after each commit, does; a
    copy whose shared partial a running attempt still writes stays."""
    ck, local = tmp_path / "ck", tmp_path / "local"
    with Checkpointer(ck, keep=5, local_dir=local, max_write_rate=None) as c:
        for s in (1, 2):
            c.save({"w": np.full(1000, s), "step": s}, s)
            c.wait()
    shutil.copytree(local / layout.step_name(2), local / layout.step_name(9))      # its shared one gone
    out = _hpcml("ckpt", "prune", str(ck), "--keep", "5", "--local", str(local))
    assert out.returncode == 0, out.stderr
    assert f"removed {local / layout.step_name(9)}" in out.stdout, out.stdout
    assert sorted(p.name for p in local.iterdir()) == ["step-00000001", "step-00000002"]
    shutil.copytree(local / layout.step_name(2), local / layout.step_name(9))
    with Checkpointer(ck, keep=5, local_dir=local, max_write_rate=None) as c:
        live = ck / layout.partial_name(12)                  # this attempt's, being drained
        layout.make_dir(live)
        (live / layout.attempt_mark(c.token)).touch()
        shutil.copytree(local / layout.step_name(2), local / layout.step_name(12))
        c.save({"w": np.full(1000, 3), "step": 3}, 3)
        c.wait()
        assert sorted(p.name for p in local.iterdir()) == ["step-00000001", "step-00000002", "step-00000003",
                                                           "step-00000012"]
    assert _load(ck) == 3
