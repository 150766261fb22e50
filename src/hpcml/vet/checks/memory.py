"""Free memory: a node whose RAM is held by leftovers swaps or gets OOM-killed mid-run."""

from __future__ import annotations

import psutil
from pydantic import BaseModel, ConfigDict

from hpcml.units import Bytes, Fraction, fmt_bytes
from hpcml.vet.checks.base import Check, CheckReport, judge


class MemoryParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_available: Bytes | None = None
    min_available_fraction: Fraction | None = 0.5


class MemoryCheck(Check[MemoryParams]):
    default_timeout = 5.0

    def run(self) -> CheckReport:
        vm = psutil.virtual_memory()
        p = self.params
        problems, limits = [], []
        if p.min_available is not None:
            limits.append(f">= {fmt_bytes(p.min_available)}")
            if vm.available < p.min_available:
                problems.append(f"available {fmt_bytes(vm.available)} < {fmt_bytes(p.min_available)}")
        if p.min_available_fraction is not None:
            limits.append(f">= {p.min_available_fraction:.0%} of {fmt_bytes(vm.total)}")
            if vm.available < p.min_available_fraction * vm.total:
                problems.append(f"available {vm.available / vm.total:.0%} of total "
                                f"< {p.min_available_fraction:.0%}")
        return judge(not problems, int(vm.available), threshold=" and ".join(limits), unit="B",
                     message="; ".join(problems) or f"{fmt_bytes(vm.available)} available",
                     total=int(vm.total))
