"""How long a rank's CPU cores were held back for heat: the kernel's thermal throttle
counters (Intel's ``/sys/devices/system/cpu/cpuN/thermal_throttle/core_throttle_total_time_ms``,
the time the core's clock ran throttled since boot, and ``package_throttle_total_time_ms``
for its package).

Why: a rank on a hot node computes as slowly as a slow rank's, and its CPU time and run
delay look normal; only these counters say the cores ran slowed. A rank is on the cores of
its affinity; the figure is their mean, cumulative seconds (the heartbeat's
``cpu_throttled_s``), so the watch takes the share of a window as for the GPUs' clocks. No
counters (AMD's kernels, most virtual machines, this suite's machines): None, never 0.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
COUNTERS = ("core_throttle_total_time_ms", "package_throttle_total_time_ms")
MAX_CPUS = 256            # the cores read a sample, at most (a rank's affinity is a few)
MAX_MS = 1 << 62          # a counter past this is not the kernel's


def _ms(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read(32)
        v = int(text.strip() or b"x")
    except (OSError, ValueError):
        return None
    return v if 0 <= v < MAX_MS else None


@functools.cache
def _kept(root: Path) -> bool:
    """Whether the kernel keeps the counters here at all: asked once (the recorder asks every
    second; a machine without them, most, must not pay a failed open per core each time)."""
    return next(root.glob("cpu[0-9]*/thermal_throttle"), None) is not None


def throttled_s(pid: int, root: Path = SYS_CPU) -> float | None:
    """The mean over ``pid``'s allowed cores of the seconds each ran throttled for heat since
    boot (its core's counter, or its package's where that is larger), or None where the
    kernel keeps no such counter for any of them."""
    if not _kept(root):
        return None
    try:
        cpus = sorted(os.sched_getaffinity(pid))[:MAX_CPUS]
    except OSError:
        return None
    got = []
    for cpu in cpus:
        base = root / f"cpu{cpu}" / "thermal_throttle"
        values = [v for name in COUNTERS if (v := _ms(base / name)) is not None]
        if values:
            got.append(max(values))
    return round(sum(got) / len(got) / 1000.0, 3) if got else None
