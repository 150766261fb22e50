"""torchrun under ``hpcml run``, unchanged, in local mode: each worker torchrun starts is a
rank of the watch (``hpcml.run.worker``), as a rank hpcml started itself.

Real torchrun (torch's own ``torch.distributed.run``), 2 workers of the plain DDP script the
other framework tests run (tests/run/scripts/raw_ddp.py, gloo). Proven by what the script
did: its own "N optimizer steps" line in each worker's log, the steps in the store and the
heartbeats; a worker stuck at a step named at the timeout on the script's ``# culprit``
line and the job stopped with nothing of it left running; a worker killed from outside
with SIGKILL named with its exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hpcml.observe.beat import read_beats
from hpcml.run.watch import HANG
from tests import needs
from tests.leftovers import running
from tests.run.test_inject_progress import SCRIPT, step_sections
from tests.run.test_watch import hpcml

pytestmark = pytest.mark.torch
TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2"]


def _scripts(cwd: Path) -> list[psutil.Process]:
    """The workers' own processes (not their DataLoader workers) still running, of the job
    started in ``cwd`` (``tests.leftovers``)."""
    out = []
    for p in running(str(SCRIPT), cwd=cwd):
        try:
            if "hpcml.run.worker" in (p.parent().cmdline() if p.parent() else []):
                out.append(p)
        except psutil.Error:
            continue
    return out


ACCELERATE = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_each_worker_is_a_rank_its_steps_counted_in_its_own_log_store_and_beat(tmp_path, launcher):
    """accelerate on a machine without GPUs: ``--multi_gpu`` still starts torch's elastic
    agent with 2 gloo workers (accelerate 1.15)."""
    if launcher == "accelerate":
        needs.module("accelerate")
    line = TORCHRUN if launcher == "torchrun" else ACCELERATE
    p = hpcml("run", "--dir", "job", "--", *line, SCRIPT, cwd=tmp_path,
              env={"STEPS": "6", "ACCUM": "2", "STEP_S": "0.05"})
    assert p.returncode == 0, p.stderr
    job = tmp_path / "job"
    assert f"{launcher} in each of 1 task(s) starts 2 workers: 2 ranks watched" in p.stderr
    for rank in (0, 1):                                   # the script's own word, in each worker's log
        assert f"rank {rank}: 6 optimizer steps" in (job / "logs" / f"rank-{rank:05d}.out").read_text()
    assert step_sections(job) == {0: list(range(1, 7)), 1: list(range(1, 7))}
    beats = read_beats(job / "observe")
    assert sorted(beats) == [0, 1] and all((b.step, b.exit) == (6, 0) for b in beats.values())
    run = json.loads((job / "run.json").read_text())
    assert (run["rank_launcher"], run["world"], run["ntasks"], run["furthest_step"]) == (launcher, 2, 1, 6)
    assert "ignored_beats" not in run                     # every record signed with its rank's key
    assert f"1 task ({launcher}: 2 ranks) on" in p.stdout
    assert f"hpcml run: task 0: {launcher} starts 2 workers here" in (job / "logs" / "launcher-00000.err").read_text()


def test_a_stuck_worker_is_named_at_the_timeout_and_the_job_stopped(tmp_path):
    p = hpcml("run", "--dir", "job", "--no-report", "--hang-timeout", "3s", "--kill-grace", "3", "--", *TORCHRUN,
              SCRIPT, cwd=tmp_path, env={"STEPS": "1000", "STUCK_RANK": "1", "STUCK_AFTER": "5", "STEP_S": "0.05"})
    assert p.returncode == HANG, p.stderr
    hang = json.loads((tmp_path / "job" / "run.json").read_text())["hang"]
    assert hang["action"] == "stop" and [c["rank"] for c in hang["verdict"]["culprits"]] == [1]
    assert hang["verdict"]["blocked"] == [0]
    line = next(i for i, t in enumerate(SCRIPT.read_text().splitlines(), 1) if t.endswith("# culprit"))
    assert hang["verdict"]["culprits"][0]["where"].startswith(f"{SCRIPT}:{line} in ")
    assert not _scripts(tmp_path)                                 # nothing of the job left running


def test_a_worker_killed_with_sigkill_is_named_with_its_exit(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", STEPS="100000", STEP_S="0.05")
    proc = subprocess.Popen([sys.executable, "-m", "hpcml", "run", "--dir", "job", "--no-report", "--kill-grace", "3",
                             "--", *TORCHRUN, str(SCRIPT)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        victim = None
        while victim is None and time.time() < deadline:
            beats = read_beats(tmp_path / "job" / "observe") if (tmp_path / "job" / "observe").exists() else {}
            if all((b := beats.get(r)) is not None and (b.step or 0) >= 3 for r in (0, 1)):
                victim = next((s for s in _scripts(tmp_path) if s.environ().get("RANK") == "1"), None)
            time.sleep(0.2)
        assert victim is not None, "rank 1 never reached step 3"
        victim.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    crash = next(e for e in run["timeline"] if e["kind"] == "crash")
    assert (crash["rank"], crash["exit_code"]) == (1, 128 + signal.SIGKILL), err
    assert crash["what"] == "rank 1 exited 137 (killed by SIGKILL)" and "(killed by SIGKILL)" in err
    assert run["first_failure"]["signal"] == "SIGKILL"
    assert run["first_failure"]["rank"] == 1 and proc.returncode != 0
    assert not _scripts(tmp_path)
