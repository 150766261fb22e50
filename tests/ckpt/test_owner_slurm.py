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
