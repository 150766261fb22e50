"""A restart of an unchanged HF Trainer or Lightning script that resumes from its own
checkpoint: ``hpcml run --max-restarts 1`` reads the framework's restored global step
(``hpcml.observe.resumes``), so the run's record says which step the job resumed at and how
many steps it did again, and the ranks' steps go on from the framework's numbering. Checked
against the script's own step ledger (an O_APPEND file of attempt, rank, global step), with
rank 1 killed (SIGKILL) after step 13 and checkpoints every 5 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"transformers": "hf_resume.py", "lightning": "lightning_resume.py"}


@pytest.mark.torch
@pytest.mark.parametrize("framework", sorted(SCRIPTS))
def test_the_step_a_framework_resumed_at_is_the_restart_s_and_the_steps_redone_are_counted(tmp_path, framework):
    needs.module(framework)
    script = Path(__file__).with_name("scripts") / SCRIPTS[framework]
    ledger = tmp_path / "ledger"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(tmp_path / "out"), "LEDGER": str(ledger),
           "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--max-restarts", "1", "--dir", "job",
                        "--kill-grace", "5", "--no-report", "--", sys.executable, str(script)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [tuple(int(x) for x in line.split()) for line in ledger.read_text().splitlines()]
    first = {s for a, r, s in rows if a == 0}
    again = sorted({s for a, r, s in rows if a == 1})
    assert max(first) == 13 and again[-1] == 20
    resumed_at = again[0] - 1                         # the script's own first step after the restart
    assert resumed_at == 10                           # the last checkpoint before the kill
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    restart = run["attempts"][0]["restart"]
    assert restart["resumed"]["step"] == resumed_at
    redone = len([s for s in again if s <= max(first)])
    assert restart["resumed"]["steps_lost"] == redone == 3
    assert run["furthest_step"] == 20                 # hpcml's steps are the framework's after the resume
