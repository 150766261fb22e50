"""Vetting protocols: YAML in, a validated, fully resolved ``Protocol`` out.

Validation happens here, once, on the launching node: unknown types, wrong units and
misspelt keys end the command with one line naming the file, key and line before any node
runs a check. Each eval's parameters are then stored in base units (bytes, seconds, B/s)
so the workers on the nodes only re-read plain numbers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hpcml.errors import UsageError
from hpcml.files import ConfigLoader, line_map, load_yaml_with_nodes, read_config
from hpcml.units import parse_fraction, parse_seconds
from hpcml.vet import registry, vetnode_compat

COMMON_KEYS = {"name", "type", "timeout", "severity", "count_errors", "requirements",
               "min_relative", "max_relative", "description", "fast"}
TOP_KEYS = {"name", "description", "evals", "min_nodes", "deadline", "require_gpus",
            "scheduler", "pip"}
DEFAULT_DEADLINE = 300.0


_VAR = re.compile(r"\$(?:\{(\w+)[^}]*\}|(\w+))")
#: a check's name: it names files and folders under the work directory (``culprit-NAME``),
#: so no '/', no '..', no leading dot; spaces inside, as vetnode's files have ("Check GPU")
_NAME = re.compile(r"[A-Za-z0-9_-](?:[A-Za-z0-9._ -]*[A-Za-z0-9._-])?")


def positive_seconds(value: Any) -> float:
    """``parse_seconds``, and finite and above 0: ``.inf`` would overflow a wait, ``.nan``
    compare false with every clock, 0 end a check before it starts."""
    import math
    seconds = parse_seconds(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"expected a duration above 0 and finite, found {value!r}")
    return seconds


@dataclass
class EvalSpec:
    """One eval of a protocol, resolved: what to run, where, and how to judge it."""

    name: str
    type: str
    check: str                       # "module:Class"
    scope: str                       # "node" or "allocation"
    params: dict[str, Any]
    timeout: float
    severity: str = "fail"           # "fail" or "warn"
    count_errors: bool = True
    requirements: list[list[str]] = field(default_factory=list)
    min_relative: float | None = None
    max_relative: float | None = None
    exclusive: bool = False
    line: int | None = None
    fast: bool | None = None         # runs in `hpcml vet --prolog`; None: the type's default

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Protocol:
    name: str
    evals: list[EvalSpec]
    source: str
    min_nodes: int | None = None
    deadline: float = DEFAULT_DEADLINE
    require_gpus: bool = False
    index_url: str | None = None
    vetnode: bool = False

    def unset_variables(self, env: Mapping[str, str] | None = None) -> None:
        """Refuse a ``$VAR`` / ``${VAR}`` in a check's parameters that is not set here (the
        nodes get this environment through srun): a UsageError naming the file, line, key
        and variable, before anything runs, instead of a failed check on every node."""
        env = os.environ if env is None else env

        def walk(value: Any, path: str):
            if isinstance(value, str):
                for m in _VAR.finditer(value):
                    name = m.group(1) or m.group(2)
                    if name not in env:
                        yield path, name, value
            elif isinstance(value, dict):
                for k, v in value.items():
                    yield from walk(v, f"{path}.{k}")
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    yield from walk(v, f"{path}.{i}")
        for ev in self.evals:
            for path, name, text in walk(ev.params, f"evals.{ev.name}"):
                where = f" (line {ev.line})" if ev.line else ""
                raise UsageError(f"{text!r} uses ${name}, which is not set here{where}; set it or write the path",
                                 file=self.source, key=path)

    def requirements(self) -> list[list[str]]:
        seen, out = set(), []
        for ev in self.evals:
            for req in ev.requirements:
                if tuple(req) not in seen:
                    seen.add(tuple(req))
                    out.append(req)
        return out


def _requirements(raw: Any) -> list[list[str]]:
    """vetnode's ``[pkg, [pkg, --index-url, url]]`` -> a list of pip argument lists."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("expected a list of pip requirements")
    out = []
    for item in raw:
        if isinstance(item, str):
            out.append([item])
        elif isinstance(item, list) and item and all(isinstance(x, str) for x in item):
            out.append(list(item))
        else:
            raise ValueError(f"expected a requirement string or a list of pip arguments, found {item!r}")
    return out


def _project(req: list[str]) -> str:
    return re.split(r"[<>=!~\[; ]", req[0], maxsplit=1)[0].lower().replace("_", "-")


