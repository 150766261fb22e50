"""Environment Definition Files (CSCS Container Engine TOML) -> ``Environment``.

Rules follow the CSCS EDF reference (see notes/containers.md (a)): bases applied in order,
parents first, at most 10 levels; scalars override, ``mounts``/``env``/``devices`` accumulate,
annotations merge key by key; ``./`` paths are relative to the caller's directory, not the
EDF's. Strings are expanded against the *caller's* environment, except ``[env]`` values
that reference variables: CSCS resolves those against the container's (the image's
variables over the host's), so they are kept as written (``Environment.env_template``) and
expanded by the in-container wrapper; an undefined one is a warning here and an error at
start when the image does not define it either. A mount ``PATH`` alone is pyxis's short
form, ``PATH:PATH``. A mount whose destination a later mount (a later base, or this file)
also takes is dropped: the later one would cover it, so the launch does not mount both.

Choices where the reference is silent: a base reached twice (diamond) is applied once, at
its first place; an ``[env]`` value written as ``""`` unsets the variable, while one that
only *expands* to ``""`` sets it empty; duplicate devices are dropped. An unknown
top-level key is an error naming the nearest valid key (``lenient``: a warning, returned
in ``Resolved.warnings``, a list the CLI prints; nothing goes through ``warnings``).
Refused, though TOML allows them: a NUL character in any string (no argument or
environment variable can carry one) and an image starting with ``-`` (every runtime
would read it as an option).

``engine`` says whose defaults and limits apply: ``ce`` (the production Container Engine,
pyxis-based: no entrypoint by default, short-form mounts and image paths allowed) or
``sarus-suite`` (its successor on podman: ``sarusctl render`` runs the entrypoint by
default, and mount destinations and registry images are required).

Types are checked explicitly rather than with pydantic: the error must carry file, key
and line, and it is one short line per case.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml.env.expand import ExpansionError, expand, is_variable_name, references
from hpcml.env.model import Environment, image_problem
from hpcml.env.mounts import MountError, is_relative_path, parse_mount, resolve_path
from hpcml.errors import UsageError
from hpcml.files import load_toml, read_config, unknown_key
from hpcml.schemas import tag

MAX_DEPTH = 10
#: engine -> entrypoint default (CSCS's EDF reference; Sarus Suite's ``sarusctl render``)
ENGINES = {"ce": False, "sarus-suite": True}
KNOWN_KEYS = ("base_environment", "image", "workdir", "entrypoint", "writable", "mounts",
              "devices", "env", "annotations")


@dataclass
class Resolved:
    env: Environment
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        e = self.env
        return {"schema": tag("env.edf", 1), "file": str(e.file) if e.file else None,
                "chain": [str(p) for p in e.chain], "image": e.image, "workdir": e.workdir, "entrypoint": e.entrypoint,
                "writable": e.writable,
                "mounts": [{"source": m.source, "target": m.target, "flags": list(m.flags)}
                           for m in e.mounts],
                "devices": list(e.devices), "env": dict(e.env), "env_template": dict(e.env_template),
                "annotations": dict(e.annotations),
                "origin": dict(e.origin), "warnings": list(self.warnings)}


# ---------------------------------------------------------------- finding files

def _search_dirs(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(absolute directories to search, ignored relative EDF_PATH entries)."""
    edf_path = environ.get("EDF_PATH")
    if edf_path:
        entries = [d for d in edf_path.split(":") if d]
        return [d for d in entries if d.startswith("/")], [d for d in entries if not d.startswith("/")]
    home = environ.get("HOME") or os.path.expanduser("~")
    return [os.path.join(home, ".edf")], []


