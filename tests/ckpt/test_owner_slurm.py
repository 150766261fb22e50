"""The owner of a checkpoint directory is a Slurm job: whether it still runs is asked of
Slurm (its record names another node here, so the pid cannot be checked)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.ckpt import Checkpointer
from hpcml.errors import UsageError
from tests.slurmjobs import submit, wait

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def test_a_running_slurm_job_keeps_the_directory_until_it_ends(env, tmp_path):
    ck = tmp_path / "ck"
    job = submit(f"""#!/bin/bash
exec {sys.executable} -c "from hpcml.ckpt import Checkpointer; import time; c = Checkpointer('{ck}'); time.sleep(300)"
""", tmp_path, env, nodes=1)
    try:
        end = time.monotonic() + 120
        while not (ck / ".owner").exists() and time.monotonic() < end:
            time.sleep(0.2)
        record = json.loads((ck / ".owner").read_text())
        assert record["slurm_job_id"] == job, (tmp_path / "job.out").read_text()
        (ck / ".owner").write_text(json.dumps({**record, "host": "another-node"}))
        with pytest.raises(UsageError, match=f"Slurm job {job}\\) that still runs"):
            Checkpointer(ck)
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30, check=False)
    wait(job, env, timeout=120)
    Checkpointer(ck).close()                     # ended: taken over without asking
    assert json.loads((ck / ".owner").read_text())["slurm_job_id"] is None


def test_a_farm_retry_takes_over_while_the_dead_attempts_allocation_still_runs(env, tmp_path, monkeypatch):
    """Attempt 1 of farm task 0 saved step 3 and died (its allocation runs on: other tasks);
    then the farm ended the attempt. Another task is refused before that; the
    task's attempt 2, in another allocation, resumes from step 3 (was: refused, 'still runs')."""
    from hpcml.farm import claim, store
    from hpcml.farm.model import TaskSpec
    farm, ck = tmp_path / "farm", tmp_path / "ck"
    store.create(farm, [TaskSpec("true"), TaskSpec("true")])
    job = submit(f"""#!/bin/bash
export HPCML_FARM_DIR={farm} HPCML_FARM_TASK_ID=0 HPCML_FARM_ATTEMPT=1 HPCML_FARM_JOB_ID=$SLURM_JOB_ID
{sys.executable} -c "import os, numpy as np; from hpcml.ckpt import Checkpointer
c = Checkpointer('{ck}'); c.save({{'w': np.zeros(2)}}, 3); c.wait(); os._exit(9)"
touch {tmp_path}/died; sleep 300
""", tmp_path, env, nodes=1)
    try:
        end = time.monotonic() + 120
        while not (tmp_path / "died").exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert (tmp_path / "died").exists(), (tmp_path / "job.out").read_text()
        monkeypatch.setenv("SLURM_JOB_ID", "777")
        monkeypatch.setenv("HPCML_FARM_JOB_ID", "777")
        monkeypatch.setenv("HPCML_FARM_DIR", str(farm))
        monkeypatch.setenv("HPCML_FARM_TASK_ID", "1")
        monkeypatch.setenv("HPCML_FARM_ATTEMPT", "1")
        with pytest.raises(UsageError, match="belongs to task 0 of the farm .*this is task 1"):
            Checkpointer(ck)                     # task 1 before the farm ended task 0's attempt: refused
        assert claim.finish(farm, 0, 1, {"outcome": "failed", "exit_code": 9})
        with pytest.raises(UsageError, match="belongs to task 0 of the farm"):
            Checkpointer(ck)                     # and after: task 0's state is not task 1's
        monkeypatch.setenv("HPCML_FARM_TASK_ID", "0")
        monkeypatch.setenv("HPCML_FARM_ATTEMPT", "2")
        with Checkpointer(ck) as c:
            assert c.load_latest()[1] == 3
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30, check=False)
    wait(job, env, timeout=120)
