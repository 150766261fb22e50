"""``hpcml service up mlflow`` on this machine: a real MLflow client logs a run over HTTP,
the run survives ``down`` / ``up``; ``hpcml observe record --mlflow`` sends a job's metrics to
a run named by job and attempt, and a farm sweep's tasks log their parameters."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from hpcml.observe.mlflow_rest import MlflowError, MlflowRest
from hpcml.observe.mlflow_run import outcome
from tests.service.mlflow_server import client, hpcml, mlflow_venv, state


@pytest.fixture(scope="module")
def venv() -> Path:
    return mlflow_venv()


def _up(where: Path) -> Iterator[tuple[dict, Path]]:
    """A running MLflow instance with its state under ``where``; always stopped."""
    env = {**os.environ, "HPCML_SERVICE_STATE": str(where / "state")}
    try:
        out = hpcml(["service", "up", "mlflow"], env)
        assert out.returncode == 0, out.stderr
        yield env, where / "state" / "mlflow"
    finally:
        hpcml(["service", "down", "mlflow"], env)


@pytest.fixture
def service(tmp_path, venv):
    """An instance of the test's own (it goes down and up)."""
    yield from _up(tmp_path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory, venv):
    """One instance for the tests that only use a server: an MLflow start is ~10 s of CPU.
    Each finds its own runs by tags no other test gives (a job id, its farm's directory)."""
    yield from _up(tmp_path_factory.mktemp("mlflow"))


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
    _logs_are_the_service_s_own(env, directory / "service.log")


def _logs_are_the_service_s_own(env: dict, log: Path) -> None:
    """``hpcml service logs``: the last N lines of the running server's own log (the file
    may grow meanwhile: what was printed is a run of its lines), all of it with -n 0; an
    unknown instance or a negative count is one line, exit 2."""
    tail = hpcml(["service", "logs", "mlflow", "-n", "3"], env)
    assert tail.returncode == 0, tail.stderr
    printed = tail.stdout.splitlines()
    whole = log.read_text(errors="replace").splitlines()
    assert 1 <= len(printed) <= 3 and any(whole[i:i + len(printed)] == printed for i in range(len(whole)))
    everything = hpcml(["service", "logs", "mlflow", "-n", "0"], env)
    assert everything.returncode == 0 and everything.stdout.splitlines()[:len(whole)] == whole
    assert any("uvicorn" in line.lower() or "mlflow" in line.lower() or "listening" in line.lower()
               for line in whole), whole[:5]
    for bad in (["service", "logs", "nosuch"], ["service", "logs", "mlflow", "-n", "-1"]):
        out = hpcml(bad, env)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def _runs(rest: MlflowRest, experiment_id: str, where: str) -> list[dict]:
    return rest.call("POST", "runs/search", {"experiment_ids": [experiment_id], "filter": where})["runs"]


def _tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def test_a_job_s_metrics_and_a_sweep_s_parameters_reach_named_runs(shared, tmp_path):
    """A requeued job's run is named by job and attempt and carries its command and
    directory; each task of a farm sweep that runs ``hpcml run --mlflow`` gets a run of its
    own with the task's parameters (was: every run 'job-local', no params)."""
    env, directory = shared
    url = state(directory)["urls"]["http"]
    train = tmp_path / "train.py"
    train.write_text("from hpcml.observe import api\nfor s in range(20): api.log(step=s, loss=1.0 / (s + 1))\n"
                     "api.flush()\n")
    out = hpcml(["observe", "record", "--no-gpu", "--dir", str(tmp_path / "obs"), "--mlflow", url, "--",
                 sys.executable, str(train)], {**env, "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"})
    assert out.returncode == 0, out.stderr
    rest = MlflowRest(url)
    exp = rest.experiment("hpcml")
    runs = _runs(rest, exp, "tags.`hpcml.job_id` = '4242'")
    assert len(runs) == 1 and runs[0]["info"]["status"] == "FINISHED"
    assert runs[0]["info"]["run_name"] == "4242-a1"
    tags = _tags(runs[0])
    assert tags["hpcml.command"] == f"{sys.executable} {train}"
    assert tags["hpcml.job_dir"] == str(tmp_path / "obs") and tags["mlflow.runName"] == "4242-a1"
    history = rest.call("GET", "metrics/get-history", {"run_id": runs[0]["info"]["run_id"], "metric_key": "loss"})
    assert sorted(m["step"] for m in history["metrics"]) == list(range(20))
    assert outcome(tmp_path / "obs")["line"] == f"run 4242-a1 at {url}: 20 metrics sent"    # what hpcml report says

    farm = tmp_path / "sweep"
    task = f"{sys.executable} -m hpcml run --mlflow {url} -- {sys.executable} {train}"
    store.create(farm, [TaskSpec(task, params={"lr": lr, "opt": "adam w"}) for lr in (0.01, 0.1)])
    out = hpcml(["farm", "run", str(farm), "--slots", "2"], env)
    assert out.returncode == 0, out.stderr + out.stdout
    by_name = {r["info"]["run_name"]: r for r in _runs(rest, exp, f"tags.`hpcml.farm.dir` = '{farm}'")}
    assert sorted(by_name) == ["sweep-task0.1", "sweep-task1.1"]
    for tid, lr in ((0, "0.01"), (1, "0.1")):
        run = by_name[f"sweep-task{tid}.1"]
        assert {p["key"]: p["value"] for p in run["data"]["params"]} == {"lr": lr, "opt": "adam w"}
        assert _tags(run)["hpcml.job_dir"] == str(farm / "runs" / f"{tid}.1")      # hpcml run's job directory
        assert run["info"]["status"] == "FINISHED"


