"""A farm task's ``hpcml run`` stopped by ``farm --time-limit`` is seen as ended from another
host (a login node) while the farm's allocation still runs: its run is a ``local`` run in
that job, so its own record and the farm's end of the attempt tell, not the job's state.
The time limit's SIGTERM reaches the launcher, which stops its ranks and records its end.
Real local cluster, real farm, real ``hpcml run``/``report`` (the other host: the recorded
host rewritten)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from tests.slurmjobs import submit, wait

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]


def test_a_run_the_farm_timed_out_is_not_still_running_while_the_farm_runs(slurm_env, tmp_path):
    env = {**slurm_env, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}
    farm, d = tmp_path / "farm", tmp_path / "D"
    store.create(farm, [TaskSpec(f"hpcml run --no-report --dir {d} -- sleep 300"),
                        TaskSpec(f"sleep 300; touch {tmp_path}/late")], {"retries": 0, "time_limit": 3})
    job = submit(f"#!/bin/bash\nhpcml farm run {farm} --slots 2 --time-limit 3 --node-failures 0\n"
                 f"sleep 300\n", tmp_path, env, nodes=1)
    try:
        end = time.monotonic() + 120
        while not (farm / "ends" / "0.1").exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert json.loads((farm / "ends" / "0.1").read_text())["outcome"] == "timeout", (tmp_path / "job.out").read_text()
        run = json.loads((d / "run.json").read_text())
        assert run["ended"] is not None and run["job_id"] == job and run["farm_task"]["attempt"] == 1
        assert run["signals_forwarded"] == ["SIGTERM"], run
        (d / "run.json").write_text(json.dumps({**run, "launcher": {**run["launcher"], "host": "compute-node"}}))
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, env=env, timeout=30)
        assert q.stdout.strip() == "RUNNING"                     # the farm's allocation runs on
        report = subprocess.run([sys.executable, "-m", "hpcml", "report", str(d)], capture_output=True, text=True,
                                env=env, timeout=120)
        assert "still running" not in report.stdout and "killed before the job ended" not in report.stdout, report.stdout
        assert "exit 143" in report.stdout or "SIGTERM" in report.stdout, report.stdout
        again = subprocess.run([sys.executable, "-m", "hpcml", "run", "--no-report", "--dir", str(d), "--overwrite",
                                "--", "true"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30, check=False)
    wait(job, env, timeout=120)
