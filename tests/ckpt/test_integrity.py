"""Nothing the task was told is durable is lost: under kill -9 at random moments, at the
worst moment of a re-save, and with manifests that parse but lie about their keys."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, CheckpointError, PerRank, layout
from hpcml.errors import UsageError

TASK = Path(__file__).with_name("task.py")


def _load(ck: Path) -> int | None:
    state, step = Checkpointer(ck, read_only=True).load_latest()
    assert state is None or int(state["step"]) == step and (state["w"] == step).all()
    return step


def _durable(log: Path) -> int:
    lines = log.read_text().split() if log.exists() else []
    return int(lines[-1]) if lines else 0


def _step_1_loads_and_step_3_saves_once_there_is_room(c: Checkpointer, ck: Path, filler: Path) -> None:
    """After a save that failed on a full disk: nothing was lost, and the next save works."""
    assert _load(ck) == 1
    filler.unlink()
    c.save({"w": np.full(6 << 17, 3), "step": 3}, 3)
    c.close()
    assert _load(ck) == 3


def test_kill_9_never_loses_a_step_the_task_was_told_is_durable(tmp_path):
    """15 kills at random moments (snapshot, paced write, commit, prune) of a task that logs
    each step once ``wait()`` returned: after each kill the checkpoint that loads is complete
    and at least the last step in the task's own log; the log never goes backwards across
    restarts, and every committed checkpoint left verifies."""
    ck, log = tmp_path / "ck", tmp_path / "durable.log"
    rng = random.Random(28)
    for _ in range(15):
        p = subprocess.Popen([sys.executable, str(TASK), str(ck), "--size-mb", "1", "--rate", "20 MB/s",
                              "--keep", "2", "--log", str(log)], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().startswith("resumed at")
        time.sleep(rng.uniform(0.0, 0.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        told = _durable(log)
        step = _load(ck)
        assert (step or 0) >= told, (step, told)
    steps = [int(s) for s in log.read_text().split()]
    assert steps == sorted(steps) and steps[-1] > 5        # it made progress, never went back
    assert len(list(ck.glob("step-*"))) <= 3
    assert all(layout.verify(f) == [] for f in layout.scan(ck) if f.committed)


def test_a_crash_between_the_two_renames_of_a_re_save_keeps_the_step(tmp_path):
    """Re-saving a committed step moves the old one aside and the new one in: SIGKILL
    between the two renames. The step still loads (from the moved copy), ``ls`` shows it, and
    the next commit clears the leftover."""
    ck = tmp_path / "ck"
    for args in (["--at", "4"], ["--at", "5"]):
        subprocess.run([sys.executable, str(TASK), str(ck), *args, "--keep", "3"], check=True, timeout=120)
    p = subprocess.run([sys.executable, str(TASK), str(ck), "--at", "5", "--keep", "3", "--die-after-old-rename"],
                       timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert not (ck / "step-00000005").exists() and list(ck.glob(".old-step-00000005-*"))
    assert _load(ck) == 5
    ls = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "ls", "--json", str(ck)], capture_output=True,
                        text=True, timeout=60)
    assert [(e["step"], e["state"]) for e in json.loads(ls.stdout)["checkpoints"] if e["state"] != "partial"] == \
        [(4, "committed"), (5, "committed")]
    subprocess.run([sys.executable, str(TASK), str(ck), "--at", "6", "--keep", "3"], check=True, timeout=120)
    assert not list(ck.glob(".old-*")) and not list(ck.glob(".partial-*"))
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000004", "step-00000005", "step-00000006"]
    assert _load(ck) == 6


def test_ls_json_gives_a_partial_checkpoint_s_size_as_unknown_not_0(tmp_path):
    """A save cut short leaves ``.partial-step-N`` of some gigabytes: its size is not summed,
    so ``ls --json`` gives null (was 0: a script adding up the disk used counted nothing)."""
    import jsonschema

    from hpcml import schemas
    ck = tmp_path / "ck"
    subprocess.run([sys.executable, str(TASK), str(ck), "--at", "4"], check=True, timeout=120)
    (ck / ".partial-step-00000009").mkdir()
    (ck / ".partial-step-00000009" / "rank-00000.bin").write_bytes(b"\0" * 4096)
    ls = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "ls", "--json", str(ck)], capture_output=True,
                        text=True, timeout=60)
    doc = json.loads(ls.stdout)
    jsonschema.validate(doc, schemas.load("ckpt.list"))
    sizes = {e["state"]: e["size"] for e in doc["checkpoints"]}
    assert sizes["partial"] is None and sizes["committed"] > 0, doc


@pytest.mark.parametrize("edit", [
    lambda m: m.update(rank=m.pop("ranks")),                 # "ranks" renamed
    lambda m: m.update(world_size="1"),                     # a string
    lambda m: m["ranks"]["0"].pop("crc32"),
    lambda m: m.update(ranks=[1]),
    lambda m: m.update(world_size=2),                       # rank 1's shard not listed: load refused it
    lambda m: m["ranks"].update({"1": m["ranks"].pop("0")}),  # not rank 0's
    lambda m: m.update(step=7),                             # not this directory's step
], ids=["ranks-renamed", "world-size-string", "rank-crc-missing", "ranks-a-list", "world-size-not-the-ranks",
        "ranks-not-from-0", "step-not-the-directory"])
def test_a_manifest_with_a_bad_key_is_a_corrupt_checkpoint_not_a_traceback(tmp_path, edit):
    ck = tmp_path / "ck"
    with Checkpointer(ck, max_write_rate=None) as c:
        for s in (1, 2):
            c.save({"w": np.full(10, s), "step": s}, s)
    path = ck / "step-00000002" / layout.MANIFEST
    man = json.loads(path.read_text())
    edit(man)
    path.write_text(json.dumps(man))
    assert _load(ck) == 1
    for cmd, rc in (("ls", 0), ("verify", 1)):
        out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", cmd, "--json", str(ck)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == rc and "Traceback" not in out.stderr, out.stderr
        entries = {e["step"]: e for e in json.loads(out.stdout)["checkpoints"]}
        assert entries[1]["state"] == "committed" and entries[2]["state"] == "corrupt"
        assert "manifest.json" in entries[2]["problems"][0] and "key '" in entries[2]["problems"][0]
    out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "prune", "--keep", "1", str(ck)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert _load(ck) == 1                                   # the corrupt one did not count: 1 stays


@pytest.mark.parametrize("per_rank", [False, True], ids=["sharded", "replicated-with-per-rank-values"])
def test_a_save_that_fills_the_disk_fails_loudly_loses_nothing_and_gives_the_space_back(small_disk, per_rank):
    """Nothing of the failed save stays: no temporary file, no shard, and no partial
    directory holding only its attempt mark. Per rank: rank 0's shard is written, the
    per-rank file after it fills the disk, and both go."""
    ck = small_disk / "ck"
    c = Checkpointer(ck, keep=1, max_write_rate=None, replicated=per_rank)
    wrap = PerRank if per_rank else np.asarray
    c.save({"w": wrap(np.full(6 << 17, 1)), "step": 1}, 1)             # 6 MB
    c.wait()
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * (free - (3 << 20)))                # 3 MB left
    c.save({"w": wrap(np.full(6 << 17, 2)), "step": 2}, 2)
    with pytest.raises(CheckpointError, match="No space left"):
        c.wait()
    assert not list(ck.rglob("*.tmp"))
    assert sorted(p.name for p in ck.iterdir() if p.name != ".owner") == ["step-00000001"]
    assert shutil.disk_usage(small_disk).free >= (3 << 20) - (256 << 10)      # the failed shard gave it back
    _step_1_loads_and_step_3_saves_once_there_is_room(c, ck, filler)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("spoil", [
    lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "ranks": {
        **json.loads(p.read_text())["ranks"], "²": json.loads(p.read_text())["ranks"]["0"]}})),
    lambda p: p.write_text("[" * 200_000 + "]" * 200_000),
    _fifo,
], ids=["rank-key-superscript-digit", "json-nested-too-deeply", "manifest-a-fifo"])
def test_a_hostile_manifest_is_a_corrupt_checkpoint_not_a_traceback_nor_a_hang(tmp_path, spoil):
    """'²'.isdigit() is true and int('²') raises; json.loads raises RecursionError (not a
    ValueError) on deep nesting; reading a FIFO blocks forever."""
    ck = tmp_path / "ck"
    with Checkpointer(ck, max_write_rate=None) as c:
        for s in (1, 2):
            c.save({"w": np.full(10, s), "step": s}, s)
    spoil(ck / "step-00000002" / layout.MANIFEST)
    assert _load(ck) == 1
    for cmd, rc in (("ls", 0), ("verify", 1)):
        out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", cmd, "--json", str(ck)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == rc and "Traceback" not in out.stderr, out.stderr
        entries = {e["step"]: e for e in json.loads(out.stdout)["checkpoints"]}
        assert entries[1]["state"] == "committed" and entries[2]["state"] == "corrupt"
    with Checkpointer(ck, keep=1, max_write_rate=None) as c:
        c.save({"w": np.full(10, 3), "step": 3}, 3)
    assert _load(ck) == 3


@pytest.mark.parametrize("moment", ["_usable", "_read"])
def test_a_read_only_reader_loads_while_the_writer_prunes_what_it_was_reading(tmp_path, moment):
    """The writer (keep=1) commits step 3 and prunes step 2 just when the reader has picked
    step 2 (before verifying it, or between verifying and reading): the reader loads step 3,
    not (None, None) nor a FileNotFoundError."""
    ck = tmp_path / "ck"
    writer = Checkpointer(ck, keep=1, max_write_rate=None)
    for s in (1, 2):
        writer.save({"w": np.full(10, s), "step": s}, s)
        writer.wait()
    reader = Checkpointer(ck, read_only=True)
    real, hits = getattr(reader, moment), []

    def meanwhile(*args, **kw):
        if not hits:
            hits.append(args[0])
            writer.save({"w": np.full(10, 3), "step": 3}, 3)
            writer.wait()
            assert not (ck / "step-00000002").exists()
        return real(*args, **kw)
    setattr(reader, moment, meanwhile)
    state, step = reader.load_latest()
    writer.close()
    assert hits and step == 3 and (state["w"] == 3).all()


def test_a_read_only_reader_does_not_prune_the_writers_checkpoints(tmp_path):
    """A reader's prune (its own keep=3, its own token) removed the writer's 4th and 5th
    newest checkpoints and the partial the writer was filling: it loads, it does not prune."""
    ck = tmp_path / "ck"
    with Checkpointer(ck, keep=5, max_write_rate=None) as writer:
        for s in range(1, 6):
            writer.save({"step": s}, s)
            writer.wait()
        partial = ck / layout.partial_name(6)           # the writer's save of step 6, under way
        partial.mkdir()
        (partial / layout.attempt_mark(writer.token)).touch()
        with pytest.raises(UsageError, match="read_only"):
            Checkpointer(ck, read_only=True).prune()
        assert partial.is_dir() and len(list(ck.glob("step-*"))) == 5


def test_a_commit_that_fills_the_disk_gives_back_the_shard_it_wrote(small_disk):
    """Room for the shard but not for its small files (json, manifest): the failed save
    must not keep its 6 MB shard in the partial directory (the disk stayed full, so every
    later save failed too); with the space back the next save commits."""
    ck = small_disk / "ck"
    c = Checkpointer(ck, keep=1, max_write_rate=None)
    c.save({"w": np.full(6 << 17, 1), "step": 1}, 1)
    c.wait()
    shard = (ck / "step-00000001" / "rank-00000.bin").stat().st_size
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - shard))     # the shard fits, no more
    c.save({"w": np.full(6 << 17, 2), "step": 2}, 2)
    with pytest.raises(CheckpointError, match="No space left"):
        c.wait()
    assert shutil.disk_usage(small_disk).free >= shard - (64 << 10)
    assert not list(ck.glob(".partial-*")) and not list(ck.rglob("*.tmp"))
    _step_1_loads_and_step_3_saves_once_there_is_room(c, ck, filler)


def _link_outside(path: Path) -> None:
    outside = path.parents[2] / "outside.bin"
    shutil.copyfile(path, outside)                     # the same bytes: size and crc32 match
    path.unlink()
    path.symlink_to(outside)


@pytest.mark.parametrize("spoil", [_fifo, _link_outside], ids=["shard-a-fifo", "shard-a-link-outside"])
def test_a_shard_that_is_not_a_regular_file_is_never_read(tmp_path, spoil):
    """A shard replaced by a FIFO (open would wait forever) or by a link to a file outside
    the checkpoint directory (with the very bytes the manifest expects): the checkpoint is
    corrupt, the previous one loads, and nothing hangs (each call in a process with a
    deadline)."""
    ck = tmp_path / "ck"
    with Checkpointer(ck, max_write_rate=None) as c:
        for s in (1, 2):
            c.save({"w": np.full(10, s), "step": s}, s)
    spoil(ck / "step-00000002" / layout.shard_names(0)[0])
    load = (f"from hpcml.ckpt import Checkpointer; print(Checkpointer({str(ck)!r}, read_only=True)"
            ".load_latest()[1])")
    out = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[-1] == "1", out.stderr
    out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "verify", "--json", str(ck)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    entries = {e["step"]: e for e in json.loads(out.stdout)["checkpoints"]}
    assert entries[1]["state"] == "committed" and entries[2]["state"] == "corrupt"
