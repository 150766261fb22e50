"""Where a launcher's own time goes, phase by phase: wall time and CPU time.

``hpcml run`` records each phase of its own work (start-up, vetting's fan-out, gathering and
deciding, the rendezvous, the srun step, the watch's reads, the report) into run.json's
``phases``, so that what the launcher does serially, once per job, is seen apart from what
every node does in parallel (``benchmarks/bench_scale.py`` fits how each grows with the node
count). CPU is the launcher process's (``time.process_time``: all its threads, the readers of
a step's output and the prefetching of imports included), measured over the phase's wall
time. Standard library only: vetting imports it before its workers start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field


@dataclass
class Span:
    """One phase: when it began (epoch s), how long it took, the launcher's CPU in it."""

    name: str
    start: float
    wall_s: float
    cpu_s: float

    def to_json(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass
class Clock:
    """The phases of one command, in the order they ended."""

    spans: list[Span] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start, cpu, t0 = time.time(), time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            self.spans.append(Span(name, start, time.perf_counter() - t0, time.process_time() - cpu))

    def add(self, name: str, start: float, wall_s: float, cpu_s: float = 0.0) -> None:
        """A phase measured elsewhere (the process's start-up, the ranks' own start)."""
        self.spans.append(Span(name, start, max(0.0, wall_s), max(0.0, cpu_s)))

    def to_json(self) -> list[dict]:
        return [s.to_json() for s in self.spans]


_active: Clock | None = None


def begin() -> Clock:
    """A new clock for this command: ``phase`` records into it from now on (vetting's
    phases too, without passing it through every call). One command per process."""
    global _active
    _active = Clock()
    return _active


def current() -> Clock | None:
    """The command's clock, if it keeps one."""
    return _active


def phase(name: str) -> AbstractContextManager[None]:
    """``with phase(name):`` times the block into the command's clock; nothing without one
    (``hpcml vet`` on its own)."""
    return _active.phase(name) if _active is not None else nullcontext()


def started() -> tuple[float, float]:
    """This process's start (epoch s) and its CPU so far: the start-up phase of a command
    that records its phases from its entry point on. ``(now, cpu)`` where /proc cannot say."""
    import os

    from hpcml.proctree import began
    cpu, now = time.process_time(), time.time()
    at = began(os.getpid(), now)
    return (at if at is not None and at <= now else now), cpu
