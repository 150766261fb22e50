"""Pluggable parts by name: checks, runtimes, scan formats, importers, samplers, stores.

A ``Registry`` maps a name to an object (a class, a function, a module). Built-ins are
declared once, as ``"module:attr"`` strings, and imported on first ``get``: a vet worker
on a node imports only the checks it runs. A site package adds its own through a Python
entry point in the registry's group, discovered the first time an unknown name is looked
up (or every name is listed)::

    [project.entry-points."hpcml.checks"]
    ib_port = "mysite.checks:IbPortCheck"

A plug-in cannot replace a built-in: on a clash the built-in wins.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from hpcml.errors import HpcmlError, UsageError

if TYPE_CHECKING:   # importlib.metadata costs a node's worker ~40 ms: imported when discovering
    from importlib.metadata import EntryPoint

T = TypeVar("T")


class UnknownName(UsageError, LookupError):
    """A name no registry entry has (a bad ``type:`` or ``--runtime``): exit 2."""


class PluginError(HpcmlError, LookupError):
    """An entry point of a site package that cannot be imported; names the package."""


def import_target(target: str) -> Any:
    """``"package.module:attr"`` (or ``"package.module"``) -> the object."""
    module_name, _, attr = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class _Plugin:
    ep: EntryPoint


class Registry(Generic[T]):
    """Names -> objects of one kind; ``kind`` words the errors, ``group`` is the entry-point group."""

    def __init__(self, kind: str, group: str, builtins: Mapping[str, str] | None = None, *,
                 hint: str = "") -> None:
        self.kind, self.group, self.hint = kind, group, hint
        self._entries: dict[str, str | _Plugin | T] = dict(builtins or {})
        self._loaded: dict[str, T] = {}
        self._discovered = False

    def add(self, name: str, target: str | T) -> None:
        """Register ``target``: a lazy ``"module:attr"`` string, or the object itself."""
        self._entries[name] = target
        self._loaded.pop(name, None)

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        from importlib.metadata import entry_points
        for ep in entry_points(group=self.group):
            self._entries.setdefault(ep.name, _Plugin(ep))

    def _entry(self, name: str) -> str | _Plugin | T:
        if name not in self._entries:
            self._discover()
        try:
            return self._entries[name]
        except KeyError:
            hint = f"; {self.hint}" if self.hint else ""
            raise UnknownName(f"unknown {self.kind} '{name}' (known: {', '.join(self.names()) or 'none'}"
                              f"{hint})") from None

    def target(self, name: str) -> str:
        """Where ``name`` lives, as ``"module:attr"``, without importing it."""
        entry = self._entry(name)
        if isinstance(entry, str):
            return entry
        if isinstance(entry, _Plugin):
            ep = entry.ep
            return f"{ep.module}:{ep.attr}" if ep.attr else ep.module
        return f"{entry.__module__}:{getattr(entry, '__qualname__', name)}"

    def get(self, name: str) -> T:
        """The object called ``name``, imported now if it was not yet."""
        if name in self._loaded:
            return self._loaded[name]
        entry = self._entry(name)
        if isinstance(entry, str):
            obj = import_target(entry)
        elif isinstance(entry, _Plugin):
            ep = entry.ep
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001 - whatever a third-party import raises
                dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "an unknown distribution"
                raise PluginError(f"{self.kind} '{name}' from {dist} cannot be loaded: entry point "
                                  f"'{ep.name} = {ep.value}' in group {self.group}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        else:
            obj = entry
        self._loaded[name] = obj
        return obj

    def rediscover(self) -> None:
        """Forget the plug-ins found so far: the next lookup looks again (after sys.path changed)."""
        self._entries = {k: v for k, v in self._entries.items() if not isinstance(v, _Plugin)}
        self._loaded = {k: v for k, v in self._loaded.items() if k in self._entries}
        self._discovered = False

    def names(self) -> list[str]:
        """Every name, built-ins first in declaration order, then plug-ins."""
        self._discover()
        return list(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        """``(name, object)`` for every name, importing each."""
        return ((name, self.get(name)) for name in self.names())

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in self._entries:
            self._discover()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