def _eval(ld: ConfigLoader, i: int, raw: Any, require_gpus: bool) -> EvalSpec:
    path = ("evals", i)
    if not isinstance(raw, dict):
        raise ld.error(path, f"expected a mapping with name and type, found {type(raw).__name__}")
    for key in ("name", "type"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ld.error((*path, key), "missing or not a string")
    if not _NAME.fullmatch(raw["name"]):
        raise ld.error((*path, "name"), f"expected letters, digits, '.', '_', '-' or inner spaces (not first a '.'), "
                       f"found {raw['name']!r}")
    for key in raw:
        if not isinstance(key, str):          # `1: 2` would reach model(**fields) as a TypeError
            raise ld.error((*path, key), f"expected a key that is a string, found {key!r}")
    fields = {k: v for k, v in raw.items() if k not in COMMON_KEYS}
    type_name = raw["type"]
    needs: tuple[str, ...] = ()
    try:
        if vetnode_compat.is_vetnode(type_name):
            type_name, fields, needs = vetnode_compat.translate(type_name, fields)
        cls = registry.check_class(type_name)
    except vetnode_compat.FieldError as exc:
        raise ld.error((*path, exc.key), str(exc)) from None
    except (LookupError, ValueError, TypeError) as exc:
        raise ld.error((*path, "type"), str(exc)) from None
    try:
        model = cls.Params
    except (ImportError, AttributeError) as exc:   # a plugin naming a model it lacks
        raise ld.error((*path, "type"), f"{type_name}: its parameters' model "
                       f"{cls.params_module}.{cls.params_name} cannot be loaded: {exc}") from None
    try:
        params = model(**fields)
    except TypeError as exc:                   # a plugin's model that takes no such keywords
        raise ld.error(path, f"{type_name}: its parameters cannot be made: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        found = f" (found {err['input']!r})" if err["type"] != "missing" and "input" in err \
            and not isinstance(err["input"], dict) else ""
        problem = "unknown key for this check type" if err["type"] == "extra_forbidden" \
            else err["msg"].removeprefix("Value error, ") + found
        raise ld.error((*path, *loc), problem) from None
    try:
        reqs = _requirements(raw.get("requirements"))
    except ValueError as exc:
        raise ld.error((*path, "requirements"), str(exc)) from None
    if needs:  # vetnode named what its own implementation needed; keep what ours needs
        reqs = [r for r in reqs if _project(r) in needs]
        reqs += [[n] for n in needs if n not in {_project(r) for r in reqs}]
    severity = raw.get("severity", "fail")
    if severity not in ("fail", "warn"):
        raise ld.error((*path, "severity"), f"expected 'fail' or 'warn', found {severity!r}")
    count_errors = raw.get("count_errors", True)
    if not isinstance(count_errors, bool):
        raise ld.error((*path, "count_errors"), f"expected true or false, found {count_errors!r}")
    fast = raw.get("fast")
    if fast is not None and not isinstance(fast, bool):
        raise ld.error((*path, "fast"), f"expected true or false, found {fast!r}")
    timeout = ld.convert((*path, "timeout"), raw["timeout"], positive_seconds) \
        if "timeout" in raw else cls.default_timeout
    rel = {k: ld.convert((*path, k), raw[k], parse_fraction) if k in raw else None
           for k in ("min_relative", "max_relative")}
    return EvalSpec(name=raw["name"], type=type_name, check=registry.resolve(type_name),
                    scope=cls.scope, params=params.model_dump(mode="json"), timeout=timeout,
                    severity=severity, count_errors=count_errors, requirements=reqs,
                    exclusive=cls.exclusive, line=ld.lines.get(path), fast=fast, **rel)


def load(path: str | Path) -> Protocol:
    """Read and validate a protocol file; raise ``UsageError`` on the first problem."""
    return loads(read_config(path), str(path))


def loads(text: str, source: str = "<protocol>") -> Protocol:
    data, node = load_yaml_with_nodes(text, source)
    ld = ConfigLoader(source, line_map(node) if node is not None else {})
    if not isinstance(data, dict):
        raise ld.error((), "expected a mapping with 'name' and 'evals' at the top")
    for key in data:
        if key not in TOP_KEYS:
            raise ld.error((key,), f"unknown key (expected one of {', '.join(sorted(TOP_KEYS))})")
    if not isinstance(data.get("name"), str):
        raise ld.error(("name",), "missing or not a string")
    evals = data.get("evals")
    if not isinstance(evals, list) or not evals:
        raise ld.error(("evals",), "expected a non-empty list of checks")
    require_gpus = data.get("require_gpus", False)
    if not isinstance(require_gpus, bool):
        raise ld.error(("require_gpus",), f"expected true or false, found {require_gpus!r}")
    min_nodes = data.get("min_nodes")
    if min_nodes is not None and (not isinstance(min_nodes, int) or isinstance(min_nodes, bool)
                                  or min_nodes < 1):
        raise ld.error(("min_nodes",), f"expected a whole number >= 1, found {min_nodes!r}")
    pip = data.get("pip") or {}
    if not isinstance(pip, dict) or set(pip) - {"index_url"}:
        raise ld.error(("pip",), "expected a mapping with only 'index_url'")
    if data.get("scheduler", "slurm") not in ("slurm", "standalone"):
        raise ld.error(("scheduler",), f"expected 'slurm' or 'standalone', found {data['scheduler']!r}")
    specs = [_eval(ld, i, raw, require_gpus) for i, raw in enumerate(evals)]
    names = [s.name for s in specs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ld.error(("evals", i, "name"), f"duplicate check name '{name}'")
    deadline = ld.convert(("deadline",), data["deadline"], positive_seconds) \
        if "deadline" in data else DEFAULT_DEADLINE
    return Protocol(name=data["name"], evals=specs, source=source, min_nodes=min_nodes,
                    deadline=deadline, require_gpus=require_gpus, index_url=pip.get("index_url"),
                    vetnode=any(vetnode_compat.is_vetnode(str(e.get("type", ""))) for e in evals
                                if isinstance(e, dict)))

