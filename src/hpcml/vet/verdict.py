"""From per-node results to one decision: continue, shrink or abort.

A node is bad when any check failed, when a check errored and the protocol did not opt
that check out (``count_errors: false``), or when it gave no result at all. ``warn`` and
``skipped`` never make a node bad; nothing makes a node good that was not checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hpcml.vet.model import Decision, NodeReport, Outcome, Verdict


def reasons(report: NodeReport, count_errors: Mapping[str, bool]) -> list[str]:
    """Why this node is bad; empty when it is good."""
    if not report.reachable:
        return [f"unreachable: {report.message}" if report.message else "unreachable"]
    out = []
    for r in report.results:
        if r.outcome is Outcome.FAIL:
            out.append(f"{r.check}: {r.message}" if r.message else f"{r.check}: failed")
        elif r.outcome is Outcome.ERROR and count_errors.get(r.check, True):
            out.append(f"{r.check}: error: {r.message}")
    return out


def decide(nodes: Iterable[str], reports: Mapping[str, NodeReport],
           count_errors: Mapping[str, bool], min_nodes: int | None = None) -> Verdict:
    """``min_nodes`` defaults to every node: a job that asked for N nodes needs N."""
    nodes = list(nodes)
    why = {}
    for node in nodes:
        report = reports.get(node) or NodeReport(node=node, reachable=False,
                                                 message="no result")
        r = reasons(report, count_errors)
        if r:
            why[node] = r
    bad = [n for n in nodes if n in why]
    good = [n for n in nodes if n not in why]
    need = len(nodes) if min_nodes is None else min_nodes
    if not bad:
        decision = Decision.CONTINUE
    elif good and len(good) >= need:
        decision = Decision.SHRINK
    else:
        decision = Decision.ABORT
    return Verdict(decision=decision, good=good, bad=bad, min_nodes=need, reasons=why)
