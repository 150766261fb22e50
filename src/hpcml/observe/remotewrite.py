"""Prometheus remote write (spec 1.0) from the recorder, into a site's TSDB (VictoriaMetrics,
Prometheus with ``--web.enable-remote-write-receiver``, Mimir, Thanos receive).

Series and their cardinality budget. Every recorder pushes its own series, so no series
has two writers:

- node series, from local rank 0 (and, for a GPU, the one task that records it):
  ``hpcml_host_<name>`` for the 7 node-wide host figures (``NODE_METRICS``) labelled
  ``node``, and ``hpcml_gpu_<name>`` labelled ``node``, ``gpu`` (at most ``GPU_METRICS_MAX``
  names; more are counted in ``over_budget`` and stay in the store);
- rank series: ``hpcml_step_seconds`` (the ``observe.section("step")`` time) and
  ``hpcml_throughput`` (the first throughput metric the rank logs, named in its ``name``
  label, the report's choice: ``tokens_per_s``, ``samples_per_s``, ... or ``*_per_s``),
  labelled ``node``, ``rank``;
- ``slurm_job`` on every series: the one job identity label. It multiplies stored series
  by the number of jobs in the retention window (one operator removed dcgm-exporter's job
  label for that reason); ``job_label=False`` leaves it out, and then the next job on a node
  continues the same node and rank series. Without it two jobs sharing a node write into
  one rank series and the receiver rejects their samples as out of order: use it where
  nodes are given whole.

Series per job = nodes x (7 + GPUs per node x 16) + ranks x 2 (GPUs per node estimated
from the task's binding, at most ``MAX_GPUS_PER_NODE``): 20,224 for 1,024 ranks on 256
nodes of 4 GPUs. A job over ``max_series`` (default 30,000: about 1,500 GPUs) refuses to
start, before the command runs. Each series carries one sample per recorder interval (the
mean of what arrived in it), so step times logged 20 times a second still cost 1 sample/s.

Delivery follows the spec: a daemon thread POSTs every ``PUSH_S`` seconds (the first push
at a random point of the first interval: a job's ranks start together); 5xx, 429 and
connection errors are retried with backoff (the failed batch again, alone), other 4xx are
dropped and counted. A push opens one connection for its batches and closes it: 1,024
ranks holding one each would pass Prometheus's default ``--web.max-connections`` of 512
(the ones above wait, and time out). The queue is bounded (``QUEUE_SAMPLES``): while the
endpoint is down the oldest samples are dropped and counted, and the training never waits;
at the end the queue is flushed for at most ``STOP_S``.

Why the protobuf is encoded by hand: a WriteRequest is three tiny messages (TimeSeries of
Labels and Samples), ~40 lines here, where generated code would bring the protobuf runtime
and its version pins for them. Snappy (block format, as the spec requires) is cramjam's:
the optional ``remote`` extra, imported only when remote write is on.
"""

from __future__ import annotations

import base64
import http.client
import math
import os
import random
import re
import ssl
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcml import __version__
from hpcml.errors import UsageError
from hpcml.urls import is_http_url

ENV_URL, ENV_TOKEN = "HPCML_REMOTE_WRITE", "HPCML_REMOTE_WRITE_TOKEN"
ENV_NO_JOB_LABEL, ENV_MAX_SERIES = "HPCML_REMOTE_WRITE_NO_JOB_LABEL", "HPCML_REMOTE_WRITE_MAX_SERIES"
NODE_METRICS = ("cpu_percent", "mem_used_bytes", "mem_available_bytes", "disk_read_bytes_per_s",
                "disk_write_bytes_per_s", "net_recv_bytes_per_s", "net_sent_bytes_per_s")
GPU_METRICS_MAX = 16
RANK_METRICS = ("hpcml_step_seconds", "hpcml_throughput")
THROUGHPUT_METRICS = ("tokens_per_s", "samples_per_s", "sequences_per_s", "images_per_s", "throughput")  # report's
MAX_GPUS_PER_NODE = 8
MAX_SERIES = 30_000
PUSH_S = 5.0
QUEUE_SAMPLES = 50_000          # ~30 minutes of a node's rank 0 (25 series) while the endpoint is down
BATCH_SAMPLES = 5_000
GRACE_S = 3.0                   # an app batch reaches the recorder up to one flush (1 s) late
TIMEOUT_S = 30.0                # Prometheus's own remote_timeout: a loaded receiver is slow, not gone
STOP_S = 5.0
MAX_BACKOFF_S = 60.0
_BAD_NAME = re.compile(r"[^a-zA-Z0-9_]")


# --- encoding: WriteRequest{1: TimeSeries{1: Label{1: name, 2: value}, 2: Sample{1: double, 2: int64 ms}}}

