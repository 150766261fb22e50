"""``hpcml service up mlflow`` on this machine: a real MLflow client logs a run over HTTP,
the run survives ``down`` / ``up``; ``hpcml observe record --mlflow`` sends a job's metrics."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpcml.service.mlflow_rest import MlflowError, MlflowRest
from tests.service.mlflow_server import client, hpcml, mlflow_venv, state


@pytest.fixture(scope="module")
def venv() -> Path:
    return mlflow_venv()


@pytest.fixture
def service(tmp_path, venv):
    """A running MLflow instance with its state under tmp_path; always stopped."""
    env = {**os.environ, "HPCML_SERVICE_STATE": str(tmp_path / "state")}
    try:
        out = hpcml(["service", "up", "mlflow"], env)
        assert out.returncode == 0, out.stderr
        yield env, tmp_path / "state" / "mlflow"
    finally:
        hpcml(["service", "down", "mlflow"], env)


def test_a_run_survives_down_and_up(service, venv):
    env, directory = service
    first = state(directory)
    assert first["ready"] and first["host"] == "127.0.0.1"
    url = first["urls"]["http"]
    run_id = client(venv, url, "log")
    assert client(venv, url, "read", run_id) == "0.01 5 FINISHED"

    out = hpcml(["service", "down", "mlflow"], env)
    assert out.returncode == 0, out.stderr
    assert state(directory)["stopped"]
    with pytest.raises(MlflowError):
        MlflowRest(url, timeout=2).get_run(run_id)           # nothing answers there now

    out = hpcml(["service", "up", "mlflow"], env)
    assert out.returncode == 0, out.stderr
    url = state(directory)["urls"]["http"]
    assert client(venv, url, "read", run_id) == "0.01 5 FINISHED"
    status = hpcml(["service", "status", "--json"], env)
    assert '"running": true' in status.stdout


def test_observe_record_sends_the_job_s_metrics(service, tmp_path):
    env, directory = service
    url = state(directory)["urls"]["http"]
    train = "from hpcml.observe import api\nfor s in range(20): api.log(step=s, loss=1.0 / (s + 1))\napi.flush()\n"
    out = hpcml(["observe", "record", "--no-gpu", "--dir", str(tmp_path / "obs"), "--mlflow", url, "--",
                 sys.executable, "-c", train], {**env, "SLURM_JOB_ID": "4242"})
    assert out.returncode == 0, out.stderr
    rest = MlflowRest(url)
    exp = rest.experiment("hpcml")
    runs = rest.call("POST", "runs/search", {"experiment_ids": [exp], "filter": "tags.`hpcml.job_id` = '4242'"})["runs"]
    assert len(runs) == 1 and runs[0]["info"]["status"] == "FINISHED"
    history = rest.call("GET", "metrics/get-history", {"run_id": runs[0]["info"]["run_id"], "metric_key": "loss"})
    assert sorted(m["step"] for m in history["metrics"]) == list(range(20))


def test_binding_elsewhere_without_auth_is_refused(tmp_path):
    out = hpcml(["service", "up", "mlflow", "--bind", "0.0.0.0", "--state-dir", str(tmp_path)], dict(os.environ))
    assert out.returncode == 2 and "no authentication of its own" in out.stderr
