"""The live watch's verdicts on a Prometheus endpoint (``hpcml run --prometheus-port``).

What an operator's alerting wants from a running job without reading its log: each rank's
live straggler score and whether it is named, the furthest step, a hang, and the ranks that
crashed. One endpoint, served by the launcher; labels ``slurm_job``, ``rank`` and ``node``
(at most the job's ranks, so cardinality is the job's size).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcml.jobmodel import Straggler
    from hpcml.observe.beat import Beat


class WatchExporter:
    def __init__(self, port: int, addr: str, job: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server
        self.job = job
        self.registry = CollectorRegistry()
        base = ("slurm_job", "rank", "node")
        self.score = Gauge("hpcml_run_straggler_score", "Rank's step time over the step median (live model)", base,
                           registry=self.registry)
        self.straggler = Gauge("hpcml_run_straggler", "1 once the watch named the rank a straggler", base,
                               registry=self.registry)
        self.since = Gauge("hpcml_run_straggler_since_step", "Step the named straggler's slowness began", base,
                           registry=self.registry)
        self.crashed = Gauge("hpcml_run_crashed_exit_code", "Exit code of a rank that crashed", base,
                             registry=self.registry)
        # absent until the watch has judged (a step ended, --hang-timeout not off): unknown is not 0
        self.hang = Gauge("hpcml_run_hang", "1 once the watch found the job hung, 0 while it judges it not hung",
                          ("slurm_job",), registry=self.registry)
        self.step = Gauge("hpcml_run_step", "The furthest step any rank completed", ("slurm_job",),
                          registry=self.registry)
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)

    def update(self, beats: dict[int, Beat], scores: dict[int, float], stragglers: dict[int, Straggler],
               crashed: dict[int, int], hung: bool | None) -> None:
        """``hung`` None: not judged yet (no step ended) or never (--hang-timeout off): the
        gauge stays absent rather than read "not hung"."""
        steps = [b.step for b in beats.values() if b.step is not None]
        if steps:
            self.step.labels(self.job).set(max(steps))
        node = {r: str(b.node) for r, b in beats.items()}
        for rank, score in scores.items():
            self.score.labels(self.job, str(rank), node.get(rank, "")).set(score)
        for rank, s in stragglers.items():
            self.straggler.labels(self.job, str(rank), node.get(rank, "")).set(1)
            self.since.labels(self.job, str(rank), node.get(rank, "")).set(s.since_step)
        for rank, code in crashed.items():
            self.crashed.labels(self.job, str(rank), node.get(rank, "")).set(code)
        if hung is not None:
            self.hang.labels(self.job).set(1 if hung else 0)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