def _varint(n: int) -> bytes:
    n &= 0xFFFF_FFFF_FFFF_FFFF             # int64 two's complement, as protobuf does
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return bytes((number << 3 | 2,)) + _varint(len(payload)) + payload


def encode_labels(labels: Mapping[str, str]) -> bytes:
    """A TimeSeries' label fields, sorted by name (``__name__`` included) as the spec says."""
    return b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode()))
                    for k, v in sorted(labels.items()) if v)


_SAMPLE = struct.Struct("<Bd")


def encode_sample(ts_ms: int, value: float) -> bytes:
    return _field(2, _SAMPLE.pack(0x09, value) + b"\x10" + _varint(ts_ms))


def write_request(series: Iterable[tuple[bytes, Iterable[tuple[int, float]]]]) -> bytes:
    """(encoded labels, [(ts_ms, value), oldest first]) per series -> WriteRequest bytes."""
    return b"".join(_field(1, labels + b"".join(encode_sample(t, v) for t, v in samples))
                    for labels, samples in series)


# --- settings and budget

@dataclass(frozen=True)
class Config:
    url: str
    job_label: bool = True
    max_series: int = MAX_SERIES
    token: str | None = None
    push_s: float = PUSH_S


def _snappy() -> Any:
    try:
        import cramjam
    except ImportError:
        raise UsageError("needs the cramjam package for snappy: pip install 'hpcml[remote]'", key="remote_write") from None
    return cramjam.snappy


def config(url: str | None = None, *, job_label: bool | None = None, max_series: int | None = None,
           env: Mapping[str, str] = os.environ) -> Config | None:
    """The settings from the arguments, else the environment (how ``hpcml run`` passes
    them to its ranks); None when remote write is off. Bad ones are a UsageError."""
    url = url if url is not None else env.get(ENV_URL, "")
    if not url:
        return None
    if not is_http_url(url):
        raise UsageError(f"expected the http(s) URL of a remote-write receiver (e.g. "
                         f"http://vm:8428/api/v1/write), got {url!r}", key="remote_write")
    if job_label is None:
        job_label = env.get(ENV_NO_JOB_LABEL, "").lower() not in ("1", "true", "yes")
    if max_series is None:
        raw = env.get(ENV_MAX_SERIES) or str(MAX_SERIES)
        max_series = int(raw) if raw.isdigit() else -1
    if max_series < 1:
        raise UsageError("must be a whole number of series above 0", key="remote_write_max_series")
    _snappy()
    return Config(url, job_label, max_series, env.get(ENV_TOKEN) or None)


def series_per_job(nodes: int, ranks: int, gpus_per_node: int) -> int:
    return nodes * (len(NODE_METRICS) + gpus_per_node * GPU_METRICS_MAX) + ranks * len(RANK_METRICS)


