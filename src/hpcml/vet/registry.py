"""Check types by name, imported only when used so a node's worker loads just its checks.

A new built-in check is one module under ``checks/`` and one line in ``BUILTIN``. A site
package adds one through the ``hpcml.checks`` entry-point group (``hpcml.registry``). Any
other ``type:`` that is a dotted path (``mysite.checks.IbPortCheck``) is a plugin too: a
class implementing ``hpcml.vet.checks.base.Check``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcml.registry import Registry, UnknownName, import_target

if TYPE_CHECKING:
    from hpcml.vet.checks.base import Check

#: the one place a built-in check's name is declared
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

CHECKS: Registry[type[Check[Any]]] = Registry("check type", "hpcml.checks", BUILTIN,
                                              hint="or a dotted path to a Check class")

#: kept for callers that catch it by this name
UnknownCheck = UnknownName


def resolve(type_name: str) -> str:
    """A protocol's ``type:`` -> ``module:Class``: what the workers import, without a lookup."""
    if ":" in type_name:
        return type_name
    if "." in type_name and type_name not in CHECKS:
        module, _, cls = type_name.rpartition(".")
        return f"{module}:{cls}"
    return CHECKS.target(type_name)


def check_class(type_name: str) -> type[Check[Any]]:
    """The class a protocol's ``type:`` names: a registered name (a site package's entry point
    that fails to import is a ``PluginError`` naming it) or a dotted path."""
    if type_name not in CHECKS and ("." in type_name or ":" in type_name):
        return load(resolve(type_name))
    try:
        cls = CHECKS.get(type_name)
    except ImportError as exc:
        raise UnknownCheck(f"cannot import check type '{type_name}': {exc}") from None
    return _a_check(cls, CHECKS.target(type_name))


def load(path: str) -> type[Check[Any]]:
    """Import ``module:Class`` (``hpcml.registry.import_target``) and make sure it is a Check."""
    module_name, _, cls_name = path.partition(":")
    try:
        cls = import_target(path)
    except ImportError as exc:
        raise UnknownCheck(f"cannot import check module '{module_name}': {exc}") from None
    except AttributeError:
        raise UnknownCheck(f"module '{module_name}' has no class '{cls_name}'") from None
    return _a_check(cls, path)


def _a_check(cls: object, path: str) -> type[Check[Any]]:
    from hpcml.vet.checks.base import Check
    if not (isinstance(cls, type) and issubclass(cls, Check)):
        raise UnknownCheck(f"'{path.replace(':', '.')}' is not a subclass of hpcml.vet.checks.base.Check")
    return cls
