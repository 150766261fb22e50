"""Each rank's time waiting for a CPU, and its GPUs' time held back, as its recorder reports
them, kept for the live watch.

Why: a rank on a node whose CPUs something else keeps busy (another job's processes, a
daemon, a virtual machine's neighbours) computes as slowly as a slow node's, and the
straggler model cannot tell them apart from step times. The kernel can: the rank's threads
wait on a run queue (their scheduler run delay, ``proctree.cpu_wait``) and a virtual
machine's CPUs are stolen (``steal``); a GPU whose clocks its power or heat hold back says so
(NVML's clocks event reasons: ``gpu_throttled``), and a CPU whose cores ran throttled for
heat says so too (the kernel's counters: ``cpu_throttled``). The watch names such a rank as contended,
not as a straggler (``hpcml.run.watch``).

A ring of ``SIZE`` samples per rank, at least ``EVERY`` seconds apart, in numpy arrays: at
10,752 ranks a deque of tuples per rank would hold ~100 MB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SIZE = 64                 # samples kept per rank: 64 x EVERY s covers the longest window judged
EVERY = 5.0               # seconds between two samples kept (the rank's own clock)


class CpuWaits:
    """The arrays are made, and numpy imported, at the first figure a rank reports, as
    ``hpcml.run.steptimes``'s: not while the ranks start."""

    def __init__(self, world: int, size: int = SIZE) -> None:
        self.world, self.size = world, size
        self.held = False

    def _hold(self) -> None:
        import numpy as np
        world, size = self.world, self.size
        self.t = np.full((world, size), np.nan)
        self.wait = np.full((world, size), np.nan)
        self.steal = np.full((world, size), np.nan)
        self.throttled = np.full((world, size), np.nan)
        self.hot = np.full((world, size), np.nan)     # its cores' seconds throttled for heat
        self.n = np.zeros(world, np.int64)            # samples kept so far (the next slot is n % size)
        self.held = True

    def add(self, rank: int, t: float | None, wait: float | None, steal: float | None,
            throttled: float | None = None, hot: float | None = None) -> None:
        """A heartbeat's cumulative figures at ``t`` (its beat time); kept when ``EVERY``
        seconds newer than the last kept."""
        if t is None or (wait is None and throttled is None and hot is None) or not 0 <= rank < self.world:
            return
        if not self.held:
            self._hold()
        import numpy as np
        n = int(self.n[rank])
        if n:
            last = (n - 1) % self.t.shape[1]
            went_back = any(x is not None and x < kept for x, kept in
                            ((wait, self.wait[rank, last]), (throttled, self.throttled[rank, last]),
                             (hot, self.hot[rank, last])))  # NaN: never
            if t < self.t[rank, last] or went_back:
                self.n[rank], n = 0, 0                # a clock or a count that went back: start again
                for a in (self.t, self.wait, self.steal, self.throttled, self.hot):
                    a[rank] = np.nan
            elif t < self.t[rank, last] + EVERY:
                return
        i = n % self.t.shape[1]
        self.t[rank, i], self.wait[rank, i] = t, np.nan if wait is None else wait
        self.steal[rank, i] = np.nan if steal is None else steal
        self.throttled[rank, i] = np.nan if throttled is None else throttled
        self.hot[rank, i] = np.nan if hot is None else hot
        self.n[rank] = n + 1

    def shares(self, rank: int, seconds: float) -> tuple[float | None, float | None, float | None, float | None]:
        """(the share of the last ``seconds`` of the rank's time its threads waited for a CPU,
        the share of its node's CPU time stolen then, the share its GPUs' clocks were held
        back then, the share its cores ran throttled for heat then); None where it was not
        measured over at least half of that time."""
        if not self.held or not 0 <= rank < self.world or self.n[rank] < 2:
            return None, None, None, None
        import numpy as np
        t = self.t[rank]
        last = int(np.nanargmax(t))
        since = t[last] - seconds
        ok = np.flatnonzero(t >= since - EVERY)
        first = int(ok[np.argmin(t[ok])])
        span = t[last] - t[first]
        if span < seconds / 2 or span <= 0:
            return None, None, None, None

        def share(v: np.ndarray) -> float | None:
            if not (np.isfinite(v[last]) and np.isfinite(v[first])):
                return None
            x = (v[last] - v[first]) / span
            return round(float(x), 3) if x >= 0 else None
        return share(self.wait[rank]), share(self.steal[rank]), share(self.throttled[rank]), share(self.hot[rank])