def find_edf(name_or_path: str, env: Mapping[str, str] | None = None, cwd: str | None = None) -> Path:
    """An EDF by absolute path, by path relative to ``cwd``, or by name on EDF_PATH / ~/.edf."""
    environ = os.environ if env is None else env
    cwd = os.getcwd() if cwd is None else cwd
    if not name_or_path:
        raise UsageError("empty EDF name")
    if "/" in name_or_path or name_or_path in (".", ".."):
        path = os.path.normpath(os.path.join(cwd, name_or_path))
        if not os.path.isfile(path):
            raise UsageError(f"EDF not found: {path} is not a file", file=name_or_path)
        return Path(path)
    filename = name_or_path if name_or_path.endswith(".toml") else name_or_path + ".toml"
    dirs, ignored = _search_dirs(environ)
    for d in dirs:
        candidate = os.path.join(d, filename)
        if os.path.isfile(candidate):
            return Path(os.path.normpath(candidate))
    where = "EDF_PATH" if environ.get("EDF_PATH") else "~/.edf (EDF_PATH is unset)"
    looked = ", ".join(os.path.join(d, filename) for d in dirs) or "nowhere"
    extra = f"; ignored relative EDF_PATH entries {', '.join(ignored)}" if ignored else ""
    for here in dict.fromkeys((name_or_path, filename)):
        if os.path.isfile(os.path.join(cwd, here)):     # a bare name is a name, as with CSCS's EDFs
            extra += f"; the file in this directory is ./{here} (a path needs a '/')"
            break
    raise UsageError(f"EDF {name_or_path!r} not found on {where}: looked for {looked}{extra}",
                     file=name_or_path)


# ---------------------------------------------------------------- reading files

@dataclass
class _File:
    path: Path
    text: str
    data: dict[str, Any]

    def line_of(self, key: str, raw: str | None = None) -> int | None:
        """Best-effort line of ``key`` (or of the quoted ``raw`` value) for error messages."""
        lines = self.text.splitlines()
        if raw is not None:
            for i, line in enumerate(lines, 1):
                if f'"{raw}"' in line or f"'{raw}'" in line:
                    return i
        top, _, rest = key.partition(".")
        top = top.split("[")[0]
        names = [rest, rest.rsplit(".", 1)[-1]] if rest else [top]
        for name in names:
            pattern = re.compile(r"^\s*[\"']?" + re.escape(name) + r"[\"']?\s*=")
            for i, line in enumerate(lines, 1):
                if pattern.match(line):
                    return i
        return None

    def error(self, problem: str, key: str, raw: str | None = None) -> UsageError:
        return UsageError(problem, file=str(self.path), key=key, line=self.line_of(key, raw))


def _read(path: Path) -> _File:
    text = read_config(path, what="the EDF")
    data = load_toml(text, str(path))
    return _File(path, text, data)


# ---------------------------------------------------------------- inheritance

def _bases(f: _File, environ: Mapping[str, str]) -> list[str]:
    value = f.data.get("base_environment", [])
    if isinstance(value, str):
        value = [value] if value else []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise f.error(f"expected a string or an array of strings, found {_kind(value)}", "base_environment")
    out = []
    for raw in value:
        _no_nul(f, "base_environment", raw)
        try:
            out.append(expand(raw, environ))
        except ExpansionError as exc:
            raise f.error(str(exc), "base_environment", raw) from None
    return [b for b in out if b]


def _collect(path: Path, environ: Mapping[str, str], cwd: str, stack: list[Path],
             order: list[_File], seen: set[str]) -> None:
    """Depth-first: each file's bases (in order) before the file itself."""
    f = _read(path)
    stack = stack + [path]
    for base in _bases(f, environ):
        try:
            base_path = find_edf(base, environ, cwd)
        except UsageError as exc:
            raise f.error(f"base environment {base!r}: {exc.problem}", "base_environment", base) from None
        real = os.path.realpath(base_path)
        in_stack = [os.path.realpath(p) for p in stack]
        if real in in_stack:
            cycle = [str(p) for p in stack[in_stack.index(real):]] + [str(base_path)]
            raise f.error("cyclic base_environment: " + " -> ".join(cycle), "base_environment", base)
        if len(stack) > MAX_DEPTH:
            raise f.error(f"more than {MAX_DEPTH} levels of base_environment: "
                          + " -> ".join(str(p) for p in stack + [base_path]), "base_environment", base)
        if real not in seen:
            _collect(base_path, environ, cwd, stack, order, seen)
    seen.add(os.path.realpath(path))
    order.append(f)


# ---------------------------------------------------------------- one file onto the result

