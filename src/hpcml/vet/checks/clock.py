"""Clock skew against the other nodes of the allocation.

Skewed clocks break timestamps that line nodes up (telemetry, logs) and some
rendezvous timeouts. Each node reports its wall clock when it sends its results; the
launcher notes when each report arrives, so ``sent - received`` is the node's offset from
the launcher plus a transport delay of milliseconds. A node is judged by how far its offset
lies from the median offset of the allocation. With no other node's offset to compare with
(one node, or a node whose send or arrival time is unknown) the skew is not measured: the
check is skipped, never a pass at 0 s.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hpcml.vet.checks.base import Check, CheckReport, passed
from hpcml.vet.model import CheckResult, NodeReport, Outcome

if TYPE_CHECKING:
    from hpcml.vet.checks.params import ClockParams


class ClockCheck(Check["ClockParams"]):
    default_timeout = 2.0
    inline = True          # reads the kernel's or the process's values: no fork

    def run(self) -> CheckReport:
        return passed(None, threshold=f"|skew| <= {self.params.max_skew:g} s", unit="s",
                      message="judged against the other nodes", wall=time.time())

    @classmethod
    def compare(cls, params: ClockParams, results: dict[str, CheckResult],
                reports: dict[str, NodeReport]) -> None:
        offsets = {n: sent - received for n in results
                   if (sent := reports[n].sent_at) is not None
                   and (received := reports[n].received_at) is not None}
        for node, result in results.items():
            if result.outcome is Outcome.PASS and (node not in offsets or len(offsets) < 2):
                result.outcome, result.value = Outcome.SKIPPED, None
                result.message = ("not measured: no other node's clock to compare with" if node in offsets
                                  else "not measured: its report has no send or arrival time")
        if len(offsets) < 2:
            return
        import statistics  # the launcher's side only
        median = statistics.median(offsets.values())
        for node, result in results.items():
            if result.outcome is not Outcome.PASS or node not in offsets:
                continue
            skew = offsets[node] - median
            result.value = round(skew, 4)
            ok = abs(skew) <= params.max_skew
            result.outcome = Outcome.PASS if ok else Outcome.FAIL
            result.message = f"clock {skew:+.3f} s from the allocation's median"
