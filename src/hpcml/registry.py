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
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from hpcml.errors import HpcmlError, UsageError

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


class Registry(Generic[T]):
    """Names -> objects of one kind; ``kind`` words the errors, ``group`` is the entry-point group."""

    def __init__(self, kind: str, group: str, builtins: Mapping[str, str] | None = None, *,
                 hint: str = "") -> None:
        self.kind, self.group, self.hint = kind, group, hint
        self._entries: dict[str, str | EntryPoint | T] = dict(builtins or {})
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
        for ep in entry_points(group=self.group):
            self._entries.setdefault(ep.name, ep)

    def _entry(self, name: str) -> str | EntryPoint | T:
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
        if isinstance(entry, EntryPoint):
            return f"{entry.module}:{entry.attr}" if entry.attr else entry.module
        return f"{entry.__module__}:{getattr(entry, '__qualname__', name)}"

    def get(self, name: str) -> T:
        """The object called ``name``, imported now if it was not yet."""
        if name in self._loaded:
            return self._loaded[name]
        entry = self._entry(name)
        if isinstance(entry, str):
            obj = import_target(entry)
        elif isinstance(entry, EntryPoint):
            try:
                obj = entry.load()
            except Exception as exc:  # noqa: BLE001 - whatever a third-party import raises
                dist = f"{entry.dist.name} {entry.dist.version}" if entry.dist else "an unknown distribution"
                raise PluginError(f"{self.kind} '{name}' from {dist} cannot be loaded: entry point "
                                  f"'{entry.name} = {entry.value}' in group {self.group}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        else:
            obj = entry
        self._loaded[name] = obj
        return obj

    def rediscover(self) -> None:
        """Forget the plug-ins found so far: the next lookup looks again (after sys.path changed)."""
        self._entries = {k: v for k, v in self._entries.items() if not isinstance(v, EntryPoint)}
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
        if not isinstance(name, str):
            return False
        if name not in self._entries:
            self._discover()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.group!r})"