def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _no_nul(f: _File, key: str, value: str) -> None:
    """A NUL character fits in TOML (``\\u0000``) but in no argument or environment variable
    of the launch: refused here, not as a traceback when the runtime starts."""
    if "\0" in value:
        raise f.error("contains a NUL character (\\u0000), which no command argument or "
                      "environment variable can hold", key)


def _string(f: _File, key: str, value: Any, environ: Mapping[str, str]) -> str:
    if not isinstance(value, str):
        raise f.error(f"expected a string, found {_kind(value)}", key)
    _no_nul(f, key, value)
    try:
        return expand(value, environ)
    except ExpansionError as exc:
        raise f.error(str(exc), key, value) from None


def _strings(f: _File, key: str, value: Any) -> list[str]:
    if not isinstance(value, list):
        raise f.error(f"expected an array of strings, found {_kind(value)}", key)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise f.error(f"expected a string, found {_kind(item)}", f"{key}[{i}]")
    return value


def _flatten(f: _File, table: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for k, v in table.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            _flatten(f, v, name, out)
        else:
            out[name] = v


def _unknown_keys(f: _File, warnings: list[str], lenient: bool) -> None:
    """A misspelt key (``mount`` for ``mounts``) would let the job run without what it
    names: an error with the nearest valid key, or a warning when ``lenient``."""
    for key in f.data:
        if key in KNOWN_KEYS:
            continue
        problem = unknown_key(key, KNOWN_KEYS)
        if not lenient:
            raise UsageError(f"{problem} (--lenient or HPCML_EDF_LENIENT=1 only warns)",
                             file=str(f.path), line=f.line_of(key), key=key)
        line = f.line_of(key)
        warnings.append(f"{f.path}{':' + str(line) if line else ''}: key '{key}': {problem}, ignored")


def _apply(f: _File, e: Environment, environ: Mapping[str, str], cwd: str, warnings: list[str],
           mount_origins: list[str], engine: str) -> None:
    data, src = f.data, str(f.path)
    if "image" in data:
        e.image = resolve_path(_string(f, "image", data["image"], environ), cwd)
        e.origin["image"] = src
        problem = image_problem(e.image)
        if problem:
            raise f.error(problem, "image")
    if "workdir" in data:
        e.workdir = _string(f, "workdir", data["workdir"], environ)
        e.origin["workdir"] = src
    for key in ("entrypoint", "writable"):
        if key in data:
            if not isinstance(data[key], bool):
                raise f.error(f"expected true or false, found {_kind(data[key])}", key)
            setattr(e, key, data[key])
            e.origin[key] = src
    if "mounts" in data:
        _mounts(f, e, environ, cwd, mount_origins, engine)
    if "devices" in data:
        for i, raw in enumerate(_strings(f, "devices", data["devices"])):
            device = _string(f, f"devices[{i}]", raw, environ)
            if device and device not in e.devices:
                e.origin[f"devices[{len(e.devices)}]"] = src
                e.devices.append(device)
    if "env" in data:
        if not isinstance(data["env"], dict):
            raise f.error(f"expected a table, found {_kind(data['env'])}", "env")
        for name, raw in data["env"].items():
            key = f"env.{name}"
            _check_name(f, name)
            e.env_template.pop(name, None)
            e.env[name] = None if raw == "" else _env_value(f, key, raw, environ, e, warnings)
            e.origin[key] = src
    if "annotations" in data:
        if not isinstance(data["annotations"], dict):
            raise f.error(f"expected a table, found {_kind(data['annotations'])}", "annotations")
        flat: dict[str, Any] = {}
        _flatten(f, data["annotations"], "", flat)
        for name, raw in flat.items():
            key = f"annotations.{name}"
            if isinstance(raw, bool):
                value = "true" if raw else "false"
            elif isinstance(raw, (int, float)):
                value = str(raw)
            else:
                value = _string(f, key, raw, environ)
            e.annotations[name] = value
            e.origin[key] = src


def _check_name(f: _File, name: str) -> None:
    """An ``[env]`` name must be a POSIX variable name: any other (``C;touch X;D``) would be
    shell code in the ``export`` lines of ``hpcml env render`` and in the container's script."""
    if not is_variable_name(name):
        shown = repr(name)[1:-1]                     # a newline in the name stays on one line
        raise UsageError("not a variable name (letters, digits and _, not starting with a digit)",
                         file=str(f.path), key=f"env.{shown}", line=f.line_of(f"env.{name}"))


def _mounts(f: _File, e: Environment, environ: Mapping[str, str], cwd: str, origins: list[str],
            engine: str) -> None:
    """Append this file's mounts; an earlier mount at the same destination is dropped, since
    the later one covers it (``origins`` runs parallel to ``e.mounts``)."""
    for i, raw in enumerate(_strings(f, "mounts", f.data["mounts"])):
        key = f"mounts[{i}]"
        try:
            mount = parse_mount(_string(f, key, raw, environ), cwd, short_form=engine == "ce")
        except MountError as exc:
            raise f.error(str(exc), key, raw) from None
        target = os.path.normpath(mount.target)
        for j in reversed(range(len(e.mounts))):
            if os.path.normpath(e.mounts[j].target) == target:
                del e.mounts[j], origins[j]
        origins.append(str(f.path))
        e.mounts.append(mount)


def _env_value(f: _File, key: str, raw: Any, environ: Mapping[str, str], e: Environment,
               warnings: list[str]) -> str:
    """The host-only preview of an ``[env]`` value; one that references variables is also
    kept as written, for the container's environment to resolve (module docstring)."""
    if not isinstance(raw, str):
        raise f.error(f"expected a string, found {_kind(raw)}", key)
    _no_nul(f, key, raw)
    try:
        names = references(raw)
        preview = expand(raw, environ, keep_undefined=True)
    except ExpansionError as exc:
        raise f.error(str(exc), key, raw) from None
    if names:
        e.env_template[key.removeprefix("env.")] = raw
        try:
            expand(raw, environ)
        except ExpansionError as exc:
            line = f.line_of(key, raw)
            warnings.append(f"{f.path}{':' + str(line) if line else ''}: key '{key}': {exc.variable} is not "
                            "set here; the image must define it, or the container start fails")
    return preview


# ---------------------------------------------------------------- public entry

def load(name_or_path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None,
         cwd: str | os.PathLike[str] | None = None, require_image: bool = True,
         lenient: bool | None = None, engine: str | None = None) -> Resolved:
    """Find, parse, inherit, expand and validate an EDF; any bad input is a ``UsageError``.

    ``environ`` (default ``os.environ``) feeds expansion, EDF_PATH and HOME; ``cwd``
    (default the process's) anchors ``./`` paths; ``engine`` (default
    ``$HPCML_EDF_ENGINE``, else ``ce``) is one of ``ENGINES``.
    """
    environ = os.environ if environ is None else environ
    engine = engine or environ.get("HPCML_EDF_ENGINE") or "ce"
    if engine not in ENGINES:
        raise UsageError(f"unknown EDF engine {engine!r}; known: {', '.join(ENGINES)}", key="engine")
    cwd = os.getcwd() if cwd is None else os.fspath(cwd)
    name = os.fspath(name_or_path)
    if is_relative_path(name) or "/" in name:
        name = os.path.normpath(os.path.join(cwd, name))
    top = find_edf(name, environ, cwd)
    order: list[_File] = []
    _collect(top, environ, cwd, [], order, set())
    e = Environment(file=top, chain=[f.path for f in order])
    warnings: list[str] = []
    if lenient is None:
        lenient = environ.get("HPCML_EDF_LENIENT", "") not in ("", "0")
    mount_origins: list[str] = []
    for f in order:
        _unknown_keys(f, warnings, lenient)
        _apply(f, e, environ, cwd, warnings, mount_origins, engine)
    e.origin.update({f"mounts[{i}]": src for i, src in enumerate(mount_origins)})
    if "entrypoint" not in e.origin:
        e.entrypoint = ENGINES[engine]
    if engine == "sarus-suite" and (e.image.startswith("/") or is_relative_path(e.image)):
        raise UsageError(f"Sarus Suite runs registry references only, not the path {e.image!r}",
                         file=str(e.origin.get("image", top)), key="image")
    if require_image and not e.image:
        raise UsageError("no image: set 'image' in this file or in a base environment",
                         file=str(top), key="image")
    return Resolved(env=e, warnings=warnings)
