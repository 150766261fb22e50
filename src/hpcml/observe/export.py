"""Live export: one Prometheus exposition endpoint per node, for the job's ranks there.

The recorder of local rank 0 serves ``port`` over HTTP; the recorders of the node's other
ranks send their rows to it as UDP datagrams on the same port number, on loopback (a
lost datagram only delays a gauge to the next sample). Gauges are updated from the same
rows the recorders write to the store, so the endpoint and the store agree.

Cardinality is bounded: labels are slurm_job, rank, node (and gpu for GPU metrics) plus
the metric or section name, of which at most ``MAX_NAMES`` per node are exported (more
are counted in ``hpcml_export_names_dropped_total`` and stay in the store). ``job`` is
left to Prometheus, which sets it to the scrape job's name.
"""

from __future__ import annotations

import json
import socket
import threading

MAX_NAMES = 64
MAX_DATAGRAM = 60_000


class PromExporter:
    """The node's endpoint (local rank 0)."""

    def __init__(self, port: int, addr: str, *, job: str, rank: int, node: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
        self.registry = CollectorRegistry()
        base = ("slurm_job", "rank", "node")
        self.job, self.rank, self.node = job, rank, node
        self.host = Gauge("hpcml_host", "Host sample (see the name label)", base + ("name",),
                          registry=self.registry)
        self.gpu = Gauge("hpcml_gpu", "GPU sample from NVML", base + ("gpu", "name"),
                         registry=self.registry)
        self.metric = Gauge("hpcml_metric", "Last value logged with observe.log", base + ("name",),
                            registry=self.registry)
        self.section = Gauge("hpcml_section_seconds", "Last duration of an observe.section",
                             base + ("name",), registry=self.registry)
        self.step = Gauge("hpcml_step", "Last step logged", base, registry=self.registry)
        self.dropped = Counter("hpcml_export_names_dropped", "Names beyond the export limit",
                               base, registry=self.registry)
        self._names: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", port))
        threading.Thread(target=self._receive, name="hpcml-export-udp", daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                data = self.udp.recv(65536)
            except OSError:
                return                  # closed
            try:
                msg = json.loads(data)
                self.update([tuple(r) for r in msg["rows"]], rank=int(msg["rank"]))
            except (ValueError, KeyError, TypeError):
                continue                # not ours: ignore

    def _allowed(self, kind: str, name: str) -> bool:
        key = (kind, name)
        if key in self._names:
            return True
        if len(self._names) >= MAX_NAMES:
            return False
        self._names.add(key)
        return True

    def update(self, rows: list[tuple], rank: int | None = None) -> None:
        """Rows as the store takes them: (ts_ns, kind, name, value, step, gpu)."""
        lab = {"slurm_job": self.job, "rank": str(self.rank if rank is None else rank), "node": self.node}
        gauges = {"host": self.host, "metric": self.metric, "section": self.section}
        with self._lock:
            for _ts, kind, name, value, step, gpu in rows:
                if value is None or kind not in ("host", "gpu", "metric", "section"):
                    continue
                if not self._allowed(kind, name):
                    self.dropped.labels(**lab).inc()
                elif kind == "gpu":
                    self.gpu.labels(**lab, gpu=str(gpu), name=name).set(value)
                else:
                    gauges[kind].labels(**lab, name=name).set(value)
                if step is not None and kind in ("metric", "section"):
                    self.step.labels(**lab).set(step)

    def update_batch(self, batch) -> None:
        self.update(batch_rows(batch))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.udp.close()


class PromForwarder:
    """Another rank of the node: sends its rows to local rank 0's endpoint."""

    def __init__(self, port: int, *, rank: int) -> None:
        self.port, self.rank = port, rank
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def update(self, rows: list[tuple]) -> None:
        rows = [r for r in rows if r[3] is not None and r[1] in ("host", "gpu", "metric", "section")]
        step = max(1, len(rows) // (1 + len(json.dumps(rows)) // MAX_DATAGRAM))
        for i in range(0, len(rows), step):
            try:
                self.udp.sendto(json.dumps({"rank": self.rank, "rows": rows[i:i + step]}).encode(),
                                ("127.0.0.1", self.port))
            except OSError:
                return                  # endpoint not up (yet): the next sample tries again

    def update_batch(self, batch) -> None:
        self.update(batch_rows(batch))

    def close(self) -> None:
        self.udp.close()


def batch_rows(batch) -> list[tuple]:
    from hpcml.observe.schema import from_batch
    cols = from_batch(batch)
    return list(zip(cols["ts"], cols["kind"], cols["name"], cols["value"], cols["step"], cols["gpu"]))
