"""The interface every check implements, built-in or a user's plugin.

A check is a class with a pydantic ``Params`` model (its thresholds, already in base units
after the protocol is loaded) and a ``run`` method that measures and judges one node:
``class DiskCheck(Check[DiskParams])``, so ``self.params`` has the check's own type. Its
name is declared once, in ``hpcml.vet.registry`` (or a site package's ``hpcml.checks``
entry point). It runs in a forked child with a timeout, so it may block, crash or hang without taking
the node's worker down. Checks whose verdict depends on the other nodes (relative
thresholds, clock skew) also get ``compare``, which the launcher calls with every node's
result once they are all in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict

from hpcml.errors import HpcmlError
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


class MissingDependency(HpcmlError):
    """Raised by a check that needs a module or library that is not installed (exit 1)."""


P = TypeVar("P", bound=BaseModel)


class Check(Generic[P]):
    """Base class. Subclasses name their params model as the type argument
    (``Check[MyParams]``), which also sets ``Params``, and implement ``run``."""

    #: "node" checks run on every node independently; "allocation" checks run together
    #: across the nodes that passed the node checks (collectives).
    scope: ClassVar[str] = "node"
    default_timeout: ClassVar[float] = 10.0
    #: measurements (throughput) run alone, after the light checks that run side by side
    exclusive: ClassVar[bool] = False
    #: modules the worker imports before forking the check (shared by every child)
    warm_imports: ClassVar[tuple[str, ...]] = ()
    #: the parameters' model, which validates the protocol's fields: the type argument of
    #: ``Check[...]`` unless the class sets it (a ClassVar cannot be generic)
    Params: ClassVar[type[BaseModel]] = NoParams

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Params" in cls.__dict__:
            return
        for base in getattr(cls, "__orig_bases__", ()):
            args = get_args(base)
            if get_origin(base) is Check and args and isinstance(args[0], type) \
                    and issubclass(args[0], BaseModel):
                cls.Params = args[0]

    def __init__(self, params: P, ctx: CheckContext) -> None:
        self.params: P = params
        self.ctx = ctx

    def run(self) -> CheckReport:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def compare(cls, params: P, results: dict[str, CheckResult],
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
