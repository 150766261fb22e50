"""A nanoGPT-style script under ``hpcml run``, unchanged, faults injected from outside, each
ledger figure checked against the script's own step ledger (an O_APPEND file of attempt,
rank, iteration and time; ``scripts/nanogpt_style.py``):

* rank 1 killed (SIGKILL) from outside after iteration 13, checkpoints every 5 iterations,
  ``--step-pattern 'iter (\\d+):'`` with a line every 3 iterations: the step the script
  resumed at and the iterations it did again are the ledger's;
* rank 1 stopped (SIGSTOP) for 3 s from outside, short of the hang timeout: the ledger's
  ``stalls`` part is the gap in the script's own step times.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("scripts") / "nanogpt_style.py"


def _rows(ledger: Path) -> list[tuple[int, int, int, float]]:
    if not ledger.exists():
        return []
    out = []
    for line in ledger.read_text().splitlines():
        a, r, s, t = line.split()
        out.append((int(a), int(r), int(s), float(t)))
    return out


def _start(tmp_path: Path, *options: str, **env: str) -> tuple[subprocess.Popen, Path, Path]:
    ledger, pids = tmp_path / "ledger", tmp_path / "pids"
    pids.mkdir()
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(tmp_path / "out"), "LEDGER": str(ledger),
            "PIDS": str(pids), "OMP_NUM_THREADS": "1", **env}
    (tmp_path / "out").mkdir()
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--dir", "job", "--kill-grace", "5",
                          "--no-report", *options, "--", sys.executable, str(SCRIPT)],
                         cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, ledger, pids


def _when(ledger: Path, p: subprocess.Popen, seen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not any(seen(row) for row in _rows(ledger)):
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the script never got there"
        time.sleep(0.05)


@pytest.mark.torch
def test_the_step_a_printing_script_resumed_at_and_the_steps_it_did_again_are_its_own(tmp_path):
    p, ledger, pids = _start(tmp_path, "--max-restarts", "1", "--step-pattern", r"iter (\d+):",
                             ITERS="20", EVAL="5", LOG="3", HOLD_RANK="1", HOLD_AT="13", HOLD_S="120")
    _when(ledger, p, lambda row: row[:3] == (0, 1, 13))
    time.sleep(3)                                     # its last steps reach hpcml's records (flushed each second; margin under load)
    os.kill(int((pids / "rank-1").read_text()), signal.SIGKILL)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    rows = _rows(ledger)
    first = {s for a, r, s, _ in rows if a == 0}
    again = sorted({s for a, r, s, _ in rows if a == 1})
    assert max(first) == 13 and again[-1] == 19
    assert again[0] == 10                              # the last checkpoint before the kill
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    resumed = run["attempts"][0]["restart"]["resumed"]
    assert resumed["printed_step"] == again[0]
    assert resumed["steps_lost"] == len([s for s in again if s <= max(first)]) == 4
    redone = [p for p in run["ledger"]["parts"] if p["part"] == "redone"]
    assert redone and all(p["seconds"] is not None for p in redone) and run["ledger"]["ettr_bound"] is None


@pytest.mark.torch
def test_a_pause_short_of_the_hang_timeout_is_the_ledger_s_stall(tmp_path):
    p, ledger, pids = _start(tmp_path, "--hang-timeout", "60 s", ITERS="40", EVAL="10", STEP_S="0.1")
    _when(ledger, p, lambda row: row[1] == 1 and row[2] == 15)
    pid = int((pids / "rank-1").read_text())
    os.kill(pid, signal.SIGSTOP)
    time.sleep(3)
    os.kill(pid, signal.SIGCONT)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    ends: dict[int, float] = {}
    for _, _, step, t in _rows(ledger):
        ends[step] = max(ends.get(step, 0.0), t)      # a step ends when its last rank ends it
    paced = [ends[s] for s in sorted(ends)]
    gaps = [b - a for a, b in zip(paced, paced[1:])]
    med = statistics.median(gaps)
    expected = sum(g - med for g in gaps if g > 3 * med and g > med + 1)
    assert expected > 2.5                             # the 3 s stop, as the script saw it
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    by = {}
    for part in run["ledger"]["parts"]:
        by[part["part"]] = by.get(part["part"], 0.0) + (part["seconds"] or 0.0)
    assert abs(by.get("stalls", 0.0) - expected) <= 0.3 + 0.1 * expected, (by, expected)
    span = paced[-1] - paced[0]
    assert abs(by["productive"] + by["stalls"] + by.get("checkpoint", 0.0) - span) <= 0.5, (by, span)
    assert abs(sum(by.values()) - run["ledger"]["total_s"]) <= 0.01


def _pin(pid: int, cpu: int) -> None:
    """Every thread of ``pid`` onto ``cpu`` (threads started later inherit the main one's)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass


@pytest.mark.machine                     # measures contention: the CPUs to itself (scripts/test)
@pytest.mark.torch
def test_a_rank_whose_cpu_another_process_takes_is_contended_not_a_straggler(tmp_path):
    """Each rank pinned to a CPU of its own; from iteration 60 a process outside the job
    spins on rank 1's CPU, so rank 1's compute (a busy loop) takes about twice as long: it is
    named as contention (its threads waited for a CPU), never as a straggler. (When the
    machine is loaded from the start, the test's own load, rank 1 may be named before the
    spinner starts: still as contention.)"""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to give each rank its own")      # this machine and CI have 2
    p, ledger, pids = _start(tmp_path, "--straggler-window", "10 s", ITERS="250", EVAL="1000", STEP_S="0",
                             BUSY_S="0.05")
    _when(ledger, p, lambda row: row[2] == 5)
    for rank, cpu in ((0, 0), (1, 1)):
        _pin(int((pids / f"rank-{rank}").read_text()), cpu)
    _when(ledger, p, lambda row: row[2] == 60)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {1})
        _, err = p.communicate(timeout=300)
    finally:
        hog.kill()
        hog.wait()
    assert p.returncode == 0, err[-3000:]
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert not run.get("stragglers"), run.get("stragglers")
    contended = {c["rank"]: c for c in run.get("contended") or []}
    assert 1 in contended and contended[1]["cpu_wait"] >= 0.2, (contended, err[-3000:])
    assert "contention: rank 1" in err
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", str(tmp_path / "job"), "--json"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert rep.returncode == 0, rep.stderr
    findings = json.loads(rep.stdout)["findings"]
    assert any(f["kind"] == "contention" and "rank 1 " in f["message"] for f in findings), findings
    assert not [f for f in findings if f["kind"] in ("chronic_straggler", "live_straggler")], findings
