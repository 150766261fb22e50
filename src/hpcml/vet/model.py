"""The data of a vetting run: outcomes, per-check results, node reports, the verdict.

Plain dataclasses with ``to_dict`` / ``from_dict`` so results cross srun's stdout as JSON
and the worker on each node needs no heavy imports (no pydantic). The report's document is
defined once, in ``hpcml.jobmodel`` (``VetReport``: its ``VetResult`` and ``VetNode`` are
what ``to_dict`` writes); ``tests/vet/test_report_model.py`` holds the fields here to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, Union

#: a JSON value: what a check's ``details`` hold (they cross srun's stdout as JSON). Read-only
#: containers, so that a ``list[str]`` or ``dict[str, float]`` is one (``list`` is invariant)
Json = Union[str, int, float, bool, None, Sequence["Json"], Mapping[str, "Json"]]


class Outcome(str, Enum):
    """What a check found. ``error`` means the check itself broke; never a pass."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"
    SKIPPED = "skipped"


class Decision(str, Enum):
    CONTINUE = "continue"
    SHRINK = "shrink"
    ABORT = "abort"


EXIT_CODES = {Decision.CONTINUE: 0, Decision.SHRINK: 3, Decision.ABORT: 4}


@dataclass
class CheckReport:
    """What a check's ``run`` returns: its outcome and the number behind it."""

    outcome: Outcome
    value: float | int | str | None = None
    threshold: str | None = None
    unit: str | None = None
    message: str = ""
    details: dict[str, Json] = field(default_factory=dict)


@dataclass
class CheckResult:
    """One check on one node, as reported and judged."""

    node: str
    check: str
    type: str
    outcome: Outcome
    value: float | int | str | None = None
    threshold: str | None = None
    unit: str | None = None
    duration: float = 0.0
    message: str = ""
    details: dict[str, Json] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Json]:
        # by hand, not dataclasses.asdict: that deep-copies and is 10x slower at 100k results
        return {"node": self.node, "check": self.check, "type": self.type,
                "outcome": self.outcome.value, "value": self.value, "threshold": self.threshold,
                "unit": self.unit, "duration": self.duration, "message": self.message,
                "details": self.details}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckResult:
        d = dict(d)
        d["outcome"] = Outcome(d["outcome"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class NodeReport:
    """Every result of one node; ``reachable`` is false when no result came back in time."""

    node: str
    results: list[CheckResult] = field(default_factory=list)
    reachable: bool = True
    message: str = ""
    sent_at: float | None = None
    received_at: float | None = None
    #: a TCP port the worker found free on its node (``hpcml run``'s rendezvous when the
    #: node is rank 0's); not part of the report
    free_port: int | None = None

    def to_dict(self) -> dict[str, Json]:
        return {"node": self.node, "reachable": self.reachable, "message": self.message,
                "sent_at": self.sent_at, "results": [r.to_dict() for r in self.results]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeReport:
        return cls(node=d["node"], reachable=d.get("reachable", True),
                   message=d.get("message", ""), sent_at=d.get("sent_at"),
                   results=[CheckResult.from_dict(r) for r in d.get("results", [])])


@dataclass
class Verdict:
    decision: Decision
    good: list[str]
    bad: list[str]
    min_nodes: int
    reasons: dict[str, list[str]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision]

    # sets: srun orders a step's nodes itself (slurm.conf's order), whatever order it is given
    @cached_property
    def good_hostlist(self) -> str:
        from hpcml.cluster.hostlist import fold
        return fold(self.good, sort=True)

    @cached_property
    def bad_hostlist(self) -> str:
        from hpcml.cluster.hostlist import fold
        return fold(self.bad, sort=True)
