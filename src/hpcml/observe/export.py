"""Live export: a Prometheus exposition endpoint for one recorded task.

The recorder updates gauges from the same rows it writes to the store, so the endpoint
and the store never disagree. Cardinality is bounded: the labels are slurm_job, rank, node (and
gpu for GPU metrics), fixed for a task, plus the metric or section name, of which at most
``MAX_NAMES`` are exported (further names are counted in
``hpcml_export_names_dropped_total``, and stay in the store).

One endpoint per task, on ``port + local rank``, so that several ranks of a node never
compete for one port; the README shows the matching scrape configuration.
"""

from __future__ import annotations

MAX_NAMES = 64


class PromExporter:
    def __init__(self, port: int, addr: str, *, job: str, rank: int, node: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
        self.registry = CollectorRegistry()
        base = ("slurm_job", "rank", "node")   # "job" is Prometheus's own target label
        self.labels = {"slurm_job": job, "rank": str(rank), "node": node}
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
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)

    def _allowed(self, kind: str, name: str) -> bool:
        key = (kind, name)
        if key in self._names:
            return True
        if len(self._names) >= MAX_NAMES:
            self.dropped.labels(**self.labels).inc()
            return False
        self._names.add(key)
        return True

    def update(self, rows: list[tuple]) -> None:
        """Rows as the store takes them: (ts_ns, kind, name, value, step, gpu)."""
        lab = self.labels
        for _ts, kind, name, value, step, gpu in rows:
            if value is None:
                continue
            if kind == "host" and self._allowed(kind, name):
                self.host.labels(**lab, name=name).set(value)
            elif kind == "gpu" and self._allowed(kind, name):
                self.gpu.labels(**lab, gpu=str(gpu), name=name).set(value)
            elif kind == "metric" and self._allowed(kind, name):
                self.metric.labels(**lab, name=name).set(value)
            elif kind == "section" and self._allowed(kind, name):
                self.section.labels(**lab, name=name).set(value)
            if step is not None and kind in ("metric", "section"):
                self.step.labels(**lab).set(step)

    def update_batch(self, batch) -> None:
        cols = batch.to_pydict()
        self.update(list(zip(cols["ts"], cols["kind"], cols["name"], cols["value"], cols["step"],
                             cols["gpu"])))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