def check_budget(cfg: Config, task: Any, gpu_meta: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> dict:
    """The job's series estimate from this task's view of the allocation; over budget is a UsageError."""
    nodes = 0
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if env.get(key, "").isdigit():
            nodes = int(env[key])
            break
    if not nodes:
        from hpcml.cluster.hostlist import expand
        nodes = len(expand(task.nodes))
    nodes = max(1, nodes)
    sampled = len(gpu_meta.get("gpu_uuids") or gpu_meta.get("gpu_models") or ())
    gpus = min(MAX_GPUS_PER_NODE, max(sampled, len(task.gpus) * math.ceil(task.ntasks / nodes)))
    estimate = series_per_job(nodes, task.ntasks, gpus)
    if estimate > cfg.max_series:
        raise UsageError(f"this job would write about {estimate:,} series ({nodes} nodes x ({len(NODE_METRICS)} + "
                         f"{gpus} GPUs x {GPU_METRICS_MAX}) + {task.ntasks} ranks x {len(RANK_METRICS)}), over the "
                         f"budget of {cfg.max_series:,}: raise it if the TSDB can take it", key="remote_write_max_series")
    return {"estimate": estimate, "max_series": cfg.max_series, "job_label": cfg.job_label}


# --- the pusher

class RemoteWriter:
    """One recorder's series, downsampled to one sample per ``resolution`` and pushed from
    a daemon thread. ``update``/``update_batch`` only append under a lock."""

    def __init__(self, cfg: Config, *, node: str, rank: int, job: str, node_writer: bool,
                 resolution: float = 1.0, warn: Callable[[str], None] = lambda line: None, budget: dict | None = None) -> None:
        self.cfg, self.node_writer, self.warn, self.budget = cfg, node_writer, warn, budget
        self.snappy = _snappy()
        base = {"node": node, **({"slurm_job": job} if cfg.job_label else {})}
        self._scopes = {"node": base, "rank": {**base, "rank": str(rank)}}
        parts = urllib.parse.urlsplit(cfg.url)
        self.display = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
        self._target = (parts.scheme, parts.hostname or "", parts.port, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        self._headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                         "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": f"hpcml/{__version__}"}
        if cfg.token:
            self._headers["Authorization"] = f"Bearer {cfg.token}"
        elif parts.username:
            cred = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        self._res_ns, self._grace_ns = max(1, int(resolution * 1e9)), int(GRACE_S * 1e9)
        self._labels: dict[tuple, bytes] = {}           # series key -> encoded labels
        self._open: dict[tuple, list] = {}              # series key -> [bucket, sum, n, last ts ms]
        self._last: dict[tuple, int] = {}               # series key -> last queued ts ms
        self._queue: deque[tuple[tuple, int, float]] = deque()
        self._gpu_names: set[str] = set()
        self._throughput: str | None = None
        self.stats = {"sent": 0, "dropped": 0, "rejected": 0, "failures": 0, "late": 0, "over_budget": 0, "errors": 0}
        self._failing, self._backoff = False, 0.0
        self._conn: http.client.HTTPConnection | None = None
        self._warned: set[int] = set()
        self._retry: list | None = None                 # the batch that failed: sent again, alone
        self.problem: str | None = None                 # the last failure, for the rank's metadata
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcml-remote-write", daemon=True)
        self._thread.start()

    # -- rows in
    def _key(self, kind: str, name: str, gpu: Any) -> tuple | None:
        if kind == "section":
            return ("hpcml_step_seconds", "rank", ()) if name == "step" else None
        if kind == "metric":
            if self._throughput is None and (name in THROUGHPUT_METRICS or name.endswith(("_per_s", "_per_sec", "_per_second"))):
                self._throughput = name
            return ("hpcml_throughput", "rank", (("name", name),)) if name == self._throughput else None
        if not self.node_writer and kind == "host":
            return None
        if kind == "host":
            return (f"hpcml_host_{name}", "node", ()) if name in NODE_METRICS else None
        if kind != "gpu" or gpu is None:
            return None
        if name not in self._gpu_names:
            if len(self._gpu_names) >= GPU_METRICS_MAX:
                self.stats["over_budget"] += 1
                return None
            self._gpu_names.add(name)
        return (f"hpcml_gpu_{_BAD_NAME.sub('_', name)}", "node", (("gpu", str(gpu)),))

    def update(self, rows: Iterable[tuple]) -> None:
        """Rows as the store takes them: (ts_ns, kind, name, value, step, gpu); never raises."""
        with self._lock:
            for ts, kind, name, value, _step, gpu in rows:
                try:
                    if value is None or (key := self._key(kind, name, gpu)) is None:
                        continue
                    if key not in self._labels:
                        metric, scope, extra = key
                        self._labels[key] = encode_labels({"__name__": metric, **self._scopes[scope], **dict(extra)})
                    self._add(key, int(ts), float(value))
                except Exception:  # noqa: BLE001 - a bad row must not stop the recorder
                    self.stats["errors"] += 1

    def update_batch(self, batch: Any) -> None:
        """An Arrow batch of ``observe.log``/``section`` rows (ts in microseconds)."""
        from hpcml.observe.schema import micros
        try:
            ts = micros(batch.column("ts"))
            cols = [batch.column(c).to_pylist() for c in ("kind", "name", "value", "step", "gpu")]
        except Exception:  # noqa: BLE001 - not the store's schema: counted, never raised
            self.stats["errors"] += 1
            return
        self.update((t * 1000, *rest) for t, *rest in zip(ts, *cols))

    def _add(self, key: tuple, ts_ns: int, value: float) -> None:
        bucket, ts_ms = ts_ns // self._res_ns, ts_ns // 1_000_000
        w = self._open.get(key)
        if w is not None and bucket <= w[0]:          # same window (or a late row): averaged in
            w[1] += value
            w[2] += 1
            w[3] = max(w[3], ts_ms)
            return
        if w is not None:
            self._close(key, w)
        self._open[key] = [bucket, value, 1, ts_ms]

    def _close(self, key: tuple, w: list) -> None:
        if w[3] <= self._last.get(key, -1):           # would be out of order: the receiver rejects a whole request
            self.stats["late"] += 1
            return
        self._last[key] = w[3]
        if len(self._queue) >= QUEUE_SAMPLES:
            self._queue.popleft()
            self.stats["dropped"] += 1
        self._queue.append((key, w[3], w[1] / w[2]))

    def _close_due(self, now_ns: int, every: bool) -> None:
        for key, w in list(self._open.items()):
            if every or (w[0] + 1) * self._res_ns + self._grace_ns <= now_ns:
                self._close(key, w)
                del self._open[key]

    # -- requests out
    def _run(self) -> None:
        wait = random.random() * self.cfg.push_s        # the ranks of a job start together: spread their pushes
        while not self._stop.wait(wait):
            wait = self._push(every=False)
        deadline = time.monotonic() + STOP_S
        self._push(every=True)
        if self._failing and time.monotonic() + 1 < deadline:
            time.sleep(1.0)                     # the last samples: once more
            self._push(every=True)

    def _push(self, every: bool) -> float:
        try:
            return self._push_due(every)
        except Exception:  # noqa: BLE001 - the thread must outlive a bug: counted, tried again later
            self.stats["errors"] += 1
            return self.cfg.push_s
        finally:        # one connection per push, not kept: see the module's docstring
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _push_due(self, every: bool) -> float:
        """Send what is due; the next wait (the push interval, or a backoff after a failure)."""
        with self._lock:
            self._close_due(time.time_ns(), every)
        while True:
            batch = self._retry
            if batch is None:
                with self._lock:
                    batch = [self._queue.popleft() for _ in range(min(BATCH_SAMPLES, len(self._queue)))]
            if not batch:
                return self.cfg.push_s
            # a retry goes alone: if a timed-out attempt was stored after all, the receiver
            # rejects the retry as out of order, and newer samples must not go down with it
            retry, self._retry = self._retry is not None, batch
            status, why = self._send(batch)
            if status is not None and 200 <= status < 300:
                self._retry = None
                self.stats["sent"] += len(batch)
                if self._failing:
                    self._failing, self._backoff = False, 0.0
                    self.warn(f"remote write to {self.display}: delivering again")
            elif status is not None and 400 <= status < 500 and status != 429:
                self._retry = None
                self.stats["rejected"] += len(batch)
                self.problem = f"HTTP {status} {why}"
                if status not in self._warned:          # once per status: the spec says not to retry
                    self._warned.add(status)
                    self.warn(f"remote write to {self.display}: {len(batch)} samples rejected: HTTP {status} {why}"
                              + (" (a retry: the first attempt may have been stored)" if retry else ""))
            else:
                self.stats["failures"] += 1
                self.problem = why = why if status is None else f"HTTP {status} {why}"
                if not self._failing:
                    self._failing = True
                    self.warn(f"remote write to {self.display} failed ({why}): retrying with backoff, "
                              f"keeping the newest {QUEUE_SAMPLES:,} samples")
                self._backoff = min(MAX_BACKOFF_S, max(self.cfg.push_s, 2 * self._backoff))
                return self._backoff

    def _send(self, batch: list) -> tuple[int | None, str]:
        series: dict[tuple, list[tuple[int, float]]] = {}
        for key, ts, value in batch:                    # queued in time order per series
            series.setdefault(key, []).append((ts, value))
        body = bytes(self.snappy.compress_raw(write_request((self._labels[k], s) for k, s in series.items())))
        for attempt in (1, 2):                          # a connection the server closed between batches: once more
            reused = self._conn is not None
            try:
                if self._conn is None:
                    scheme, host, port, _ = self._target
                    self._conn = (http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=ssl.create_default_context())
                                  if scheme == "https" else http.client.HTTPConnection(host, port, timeout=TIMEOUT_S))
                self._conn.request("POST", self._target[3], body=body, headers=self._headers)
                resp = self._conn.getresponse()
                text = resp.read().decode(errors="replace").strip().splitlines()
                return resp.status, (text[0][:200] if text else resp.reason)
            except (OSError, http.client.HTTPException) as exc:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if not (reused and attempt == 1):
                    return None, str(exc) or type(exc).__name__
        return None, "unreachable"

    def close(self) -> dict:
        """Flush (at most ``STOP_S``) and stop; ``{"remote_write": what was delivered}`` for
        the rank's metadata."""
        self._stop.set()
        self._thread.join(STOP_S + 1)
        with self._lock:
            unsent = len(self._queue) + len(self._open) + len(self._retry or ())
        st = self.stats
        if st["dropped"] or unsent or st["rejected"]:
            self.warn(f"remote write to {self.display}: {st['dropped'] + unsent:,} samples dropped, "
                      f"{st['rejected']:,} rejected, {st['sent']:,} delivered")
        return {"remote_write": {"url": self.display, "series": len(self._labels), **st, "unsent": unsent,
                                 "problem": self.problem, "budget": self.budget}}


def for_task(cfg: Config, task: Any, gpu_meta: Mapping[str, Any], interval: float,
             warn: Callable[[str], None]) -> RemoteWriter:
    """A recorder's writer, after the budget check (a UsageError before anything runs)."""
    budget = check_budget(cfg, task, gpu_meta)
    return RemoteWriter(cfg, node=task.node, rank=task.rank, job=task.job_id, node_writer=task.local_rank == 0,
                        resolution=interval, warn=warn, budget=budget)
