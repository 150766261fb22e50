"""Check types by name, imported only when used so a node's worker loads just its checks.

A new built-in check is one module under ``checks/`` and one line here. Any other ``type:``
that is a dotted path (``mysite.checks.IbPortCheck``) is a plugin: a class implementing
``hpcml.vet.checks.base.Check``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcml.vet.checks.base import Check

BUILTIN: dict[str, str] = {
    "memory": "hpcml.vet.checks.memory:MemoryCheck",
    "load": "hpcml.vet.checks.load:LoadCheck",
    "disk": "hpcml.vet.checks.disk:DiskCheck",
    "mounts": "hpcml.vet.checks.mounts:MountsCheck",
    "clock": "hpcml.vet.checks.clock:ClockCheck",
    "env": "hpcml.vet.checks.envvars:EnvCheck",
    "imports": "hpcml.vet.checks.imports:ImportsCheck",
    "processes": "hpcml.vet.checks.processes:ProcessesCheck",
    "tcp": "hpcml.vet.checks.tcp:TcpCheck",
    "gpu": "hpcml.vet.checks.gpu:GpuCheck",
    "xid": "hpcml.vet.checks.xid:XidCheck",
    "compute": "hpcml.vet.checks.compute:ComputeCheck",
    "collective": "hpcml.vet.checks.collective:CollectiveCheck",
}


class UnknownCheck(LookupError):
    pass


def resolve(type_name: str) -> str:
    """A protocol's ``type:`` -> ``module:Class``."""
    if type_name in BUILTIN:
        return BUILTIN[type_name]
    if "." in type_name and ":" not in type_name:
        module, _, cls = type_name.rpartition(".")
        return f"{module}:{cls}"
    if ":" in type_name:
        return type_name
    raise UnknownCheck(f"unknown check type '{type_name}' (built-in: {', '.join(sorted(BUILTIN))}; "
                       "or a dotted path to a Check class)")


def load(path: str) -> type[Check]:
    """Import ``module:Class`` and make sure it is a Check."""
    from hpcml.vet.checks.base import Check
    module_name, _, cls_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownCheck(f"cannot import check module '{module_name}': {exc}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise UnknownCheck(f"module '{module_name}' has no class '{cls_name}'")
    if not (isinstance(cls, type) and issubclass(cls, Check)):
        raise UnknownCheck(f"'{module_name}.{cls_name}' is not a subclass of hpcml.vet.checks.base.Check")
    return cls