class SlowCreate:
    """An HTTP proxy in front of the real server that passes every request on at once and
    holds the answer to the first ``runs/create`` for ``hold_s``: the server has made the
    run, its maker has given up waiting (a loaded node's server, as in a CI run)."""

    def __init__(self, upstream: str, hold_s: float) -> None:
        import http.server
        import threading
        import urllib.request
        held = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def _pass(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        code, data = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    code, data = exc.code, exc.read()
                if self.path.endswith("/runs/create") and not held.is_set():
                    held.set()
                    time.sleep(hold_s)
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:                   # the maker gave up and closed its end
                    pass

            do_GET = do_POST = _pass

            def log_message(self, *args) -> None:
                pass

        self.held = held
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_run_made_after_its_maker_gave_up_gets_the_metrics_and_its_end(shared, tmp_path):
    """The server answers ``runs/create`` only after the recorder's probe stopped waiting
    (``PROBE_TIMEOUT_S``) but has made the run. The job's one run is still found, gets every
    metric and ends FINISHED, and no second run is made (was: a run left RUNNING, empty, and
    the metrics counted as dropped)."""
    import urllib.error  # noqa: F401 - SlowCreate's

    from hpcml.observe.mlflow_rest import PROBE_TIMEOUT_S
    env, directory = shared
    url = state(directory)["urls"]["http"]
    proxy = SlowCreate(url, PROBE_TIMEOUT_S + 2)
    try:
        train = tmp_path / "train.py"
        train.write_text("from hpcml.observe import api\nfor s in range(20): api.log(step=s, loss=1.0 / (s + 1))\n"
                         "api.flush()\n")
        out = hpcml(["observe", "record", "--no-gpu", "--dir", str(tmp_path / "obs"), "--mlflow", proxy.url, "--",
                     sys.executable, str(train)], {**env, "SLURM_JOB_ID": "5151"})
        assert out.returncode == 0, out.stderr
        assert proxy.held.is_set(), "the create was never held: the test tested nothing"
    finally:
        proxy.close()
    rest = MlflowRest(url)
    runs = _runs(rest, rest.experiment("hpcml"), "tags.`hpcml.job_id` = '5151'")
    assert [r["info"]["status"] for r in runs] == ["FINISHED"], runs
    history = rest.call("GET", "metrics/get-history", {"run_id": runs[0]["info"]["run_id"], "metric_key": "loss"})
    assert sorted(m["step"] for m in history["metrics"]) == list(range(20))
    assert outcome(tmp_path / "obs")["line"] == f"run 5151-a0 at {proxy.url}: 20 metrics sent"


def test_binding_elsewhere_without_auth_is_refused(tmp_path):
    out = hpcml(["service", "up", "mlflow", "--bind", "0.0.0.0", "--state-dir", str(tmp_path)], dict(os.environ))
    assert out.returncode == 2 and "no authentication of its own" in out.stderr
