"""The interface every check implements, built-in or a user's plugin.

A check is a class with a pydantic ``Params`` model (its thresholds, already in base units
after the protocol is loaded) and a ``run`` method that measures and judges one node:
``class DiskCheck(Check[DiskParams])``, so ``self.params`` has the check's own type. A
check may name its model as a string instead (``Check["DiskParams"]``, imported under
``TYPE_CHECKING``) that lives in ``params_module``: the launcher validates the protocol
with it, and the node's worker, which never imports the model (nor pydantic: ~0.1-0.2 s of
CPU on every node), hands the check the validated values as plain attributes. The
built-in host checks do this (``hpcml.vet.checks.params``). Its
name is declared once, in ``hpcml.vet.registry`` (or a site package's ``hpcml.checks``
entry point). It runs in a forked child with a timeout, so it may block, crash or hang without taking
the node's worker down. Checks whose verdict depends on the other nodes (relative
thresholds, clock skew) also get ``compare``, which the launcher calls with every node's
result once they are all in.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar, ForwardRef, Generic, TypeVar, get_args, get_origin

from hpcml.errors import HpcmlError
from hpcml.vet.model import CheckReport, CheckResult, NodeReport, Outcome

if TYPE_CHECKING:
    from pydantic import BaseModel


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


P = TypeVar("P", bound="BaseModel")


class _DeferredParams:
    """``Check.Params`` of a check that names its model as a string: imported from the
    check's ``params_module`` on first use (the launcher's), then kept on the class."""

    def __get__(self, obj: object, owner: type[Check[Any]]) -> type[BaseModel]:
        model = getattr(importlib.import_module(owner.params_module), owner.params_name)
        if owner is not Check:   # Check's own NoParams must not become every subclass's
            owner.Params = model
        return model


class Check(Generic[P]):
    """Base class. Subclasses name their params model as the type argument
    (``Check[MyParams]``), which also sets ``Params``, and implement ``run``."""

    #: "node" checks run on every node independently; "allocation" checks run together
    #: across the nodes that passed the node checks (collectives).
    scope: ClassVar[str] = "node"
    default_timeout: ClassVar[float] = 10.0
    #: measurements (throughput) run alone, after the light checks that run side by side
    exclusive: ClassVar[bool] = False
    #: run in the worker itself, not a forked child: only for checks that read a few
    #: values from the kernel or the environment and cannot block or crash (a fork costs
    #: each node a few ms of CPU per check)
    inline: ClassVar[bool] = False
    #: modules the worker imports before forking the check (shared by every child)
    warm_imports: ClassVar[tuple[str, ...]] = ()
    #: the parameters' model, which validates the protocol's fields: the type argument of
    #: ``Check[...]`` unless the class sets it (a ClassVar cannot be generic)
    if TYPE_CHECKING:
        Params: ClassVar[type[BaseModel]]
    else:
        Params = _DeferredParams()
    #: where a model named by a string type argument lives, and its name there
    params_module: ClassVar[str] = "hpcml.vet.checks.params"
    params_name: ClassVar[str] = "NoParams"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a subclass with its own run is not known to be harmless: it forks, unless it says
        if "run" in cls.__dict__ and "inline" not in cls.__dict__:
            cls.inline = False
        if "Params" in cls.__dict__:
            return
        deferred = "params_name" in cls.__dict__ or "params_module" in cls.__dict__
        # only this class's own bases: inherited __orig_bases__ are the parent's business
        for base in cls.__dict__.get("__orig_bases__", ()):
            args = get_args(base)
            if get_origin(base) is not Check or not args:
                continue
            if isinstance(args[0], ForwardRef):
                if "params_name" not in cls.__dict__:
                    cls.params_name = args[0].__forward_arg__
                deferred = True
            elif isinstance(args[0], type):
                cls.Params = args[0]
                return
        if deferred:   # resolved from this class's own params_module/params_name
            cls.Params = _DeferredParams()  # type: ignore[assignment]

    @classmethod
    def worker_params(cls, values: dict[str, Any]) -> Any:
        """What a node's worker passes the check for ``values`` the launcher validated: the
        model itself when the check's module already has it, else the values as attributes
        (no pydantic on the node)."""
        if isinstance(inspect.getattr_static(cls, "Params"), _DeferredParams):
            return SimpleNamespace(**values)
        return cls.Params(**values)

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


def __getattr__(name: str) -> object:
    """``NoParams``, where site plugins written before it moved import it: loaded (with
    pydantic) only when asked for."""
    if name == "NoParams":
        from hpcml.vet.checks.params import NoParams
        return NoParams
    raise AttributeError(f"module 'hpcml.vet.checks.base' has no attribute {name!r}")
