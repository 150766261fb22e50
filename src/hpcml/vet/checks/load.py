"""CPU load: a node still busy with someone else's work makes every rank on it a straggler."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import LoadParams  # noqa: F401


class LoadCheck(Check["LoadParams"]):
    default_timeout = 5.0
    inline = True          # reads the kernel's or the process's values: no fork

    def run(self) -> CheckReport:
        load1, _, _ = os.getloadavg()
        cpus = os.cpu_count() or 1  # the load average counts the whole machine
        per_cpu = load1 / cpus
        limit = self.params.max_load_per_cpu
        return judge(per_cpu <= limit, round(per_cpu, 3), threshold=f"<= {limit:g}",
                     unit="load/cpu", message=f"1-min load {load1:.2f} on {cpus} CPUs")
