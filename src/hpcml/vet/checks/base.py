"""The interface every check implements, built-in or a user's plugin.

A check is a class with a pydantic ``Params`` model (its thresholds, already in base units
after the protocol is loaded) and a ``run`` method that measures and judges one node.
It runs in a forked child with a timeout, so it may block, crash or hang without taking
the node's worker down. Checks whose verdict depends on the other nodes (relative
thresholds, clock skew) also get ``compare``, which the launcher calls with every node's
result once they are all in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from hpcml.vet.model import CheckReport, CheckResult, NodeReport, Outcome


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class CheckContext:
    """What a check may know about where it runs."""

    node: str
    nodes: tuple[str, ...] = ()
    rank: int = 0
    workdir: str | None = None       # shared directory of this vetting run
    gpus: tuple[str, ...] = ()       # GPUs bound to this task, from Slurm
    require_gpus: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class MissingDependency(Exception):
    """Raised by a check that needs a module or library that is not installed."""


class Check:
    """Base class. Subclasses set ``type_name``, ``Params`` and implement ``run``."""

    type_name: ClassVar[str] = ""
    #: "node" checks run on every node independently; "allocation" checks run together
    #: across the nodes that passed the node checks (collectives).
    scope: ClassVar[str] = "node"
    default_timeout: ClassVar[float] = 10.0
    #: measurements (throughput) run alone, after the light checks that run side by side
    exclusive: ClassVar[bool] = False
    #: modules the worker imports before forking the check (shared by every child)
    warm_imports: ClassVar[tuple[str, ...]] = ()
    #: name of the numeric value a relative threshold compares, for the report
    Params: ClassVar[type[BaseModel]] = NoParams

    def __init__(self, params: BaseModel, ctx: CheckContext) -> None:
        self.params = params
        self.ctx = ctx

    def run(self) -> CheckReport:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def compare(cls, params: BaseModel, results: dict[str, CheckResult],
                reports: dict[str, NodeReport]) -> None:
        """Adjust results in place once all nodes reported; default: nothing to compare."""


def passed(value=None, *, threshold=None, unit=None, message="", **details) -> CheckReport:
    return CheckReport(Outcome.PASS, value, threshold, unit, message, details)


def failed(message: str, value=None, *, threshold=None, unit=None, **details) -> CheckReport:
    return CheckReport(Outcome.FAIL, value, threshold, unit, message, details)


def skipped(message: str, **details) -> CheckReport:
    return CheckReport(Outcome.SKIPPED, message=message, details=details)


def judge(ok: bool, value, *, threshold: str, unit: str | None = None, message: str = "",
          **details) -> CheckReport:
    """PASS or FAIL with the same value, threshold and unit either way."""
    return CheckReport(Outcome.PASS if ok else Outcome.FAIL, value, threshold, unit,
                       message, details)
