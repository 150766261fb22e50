"""Fault injection with real processes: kill -9 during the drain, two ranks with gloo,
and the time-limit signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.ckpt import Checkpointer
from tests import needs

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "ckpt" / "train_resume.py"


def _start(ck: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TRAIN), str(ck), "--steps", "100000", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_kill_9_during_the_drain_from_the_local_tier_keeps_the_committed_one(tmp_path):
    """A node lost before its drain finished loses only that checkpoint."""
    ck, local = tmp_path / "ck", tmp_path / "local"
    out = subprocess.run([sys.executable, str(TRAIN), str(ck), "--steps", "3", "--local", str(local), "--rate", "0",
                          "--size-mb", "4"],
                         capture_output=True, text=True, check=True)
    assert "done at 3" in out.stdout
    proc = _start(ck, "--local", str(local), "--rate", "2 MB/s", "--size-mb", "4", "--every", "4")
    proc.stdout.readline()
    deadline = time.time() + 30
    while not list(ck.glob(".partial-step-*/rank-*.tmp")) and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (local / "step-00000004" / "rank-00000.json").exists()      # local copy was complete
    state, step = Checkpointer(ck, local_dir=local, read_only=True).load_latest()
    assert step == 3 and (state["w"] == 3).all()


@pytest.mark.torch
def test_two_ranks_with_gloo_under_hpcml_run(tmp_path):
    """DDP-style: 2 ranks (hpcml run, gloo), each writes its own shard, rank 0 commits once
    both reported; the second run resumes both ranks at the same step."""
    needs.module("torch")
    ck = tmp_path / "ck"
    for steps in ("5", "8"):
        out = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--no-report", "--dir",
                              str(tmp_path / f"job{steps}"), "--", sys.executable, str(TRAIN), str(ck), "--torch",
                              "--steps", steps, "--rate", "0", "--size-mb", "0.1"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    logs = out.stdout + out.stderr + "".join(p.read_text(errors="replace") for p in (tmp_path / "job8").rglob("*")
                                             if p.is_file() and p.suffix in (".log", ".out", ".txt", ""))
    assert logs.count("resumed at 5") == 2 and logs.count("done at 8") == 2, logs[-3000:]
    man = json.loads((ck / "step-00000008" / "manifest.json").read_text())
    assert man["world_size"] == 2 and sorted(man["ranks"]) == ["0", "1"]
    r1 = json.loads((ck / "step-00000008" / "rank-00001.json").read_text())
    assert r1["rank"] == 1 and r1["token"] == man["token"]


def test_sigusr1_takes_a_final_checkpoint_and_stops(tmp_path):
    ck = tmp_path / "ck"
    proc = _start(ck, "--every", "1000", "--step-sleep", "0.01")
    proc.stdout.readline()
    time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    stopped = int(out.split("stopped at ")[1].split()[0])
    state, step = Checkpointer(ck, read_only=True).load_latest()
    assert step == stopped > 0 and (state["w"] == stopped).all()
