"""``hpcml service up mlflow --slurm`` on the local 2-node cluster: a service job; a real
MLflow client logs a run; a second ``up`` (here or as another job) is refused while it runs;
``down`` cancels the job; a new job, its ``up`` interrupted while it starts, serves the same run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.service.mlflow_server import ROOT, client, hpcml, mlflow_venv, state

pytestmark = pytest.mark.slurm


def test_mlflow_as_a_slurm_service_job(slurm_env, tmp_path):
    venv = mlflow_venv()
    env = {**slurm_env, "HPCML_SERVICE_STATE": str(tmp_path / "state")}
    directory = tmp_path / "state" / "mlflow"
    try:
        out = hpcml(["service", "up", "mlflow", "--slurm", "--time", "10:00", "--nodelist", "n2"], env)
        assert out.returncode == 0, out.stderr + out.stdout
        first = state(directory)
        assert first["mode"] == "slurm" and first["node"] == "n2" and first["ready"]
        assert "tunnel: ssh -J " in out.stdout and f"-L {first['ports']['http']}:127.0.0.1:" in out.stdout
        run_id = client(venv, first["urls"]["http"], "log")
        for again in (["service", "up", "mlflow"], ["service", "up", "mlflow", "--slurm", "--time", "10:00"]):
            out = hpcml(again, env)          # a second server on the same SQLite database is never started
            assert out.returncode == 2 and f"already runs (Slurm job {first['job_id']}" in out.stderr, out.stderr
        out = hpcml(["service", "logs", "mlflow", "-n", "0"], env)
        assert out.returncode == 0 and "== hpcml service up mlflow" in out.stdout, out.stderr

        out = hpcml(["service", "down", "mlflow"], env)
        assert out.returncode == 0, out.stderr
        queue = subprocess.run(["squeue", "-h", "-j", first["job_id"]], capture_output=True, text=True, env=env, timeout=15)
        assert queue.stdout.strip() == ""

        up = subprocess.Popen([sys.executable, "-m", "hpcml", "service", "up", "mlflow", "--slurm", "--time", "10:00"],
                              env={**env, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120      # Ctrl-C once the job is submitted: it says the job stays
        while state(directory)["job_id"] == first["job_id"] and time.monotonic() < deadline:
            time.sleep(0.1)
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
        second = state(directory)
        assert up.returncode == 130 and f"Slurm job {second['job_id']} was submitted and is still starting" in err, err
        while not second["ready"] and time.monotonic() < deadline + 180:
            time.sleep(0.3)
            second = state(directory)
        assert second["job_id"] != first["job_id"] and second["ready"]
        assert client(venv, second["urls"]["http"], "read", run_id) == "0.01 5 FINISHED"
    finally:
        hpcml(["service", "down", "mlflow"], env)
