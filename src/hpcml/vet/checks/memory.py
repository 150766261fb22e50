"""Free memory: a node whose RAM is held by leftovers swaps or gets OOM-killed mid-run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcml.units import fmt_bytes
from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import MemoryParams  # noqa: F401


def available_total() -> tuple[int, int]:
    """(available, total) bytes: the kernel's MemAvailable and MemTotal, as psutil reads them
    on Linux, without psutil's ~50 ms import on every node; psutil elsewhere."""
    try:
        with open("/proc/meminfo", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return int(fields[b"MemAvailable"].split()[0]) * 1024, int(fields[b"MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        import psutil
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)


class MemoryCheck(Check["MemoryParams"]):
    default_timeout = 5.0
    inline = True          # reads the kernel's or the process's values: no fork

    def run(self) -> CheckReport:
        available, total = available_total()
        p = self.params
        problems, limits = [], []
        if p.min_available is not None:
            limits.append(f">= {fmt_bytes(p.min_available)}")
            if available < p.min_available:
                problems.append(f"available {fmt_bytes(available)} < {fmt_bytes(p.min_available)}")
        if p.min_available_fraction is not None:
            limits.append(f">= {p.min_available_fraction:.0%} of {fmt_bytes(total)}")
            if available < p.min_available_fraction * total:
                problems.append(f"available {available / total:.0%} of total "
                                f"< {p.min_available_fraction:.0%}")
        return judge(not problems, int(available), threshold=" and ".join(limits), unit="B",
                     message="; ".join(problems) or f"{fmt_bytes(available)} available",
                     total=int(total))
