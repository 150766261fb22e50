"""Vet reports as ``hpcml vet`` writes them, made by the writer itself (``hpcml.vet.report``
over ``hpcml.vet.model``'s dataclasses) and read back from its JSON: for the tests of the
writer and of its readers (the collector, the node handler), which validate every field
(``hpcml.jobmodel.VetReport``)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

#: a node's results as (check, type, outcome), or None for a node that gave none in time
Results = Sequence[tuple[str, str, str]] | None


def vet_run(nodes: Mapping[str, Results], *, started_at: float | None = None, job_id: str | None = "42",
            protocol: str = "p", **fields: Any):
    """A ``VetRun`` of ``nodes`` judged by the real verdict; ``fields`` go to every result."""
    from hpcml.vet import verdict
    from hpcml.vet.engine import VetRun
    from hpcml.vet.model import CheckResult, NodeReport, Outcome
    from hpcml.vet.protocol import EvalSpec, Protocol
    checks = {c: t for rs in nodes.values() for c, t, _ in rs or ()}
    evals = [EvalSpec(name=c, type=t, check=f"tests:{t}", scope="node", params={}, timeout=30.0)
             for c, t in checks.items()]
    reports = {n: NodeReport(node=n, reachable=rs is not None, message="" if rs is not None else "no result",
                             results=[CheckResult(node=n, check=c, type=t, outcome=Outcome(o), **fields)
                                      for c, t, o in rs or ()])
               for n, rs in nodes.items()}
    return VetRun(protocol=Protocol(name=protocol, evals=evals, source=f"{protocol}.yaml"), nodes=list(nodes),
                  reports=reports, verdict=verdict.decide(list(nodes), reports, {}),
                  started_at=time.time() if started_at is None else started_at, duration=1.5, job_id=job_id,
                  launcher="srun")


def vet_report(nodes: Mapping[str, Results], **kwargs: Any) -> dict[str, Any]:
    """report.json of ``vet_run(nodes, **kwargs)``, as a reader loads it."""
    from hpcml.vet import report
    return json.loads(report.dumps(report.to_json(vet_run(nodes, **kwargs))))
