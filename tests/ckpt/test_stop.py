"""The final checkpoint on a stop signal is taken at one step agreed by every rank, however
far apart the ranks were when the signal reached each of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer
from hpcml.run.jobdir import log_path
from tests import needs

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "ckpt" / "train_resume.py"


def _rank(ck: Checkpointer, signal_at: int, pause: float, out: dict) -> None:
    w = np.zeros(1000)
    for s in range(1, 10_000):
        if s == signal_at:
            ck.stop_signal = "SIGUSR1"                  # what the handler sets
        w[:] = s
        ck.maybe_save({"w": w, "step": s}, s)
        if ck.stopping:
            out[ck.rank] = s
            return
        time.sleep(pause)


def test_ranks_without_collectives_agree_through_the_checkpoint_directory(tmp_path, monkeypatch):
    """Rank 1 sees the signal at its step 3, rank 0 (faster) only at its step 9: both take the
    final checkpoint at the first signal's step + stop_lead, and it commits."""
    monkeypatch.setenv("HPCML_CKPT_TOKEN", "agree")
    ck = tmp_path / "ck"
    # signals=(): the stop is set by hand; the real handlers would replace pytest's own
    cks = [Checkpointer(ck, rank=r, world_size=2, stop_lead=5, max_write_rate=None, signals=()) for r in (0, 1)]
    out: dict[int, int] = {}
    threads = [threading.Thread(target=_rank, args=(cks[0], 9, 0.001, out)),
               threading.Thread(target=_rank, args=(cks[1], 3, 0.02, out))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert out[0] == out[1], out
    # the first signal's step + 5, whichever rank's came first: 3 + 5, or 9 + 5 when the
    # faster rank 0 got to its step 9 before rank 1's stop reached the directory
    assert out[0] in (8, 14)
    state, step = Checkpointer(ck, rank=1, world_size=2).load_latest()
    assert step == out[0] and (state["w"] == step).all()
    assert not list(ck.glob(".stop-*"))                 # rank 0 removed it after the commit


def _rank_pid(parent: int, rank: str) -> int | None:
    import psutil
    for p in psutil.Process(parent).children(recursive=True):
        try:
            if str(TRAIN) in " ".join(p.cmdline()) and p.environ().get("RANK") == rank:
                return p.pid
        except psutil.Error:
            continue
    return None


@pytest.mark.torch
def test_under_ddp_one_signalled_rank_stops_every_rank_at_the_same_step(tmp_path, monkeypatch):
    """Only rank 1 gets SIGUSR1: the all-reduce at every step tells rank 0 at the same step
    (it says "peer"), both save that step and exit 0; nobody hangs in a collective."""
    needs.module("torch")
    ck = tmp_path / "ck"
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--no-report", "--dir",
                          str(tmp_path / "job"), "--", sys.executable, str(TRAIN), str(ck), "--torch",
                          "--steps", "100000", "--rate", "0", "--size-mb", "0.1", "--every", "50",
                          "--step-sleep", "0.01"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        pid = None
        while time.monotonic() < end and p.poll() is None:
            logs = [log_path(tmp_path / "job", r, "out") for r in (0, 1)]
            if all(f.exists() and "resumed at" in f.read_text() for f in logs):
                pid = _rank_pid(p.pid, "1")
                if pid:
                    break
            time.sleep(0.1)
        assert pid, p.communicate(timeout=5)
        time.sleep(0.5)
        os.kill(pid, signal.SIGUSR1)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, err[-2000:]
    logs = [(log_path(tmp_path / "job", r, "out")).read_text() for r in (0, 1)]
    steps = [int(log.split("stopped at ")[1].split()[0]) for log in logs]
    assert steps[0] == steps[1] and "(peer)" in logs[0] and "(SIGUSR1)" in logs[1], logs
    monkeypatch.setenv("HPCML_CKPT_TOKEN", "reader")
    state, step = Checkpointer(ck, rank=0, world_size=2).load_latest()
    assert step == steps[0] and int(state["step"]) == steps[0]
