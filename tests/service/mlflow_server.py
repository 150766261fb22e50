"""Helpers for the tests that start a real MLflow server: its cached venv, the CLI, a client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpcml.service.blueprint import load
from hpcml.service.catalogue import find
from hpcml.service.envs import ensure_env

ROOT = Path(__file__).resolve().parents[2]


def mlflow_venv() -> Path:
    """The MLflow blueprint's venv, built once (~1 min) and cached like the product does."""
    bp = load(find("mlflow"))
    assert bp.python is not None
    return ensure_env(bp.name, bp.python.packages)


def hpcml(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


CLIENT = """
import sys, mlflow
from mlflow.tracking import MlflowClient
mlflow.set_tracking_uri(sys.argv[1])
if sys.argv[2] == "log":
    mlflow.set_experiment("hpcml-test")
    with mlflow.start_run(run_name="persisted") as run:
        mlflow.log_param("lr", "0.01")
        for step in range(5):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    print(run.info.run_id)
else:
    r = MlflowClient().get_run(sys.argv[3])
    hist = MlflowClient().get_metric_history(sys.argv[3], "loss")
    print(r.data.params["lr"], len(hist), r.info.status)
"""


def client(venv: Path, url: str, *args: str) -> str:
    """A real MLflow client (the mlflow package of the service's venv) talking HTTP to ``url``."""
    out = subprocess.run([str(venv / "bin" / "python"), "-c", CLIENT, url, *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def state(directory: Path) -> dict:
    return json.loads((directory / "service.json").read_text())
