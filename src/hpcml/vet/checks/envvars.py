"""Environment variables the job relies on (NCCL, proxy, CUDA settings), present and right."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import EnvParams  # noqa: F401


class EnvCheck(Check["EnvParams"]):
    default_timeout = 2.0
    inline = True          # reads the kernel's or the process's values: no fork

    def run(self) -> CheckReport:
        problems = []
        for name, want in self.params.expected.items():
            have = os.environ.get(name)
            if have is None:
                problems.append(f"{name} is not set")
            elif want is not None and have != want:
                problems.append(f"{name}={have!r}, expected {want!r}")
        problems += [f"{name} is set" for name in self.params.absent if name in os.environ]
        n = len(self.params.expected) + len(self.params.absent)
        return judge(not problems, len(problems), threshold="0 mismatches", unit="bad vars",
                     message="; ".join(problems) or f"{n} variables as expected")
