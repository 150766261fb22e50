"""Relative thresholds: judge a node against the rest of its allocation.

A node that passes every absolute limit can still be the slow one that holds every
collective back. Each node's value is compared with the median of the *other* nodes
(leave-one-out, so that with two nodes the slow one is compared with the fast one, not
with a median it drags down itself). A node with no other value to compare with (it vetted
alone) or whose reference is 0 is not judged relatively, and its message says so: its pass is
the absolute limits' only.
"""

from __future__ import annotations

import statistics

from hpcml.vet.model import CheckResult, Outcome

_JUDGED = (Outcome.PASS, Outcome.WARN, Outcome.FAIL)


def apply(results: dict[str, CheckResult], min_relative: float | None,
          max_relative: float | None, severity: str = "fail") -> None:
    if min_relative is None and max_relative is None:
        return
    values = {n: float(r.value) for n, r in results.items()
              if r.outcome in _JUDGED and isinstance(r.value, (int, float))
              and not isinstance(r.value, bool)}
    if len(values) < 2:
        for node in values:
            _not_compared(results[node], "no other node's value")
        return
    ordered = sorted(values.items())
    for node, value in ordered:
        ref = statistics.median(v for n, v in ordered if n != node)
        if ref == 0:
            _not_compared(results[node], "the other nodes' median is 0")
            continue
        ratio = value / ref
        r = results[node]
        r.details["relative_to_others"] = round(ratio, 4)
        problem = None
        if min_relative is not None and ratio < min_relative:
            problem = f"{ratio:.2f}x the median of the other nodes < {min_relative:g}x"
        elif max_relative is not None and ratio > max_relative:
            problem = f"{ratio:.2f}x the median of the other nodes > {max_relative:g}x"
        limits = [f">= {min_relative:g}x median" if min_relative is not None else "",
                  f"<= {max_relative:g}x median" if max_relative is not None else ""]
        rel = " and ".join(x for x in limits if x)
        r.threshold = f"{r.threshold}; {rel}" if r.threshold else rel
        if problem and r.outcome is not Outcome.FAIL:
            r.outcome = Outcome.WARN if severity == "warn" else Outcome.FAIL
        if problem:
            r.message = f"{r.message}; {problem}" if r.message else problem


def _not_compared(r: CheckResult, why: str) -> None:
    """The relative limit was not judged: say so rather than let the pass claim it."""
    r.details["relative_to_others"] = None
    said = f"not compared with the other nodes ({why})"
    r.message = f"{r.message}; {said}" if r.message else said
