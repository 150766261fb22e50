"""Every rank's recent step times, held for the live straggler model.

A ring of ``SIZE`` steps per rank in numpy arrays (step time, compute time, step id), so
that adding a heartbeat's steps and cutting a ranks x steps window are array operations: at
1,024 ranks a dict per rank and a Python loop per step made each scoring ~200 ms of the
launcher's CPU. Compute is the step less its time in collectives (``recent_wait``; the
straggler model scores it, ``hpcml.observe.stragglers``); without waits, the step time.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SIZE = 2048                 # steps kept per rank: the window the model scores fits inside


class StepTimes:
    """The arrays are made, and numpy imported, at the first step a rank reports: the
    launcher's watch starts beside the task wrappers and ranks, whose start-up should not
    share the CPUs with numpy's import (``hpcml.observe.straggler_limits``)."""

    def __init__(self, world: int, size: int = SIZE) -> None:
        self.size, self.world = size, world
        self.held = False                               # any step yet (the arrays below exist)

    def _hold(self) -> None:
        import numpy as np
        world, size = self.world, self.size
        self.times = np.zeros((world, size), np.float32)
        self.busy = np.zeros((world, size), np.float32)
        self.ids = np.full((world, size), -1, np.int64)
        self.last = np.full(world, -1, np.int64)
        self.first = np.full(world, -1, np.int64)       # each rank's first step (in its current numbering)
        self.restarts = np.zeros(world, np.int64)
        self.waited = np.zeros(world, bool)             # the rank's beats carry its waits (measured)
        self.held = True

    def add(self, rank: int, steps: list[int], times: list[float], restarts: int = 0,
            waits: list[float] | None = None) -> None:
        """A heartbeat's recent steps (ascending); what is not newer than the rank's last step
        is known already and skipped before any array is made. ``restarts`` above the last
        seen: the rank's step numbering started again, so its row does too."""
        if not 0 <= rank < self.world:
            return
        if not self.held:
            if not steps:
                return                                  # nothing to hold: numpy not needed yet
            self._hold()
        import numpy as np

        from hpcml.observe.stragglers import less_wait
        if restarts != self.restarts[rank]:
            self.restarts[rank], self.last[rank], self.first[rank] = restarts, -1, -1
            self.ids[rank] = -1
        if not steps:
            return
        last = int(self.last[rank])
        if steps[-1] <= last:
            return
        first = bisect.bisect_right(steps, last)
        n = min(len(steps), len(times))
        s = np.asarray(steps[first:n], np.int64)
        t = np.asarray(times[first:n], np.float32)
        self.times[rank, s % self.size] = t
        if waits is not None and len(waits) >= n:
            t = less_wait(t, np.asarray(waits[first:n], np.float32))
            self.waited[rank] = True
        self.busy[rank, s % self.size] = t
        self.ids[rank, s % self.size] = s
        if self.first[rank] < 0 and len(s):
            self.first[rank] = int(s[0])
        self.last[rank] = steps[n - 1]

    def window(self, keep: int, busy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ranks, steps, times[rank, step]) of the last ``keep`` steps every reporting rank
        has, ending at the latest step they all reached; ``busy``: compute times, where every
        one of those ranks measured its waits (else their step times: a rank whose waits were
        not measured is not judged on its whole step against the others' compute)."""
        import numpy as np
        if not self.held:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        ranks = np.flatnonzero(self.last >= 0)
        if len(ranks) < 2:
            return ranks, np.zeros(0, np.int64), np.zeros((len(ranks), 0), np.float32)
        end = int(self.last[ranks].min())
        steps = np.arange(max(0, end - min(keep, self.size) + 1), end + 1)
        idx = steps % self.size
        have = (self.ids[np.ix_(ranks, idx)] == steps).all(axis=0)
        steps = steps[have]
        busy = busy and bool(self.waited[ranks].all())
        return ranks, steps, (self.busy if busy else self.times)[np.ix_(ranks, steps % self.size)]

    def median_step(self) -> float | None:
        if not self.held:
            return None
        import numpy as np
        ranks, steps, m = self.window(64)
        return float(np.median(m)) if m.size else None

    def first_step(self) -> int:
        """The earliest first step of the reporting ranks (-1: none yet)."""
        if not self.held:
            return -1
        seen = self.first[self.first >= 0]
        return int(seen.min()) if len(seen) else -1
