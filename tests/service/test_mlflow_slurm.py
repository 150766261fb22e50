"""``hpcml service up mlflow --slurm`` on the local 2-node cluster: a service job; a real
MLflow client logs a run; ``down`` cancels the job; a new job serves the same run."""

from __future__ import annotations

import subprocess

import pytest

from tests.service.mlflow_server import client, hpcml, mlflow_venv, state

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

        out = hpcml(["service", "down", "mlflow"], env)
        assert out.returncode == 0, out.stderr
        queue = subprocess.run(["squeue", "-h", "-j", first["job_id"]], capture_output=True, text=True, env=env, timeout=15)
        assert queue.stdout.strip() == ""

        out = hpcml(["service", "up", "mlflow", "--slurm", "--time", "10:00"], env)
        assert out.returncode == 0, out.stderr + out.stdout
        second = state(directory)
        assert second["job_id"] != first["job_id"]
        assert client(venv, second["urls"]["http"], "read", run_id) == "0.01 5 FINISHED"
    finally:
        hpcml(["service", "down", "mlflow"], env)
