"""hpcml service: render + validate the whole catalogue, and `up mlflow` until healthy.

    python benchmarks/bench_service.py [--runs 3]

(1) In one process, every bundled blueprint rendered for a team and each object validated
(Kubernetes 1.32 schemas, ArgoCD's Application); beside it, the `kubernetes-validate` CLI a
user would run on the same files (strict, 1.32; it skips the Application: no schema). (2)
`hpcml service up mlflow` (venv already cached) until its health check answers, then down;
beside it, `mlflow server` from the same venv started by hand, polled on /health the same
way. Alternated run after run. Writes benchmarks/results/service.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hpcml.run.rendezvous import free_port  # noqa: E402
from hpcml.service import catalogue, k8s, render  # noqa: E402
from hpcml.service.blueprint import load  # noqa: E402
from hpcml.service.envs import ensure_env  # noqa: E402


def _stats(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def render_catalogue(out: Path) -> float:
    t = time.perf_counter()
    for name in catalogue.available():
        render.write(render.render(name, k8s.Target("bench")), out)
    return time.perf_counter() - t


def kubernetes_validate_cli(out: Path) -> float:
    files = [str(p) for p in out.rglob("*.yaml") if "argocd" not in p.parts]
    exe = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    t = time.perf_counter()
    subprocess.run([exe, "--strict", "-k", "1.32", "--quiet", *files], check=True, capture_output=True)
    return time.perf_counter() - t


def _wait_health(url: str, proc: subprocess.Popen | None = None, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)


def hpcml_up(state: Path) -> float:
    env = {**os.environ, "HPCML_SERVICE_STATE": str(state), "PYTHONPATH": str(ROOT / "src")}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hpcml", "service", "up", "mlflow"], check=True, env=env, capture_output=True)
    took = time.perf_counter() - t
    subprocess.run([sys.executable, "-m", "hpcml", "service", "down", "mlflow"], check=True, env=env, capture_output=True)
    return took


def plain_mlflow(venv: Path, data: Path) -> float:
    port = free_port("127.0.0.1")
    t = time.perf_counter()
    proc = subprocess.Popen([str(venv / "bin" / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{data}/mlflow.db",
                             "--artifacts-destination", f"{data}/artifacts", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_health(f"http://127.0.0.1:{port}/health")
        return time.perf_counter() - t
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    bp = load(catalogue.find("mlflow"))
    assert bp.python is not None
    venv = ensure_env(bp.name, bp.python.packages)
    results: dict[str, list[float]] = {"render_validate_catalogue_s": [], "kubernetes_validate_cli_s": [],
                                       "hpcml_up_mlflow_ready_s": [], "plain_mlflow_server_ready_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(max(args.runs, 5)):
            out = Path(tmp) / f"render{i}"
            results["render_validate_catalogue_s"].append(render_catalogue(out))
            results["kubernetes_validate_cli_s"].append(kubernetes_validate_cli(out))
        data = Path(tmp) / "plain"
        data.mkdir()
        for _ in range(args.runs):
            results["hpcml_up_mlflow_ready_s"].append(hpcml_up(Path(tmp) / "state"))
            results["plain_mlflow_server_ready_s"].append(plain_mlflow(venv, data))
    summary = {k: _stats(v) for k, v in results.items()}
    summary["objects"] = sum(len(render.render(n, k8s.Target("bench")).documents()) for n in catalogue.available())
    print(json.dumps(summary, indent=2))
    (ROOT / "benchmarks" / "results" / "service.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
