"""Sending a job's metrics to a running MLflow tracking server over its REST API.

urllib and MLflow's documented REST endpoints (``/api/2.0/mlflow/...``) rather than the
``mlflow`` package: the package pulls ~850 MB (pandas, scipy, scikit-learn, ...) into
hpcml's base install and into every training environment, for five HTTP calls. The
server itself runs in its own venv (``hpcml service up mlflow``).

``MlflowSink`` never slows the training step: ``update_batch`` only puts rows on a bounded
queue (a full queue drops them and counts the drops); a daemon thread posts them with
``runs/log-batch`` (at most 1,000 metrics per call, MLflow's limit) about once a second.
A server that is down costs the thread, not the job: errors are counted, not raised.

A wrong address must not look like success (``hpcml run`` exits 0 either way): the thread's
first call is a probe with a short timeout; when it fails, one warning line names the URL
and the error, the thread tries again every ``RETRY_S``, and every metric that never
reaches a run (queued while the server is away, in a refused batch, left at the end) is
counted in ``dropped``, which the recorder writes into its rank file for the run's report.

A call that timed out may still have been done: a slow server (a loaded node) creates the
run after the probe gave up. Each sink tags its run with an id of its own
(``hpcml.sink``), and after a failed start it looks for that run before making another; at
``close`` a sink still without a run tries once more with the full timeout, so a server that
was only slow gets the run, its queued metrics and its end (not a run left RUNNING, empty).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from hpcml.errors import HpcmlError

MAX_BATCH = 1000
MAX_PARAMS = 100            # params (and tags) in one runs/log-batch call, MLflow's limit
PROBE_TIMEOUT_S = 3.0       # the first calls: a wrong address is said within seconds of the start
RETRY_S = 30.0              # a server that was away at the start is tried again this often
SINK_TAG = "hpcml.sink"     # the sink's own id on its run: found again after a start that timed out


class MlflowError(HpcmlError):
    """The MLflow server refused a call or cannot be reached."""


class MlflowRest:
    """A few calls of MLflow's REST API (``MLFLOW_TRACKING_TOKEN`` as a bearer token, if set)."""

    def __init__(self, url: str, *, timeout: float = 10.0, token: str | None = None,
                 deadline: float | None = None) -> None:
        """``deadline`` (``time.monotonic``): no call waits past it, each is cut to what is left."""
        self.url, self.timeout, self.deadline = url.rstrip("/"), timeout, deadline
        self.token = token if token is not None else os.environ.get("MLFLOW_TRACKING_TOKEN")

    def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self.url}/api/2.0/mlflow/{endpoint}"
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        timeout = self.timeout if self.deadline is None else min(self.timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            raise MlflowError(f"MLflow at {self.url}: no time left for {endpoint}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read().decode() or "{}"
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:200]
            raise MlflowError(f"MLflow {endpoint}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise MlflowError(f"MLflow at {self.url} cannot be reached: {getattr(exc, 'reason', exc)}") from None
        return json.loads(text)

    def experiment(self, name: str) -> str:
        """The id of the experiment ``name``, created if missing."""
        try:
            return str(self.call("GET", "experiments/get-by-name", {"experiment_name": name})["experiment"]["experiment_id"])
        except MlflowError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
        return str(self.call("POST", "experiments/create", {"name": name})["experiment_id"])

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str] | None = None) -> str:
        body = {"experiment_id": experiment_id, "run_name": run_name, "start_time": int(time.time() * 1000),
                "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}
        return str(self.call("POST", "runs/create", body)["run"]["info"]["run_id"])

    def find_run(self, experiment_id: str, key: str, value: str) -> str | None:
        """The id of a run of ``experiment_id`` tagged ``key=value``, if there is one."""
        found = self.call("POST", "runs/search", {"experiment_ids": [experiment_id], "max_results": 1,
                                                  "filter": f"tags.`{key}` = '{value}'"})
        runs = found.get("runs") or []
        return str(runs[0]["info"]["run_id"]) if runs else None

    def log_batch(self, run_id: str, metrics: Sequence[dict[str, Any]] = (), params: dict[str, str] | None = None) -> None:
        self.call("POST", "runs/log-batch", {"run_id": run_id, "metrics": list(metrics),
                                             "params": [{"key": k, "value": v} for k, v in (params or {}).items()]})

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.call("POST", "runs/update", {"run_id": run_id, "status": status, "end_time": int(time.time() * 1000)})

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self.call("GET", "runs/get", {"run_id": run_id})["run"]


class MlflowSink:
    """A recorder's rows -> metrics of one MLflow run, from a background thread."""

    def __init__(self, url: str, *, experiment: str, run_name: str, tags: dict[str, str] | None = None,
                 params: dict[str, str] | None = None, kinds: tuple[str, ...] = ("metric",),
                 maxsize: int = 100_000, period: float = 1.0,
                 warn: Callable[[str], None] = lambda line: None) -> None:
        """``warn``: how the caller tells its user, once, that the server does not answer
        (the recorder prints it on the rank's stderr); the sink only counts."""
        self.client, self.probe = MlflowRest(url), MlflowRest(url, timeout=PROBE_TIMEOUT_S)
        self.kinds, self.period = kinds, period
        self.queue: queue.Queue[tuple] = queue.Queue(maxsize)
        self.dropped = self.errors = self.sent = 0
        self.run_id: str | None = None
        self.sink_id = os.urandom(8).hex()
        self._tried = False                     # a start was tried and failed: its run may exist
        self.problem: str | None = None         # the first error of the start: the server never answered
        self._stop = threading.Event()
        self._setup = (experiment, run_name, tags or {}, params or {})
        self.warn = warn
        self.thread = threading.Thread(target=self._loop, name="hpcml-mlflow", daemon=True)
        self.thread.start()

    def update(self, rows: list[tuple]) -> None:
        """Rows as the store takes them: (ts, kind, name, value, step, gpu); never blocks."""
        for ts, kind, name, value, step, _gpu in rows:
            if value is None or kind not in self.kinds:
                continue
            try:
                self.queue.put_nowait((ts, name, value, step))
            except queue.Full:
                self.dropped += 1

    def update_batch(self, batch: Any) -> None:
        from hpcml.observe.export import batch_rows
        self.update(batch_rows(batch))

    def _drain(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < MAX_BATCH:
            try:
                ts, name, value, step = self.queue.get_nowait()
            except queue.Empty:
                break
            ts_s = ts / 1e9 if ts > 1e12 else ts        # ns from samplers, s from batches
            out.append({"key": name, "value": float(value), "timestamp": int(ts_s * 1000), "step": int(step or 0)})
        return out

    def _start(self, client: MlflowRest | None = None) -> str | None:
        """The run's id, made with the probe's short timeout (or ``client``'s); None (and
        one warning) while the server does not answer. After a failed try, the run that try
        may have made is looked for first."""
        client = client or self.probe
        experiment, run_name, tags, _params = self._setup
        try:
            exp = client.experiment(experiment)
            found = client.find_run(exp, SINK_TAG, self.sink_id) if self._tried else None
            self.run_id = run_id = found or client.create_run(exp, run_name, {**tags, SINK_TAG: self.sink_id})
        except MlflowError as exc:
            self.errors += 1
            self._tried = True
            if self.problem is None:
                self.problem = str(exc)
                self.warn(f"{exc}; tried again every {RETRY_S:.0f} s, metrics kept meanwhile "
                          "(counted as dropped if it never answers)")
            return None
        return run_id

    def _loop(self) -> None:
        while (run_id := self._start()) is None:
            if self._stop.wait(RETRY_S):
                return
        self._params(run_id)
        while True:
            stopping = self._stop.wait(self.period)
            self._send(run_id)
            if stopping:
                return

    def _params(self, run_id: str, client: MlflowRest | None = None) -> None:
        items = list(self._setup[3].items())
        for start in range(0, len(items), MAX_PARAMS):
            try:
                (client or self.client).log_batch(run_id, params=dict(items[start:start + MAX_PARAMS]))
            except MlflowError:
                self.errors += 1

    def _send(self, run_id: str, client: MlflowRest | None = None) -> None:
        """Everything queued, in batches."""
        while True:
            metrics = self._drain()
            if not metrics:
                return
            try:
                (client or self.client).log_batch(run_id, metrics)
                self.sent += len(metrics)
            except MlflowError:
                self.errors += 1
                self.dropped += len(metrics)

    def close(self, status: str = "FINISHED", timeout: float = 10.0) -> None:
        """Send what is queued and end the run, within about ``timeout`` s. A sink whose
        server never answered in time tries once more here, with what is left of it."""
        end = time.monotonic() + timeout
        self._stop.set()
        self.thread.join(timeout)
        url, token = self.client.url, self.client.token
        if self.run_id is None and not self.thread.is_alive():
            last = MlflowRest(url, timeout=self.client.timeout, token=token, deadline=end)
            if self._start(last) is not None:
                assert self.run_id is not None
                self._params(self.run_id, last)
                self._send(self.run_id, last)
        if self.run_id is None or self.thread.is_alive():     # what it did not send never reached a run
            self.dropped += self.queue.qsize()
        if self.run_id is None:
            return
        for _ in range(2):                     # a slow server's timeout is not its refusal: once more
            try:                               # (the end is worth a second past the budget)
                MlflowRest(url, timeout=max(1.0, end - time.monotonic()), token=token).finish(self.run_id, status)
                return
            except MlflowError:
                self.errors += 1
