"""A replicated state with per-rank parts is one checkpoint: rank 0 writes the model once,
every rank its own data-loader position and RNG state beside it, committed together.

The DDP tests run docs/ckpt.md's recipe (``tests/ckpt/ddp_task.py``) as real processes:
torch.distributed over gloo, a real ShardLoader over a packed dataset, and count what each
rank trained on, as the user's code logged it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, CheckpointError, PerRank, load
from hpcml.errors import UsageError
from hpcml.ports import free_port
from tests import needs
from tests.data.gen import make_shards

TASK = Path(__file__).with_name("ddp_task.py")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """301 samples: 150 per rank of 2 (drop_last), 19 batches of 8 per epoch."""
    return make_shards(tmp_path_factory.mktemp("perrank"), samples=301, target=700_000)[1]


def _ddp(world: int, ck: Path, data: Path, log: Path, *extra: str) -> list[tuple[int, str]]:
    """Run the task on ``world`` ranks, each in a session of its own (a crash kills the rank
    with its loader workers); ``(exit code, stdout + stderr)`` of each."""
    log.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_", "HPCML_CKPT_", "HPCML_FARM_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1")), WORLD_SIZE=str(world))
    procs = [subprocess.Popen([sys.executable, str(TASK), str(ck), str(data), str(log), *extra],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for r in range(world)]
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=300)
            out.append((p.returncode, text))
    finally:
        for p in procs:                              # the rank and whatever it left running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return out


def _steps(log: Path, rank: int) -> list[dict]:
    path = log / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _resumed_at(text: str) -> int:
    return int(text.split("resumed at ")[1].split()[0])


def _code_lines(text: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in text.splitlines() if line.split("  #")[0].strip()]


def test_the_task_runs_the_documented_recipe():
    """Every line of docs/ckpt.md's DDP recipe from ``load_latest`` to ``ck.wait()`` is in
    the task, in order (the task adds its logging and its refusal's print around them)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "ckpt.md").read_text()
    recipe = next(b for b in page.split("```python\n")[1:] if "PerRank(" in b).split("```")[0]
    doc = _code_lines(recipe[recipe.index("state, step = ck.load_latest()"):])
    assert doc[-1] == "ck.wait()" and len(doc) > 15
    task = iter(_code_lines(TASK.read_text()))
    missing = [line for line in doc if not any(line == t for t in task)]
    assert not missing, missing


@pytest.fixture(scope="module")
def crashed(shards, tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted 2-rank run of 2 epochs, and one killed (-9, every rank) at step 25
    (epoch 1, mid-epoch), with a copy of its checkpoint directory as the kill left it."""
    needs.module("torch")
    root = tmp_path_factory.mktemp("ddp")
    whole = _ddp(2, root / "ck-whole", shards, root / "log-whole")
    assert [rc for rc, _ in whole] == [0, 0], whole
    crash = _ddp(2, root / "ck", shards, root / "log-1", "--crash-at", "25")
    assert [rc for rc, _ in crash] == [-9, -9], crash
    shutil.copytree(root / "ck", root / "ck-as-crashed", symlinks=True)
    return {"root": root, "data": shards}


@pytest.mark.torch
def test_ddp_recipe_resumes_every_ranks_data_where_it_stopped(crashed):
    """The issue's crash: rank 1 loaded rank 0's loader state and failed on every restart.
    Now each rank continues its own samples: what it trained on, step by step, is the
    uninterrupted run's (no sample twice, none skipped), its RNG stream too, and the
    replicated model ends with the same weights."""
    root, data = crashed["root"], crashed["data"]
    weights_whole = json.loads((root / "log-whole" / "weights.json").read_text())
    again = _ddp(2, root / "ck", data, root / "log-2")
    assert [rc for rc, _ in again] == [0, 0], again
    resumed = {_resumed_at(text) for _, text in again}
    assert len(resumed) == 1
    at = resumed.pop()
    assert 0 < at < 25 and at % 3 == 0                     # a checkpoint before the crash, steps lost after it
    for rank in (0, 1):
        before = _steps(root / "log-1", rank)
        assert before[-1]["step"] == 25 > at                 # the crash's lost steps are replayed
        seen = [s for s in before if s["step"] <= at] + _steps(root / "log-2", rank)
        assert seen == _steps(root / "log-whole", rank)      # keys, order, epochs, RNG draws
    for epoch in (0, 1):                                     # and the uninterrupted run is itself right
        keys = [k for r in (0, 1) for s in _steps(root / "log-whole", r) if s["epoch"] == epoch for k in s["keys"]]
        assert len(keys) == len(set(keys)) == 300
    assert json.loads((root / "log-2" / "weights.json").read_text()) == weights_whole
    man = json.loads(next((root / "ck").glob("step-*/manifest.json")).read_text())
    assert man["replicated"] and sorted(man["ranks"]) == ["0"] and sorted(man["per_rank"]) == ["0", "1"]


@pytest.mark.torch
def test_resuming_mid_epoch_on_another_world_size_is_refused_in_one_line(crashed):
    """2 -> 3 ranks from the mid-epoch checkpoint: every rank refuses at load, in one line
    naming the checkpoint and both world sizes (none goes on to hang in a collective)."""
    root, data = crashed["root"], crashed["data"]
    out = _ddp(3, root / "ck-as-crashed", data, root / "log-3")
    assert [rc for rc, _ in out] == [2, 2, 2], out
    for _, text in out:
        refused = [line for line in text.splitlines() if line.startswith("refused: ")]
        assert len(refused) == 1 and "Traceback" not in text, text
        line = refused[0]
        assert "/step-000000" in line and "manifest.json: key 'data': saved by 2 ranks, this job has 3" in line
        assert "mid-epoch" in line
    assert not _steps(root / "log-3", 0)


@pytest.mark.torch
def test_resuming_at_an_epochs_end_on_another_world_size_reshards_the_data(shards, tmp_path):
    """2 -> 1 rank from a checkpoint at the end of epoch 0: the one rank starts epoch 1
    as a one-rank loader reads it (every sample once), with the 2-rank model; the PerRank
    RNG state, saved with on_resize="none", loads as None."""
    needs.module("torch")
    first = _ddp(2, tmp_path / "ck", shards, tmp_path / "log-1", "--epochs", "1", "--every", "0")
    assert [rc for rc, _ in first] == [0, 0], first
    out = _ddp(1, tmp_path / "ck", shards, tmp_path / "log-2", "--epochs", "2", "--every", "0")
    assert out[0][0] == 0, out
    assert _resumed_at(out[0][1]) == 19
    got = _steps(tmp_path / "log-2", 0)
    assert {s["epoch"] for s in got} == {1} and got[0]["step"] == 20

    from hpcml.data import ShardDataset
    from hpcml.data.torchloader import ShardLoader
    one = ShardLoader(ShardDataset(shards, seed=1234, block_bytes=60_000, window=3, rank=0, world_size=1),
                      batch_size=8, num_workers=2)
    one.set_epoch(1)
    want = [list(b["__key__"]) for b in one]
    assert [s["keys"] for s in got] == want
    assert len({k for b in want for k in b}) == 301


# -- in one process: two Checkpointers as ranks 0 and 1 of one run (HPCML_CKPT_TOKEN) ---------

def _pair(ck: Path, monkeypatch, **kw) -> tuple[Checkpointer, Checkpointer]:
    monkeypatch.setenv("HPCML_CKPT_TOKEN", "t")
    return (Checkpointer(ck, rank=0, world_size=2, replicated=True, max_write_rate=None, **kw),
            Checkpointer(ck, rank=1, world_size=2, replicated=True, max_write_rate=None, **kw))


def _state(rank: int, step: int, **kw) -> dict:
    return {"w": np.full(1000, step), "mine": PerRank(np.array([rank, step]), **kw)}


def _mine(state: dict) -> list[int]:
    return state["mine"].tolist()


def _save(a: Checkpointer, b: Checkpointer, step: int, **kw) -> None:
    b.save(_state(1, step, **kw), step)
    b.wait()
    a.save(_state(0, step, **kw), step)
    a.wait()


def test_a_step_commits_only_when_every_ranks_own_values_are_there(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    a, b = _pair(ck, monkeypatch, commit_timeout=1.0)
    _save(a, b, 1)
    a.save(_state(0, 2), 2)                          # rank 1 never saves step 2
    with pytest.raises(CheckpointError, match=r"ranks \[1\] did not report"):
        a.wait()
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000001"]
    for rank, c in ((0, a), (1, b)):
        state, step = c.load_latest()
        assert step == 1 and _mine(state) == [rank, 1] and (state["w"] == 1).all()


def test_a_missing_or_corrupt_per_rank_file_makes_the_checkpoint_corrupt(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    a, b = _pair(ck, monkeypatch)
    _save(a, b, 1)
    _save(a, b, 2)
    own = ck / "step-00000002" / "own-00001.bin"
    raw = bytearray(own.read_bytes())
    raw[0] ^= 0xFF
    own.write_bytes(raw)                             # rank 1's own values, same size
    assert b.load_latest()[1] == 1                  # rank 1 reads its file: crc32 mismatch
    out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "verify", "--json", str(ck)],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    entries = {e["step"]: e for e in json.loads(out.stdout)["checkpoints"]}
    assert entries[1]["state"] == "committed" and entries[2]["state"] == "corrupt"
    assert entries[2]["problems"][0].endswith("own-00001.bin: checksum mismatch (corrupt)")
    (ck / "step-00000002" / "own-00001.bin").unlink()
    assert a.load_latest()[1] == 1                  # every rank checks every file's size
    assert any("own-00001.bin: missing" in s for s in a.skipped)


def test_a_place_for_a_per_rank_value_its_own_file_lacks_makes_the_checkpoint_corrupt(tmp_path, monkeypatch):
    """The shared index and a rank's own file, each good alone (sizes and checksums right),
    that a load cannot join: the index places per-rank value 1, the own file holds one value.
    Verify passed it and the load raised instead of falling back to the step before."""
    from tests.ckpt.forge import reseal
    ck = tmp_path / "ck"
    a, b = _pair(ck, monkeypatch)
    _save(a, b, 1)
    _save(a, b, 2)
    step = ck / "step-00000002"
    index = step / "rank-00000.json"
    doc = json.loads(index.read_text())
    doc["skeleton"]["__d"]["mine"]["__own"] = 1
    index.write_text(json.dumps(doc))
    reseal(step, index)
    out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "verify", "--json", str(ck)],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    entries = {e["step"]: e for e in json.loads(out.stdout)["checkpoints"]}
    assert entries[1]["state"] == "committed" and entries[2]["state"] == "corrupt"
    assert entries[2]["problems"][0] == (f"{step / 'own-00000.json'}: key 'skeleton': 1 per-rank values, "
                                         f"{index} places value 1")
    for rank, c in ((0, a), (1, b)):                # each falls back to the step before, its own values
        state, got = c.load_latest()
        assert got == 1 and _mine(state) == [rank, 1]


def test_each_rank_and_an_offline_reader_get_their_own_values(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    a, b = _pair(ck, monkeypatch)
    _save(a, b, 3)
    assert _mine(b.load_latest()[0]) == [1, 3]
    monkeypatch.delenv("HPCML_CKPT_TOKEN")
    assert _mine(load(ck, rank=1)[0]) == [1, 3]
    state, step = load(ck)                           # one process, no rank named: rank 0's
    assert step == 3 and _mine(state) == [0, 3] and (state["w"] == 3).all()
    names = sorted(p.name for p in (ck / "step-00000003").iterdir())
    assert names == [".attempt-t.", "manifest.json", "own-00000.bin", "own-00000.json", "own-00001.bin",
                     "own-00001.json", "rank-00000.bin", "rank-00000.json"]


@pytest.mark.parametrize("world", [1, 3])
def test_a_per_rank_value_on_another_world_size_is_refused_or_none_as_asked(tmp_path, monkeypatch, world):
    ck = tmp_path / "ck"
    a, b = _pair(ck, monkeypatch)
    _save(a, b, 1)
    with pytest.raises(UsageError) as caught:
        Checkpointer(ck, rank=0, world_size=world, read_only=True).load_latest()
    msg = str(caught.value)
    assert msg.splitlines() == [msg] and "step-00000001/manifest.json: key 'mine'" in msg
    assert f"saved by 2 ranks, this job has {world}" in msg and "on_resize='none'" in msg
    _save(a, b, 2, on_resize="none")
    state, step = Checkpointer(ck, rank=world - 1, world_size=world, read_only=True).load_latest()
    assert step == 2 and state["mine"] is None and (state["w"] == 2).all()


def test_per_rank_in_a_sharded_checkpoint_is_stored_in_place(tmp_path):
    with Checkpointer(tmp_path / "ck", max_write_rate=None) as c:
        c.save({"mine": PerRank([1, 2])}, 1)
    assert Checkpointer(tmp_path / "ck", read_only=True).load_latest()[0] == {"mine": [1, 2]}
    assert not list((tmp_path / "ck").glob("step-*/own-*"))


def test_on_resize_takes_only_the_known_values():
    with pytest.raises(UsageError, match="key 'on_resize'"):
        PerRank(1, on_resize="wrap")
