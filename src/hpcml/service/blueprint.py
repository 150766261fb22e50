"""Service blueprints: one small YAML file per service, validated before anything runs.

A blueprint says what a service is, not where it runs: the same file is started as a
process in its own venv (``python.packages``) or a container (``image``) on this machine,
inside a Slurm job, or rendered into Kubernetes manifests. Strings in ``command``, ``env``
and ``options`` may hold placeholders that each place fills in its own way::

    ${host}              the address to bind: 127.0.0.1 locally, 0.0.0.0 in a pod
    ${port.NAME}         the port called NAME: a free one locally, the declared one in a pod
    ${volumes.NAME}      the volume's directory: under the state directory, or its mount path
    ${files.NAME}        the directory holding the files of ``files[NAME]`` (a ConfigMap in a pod)
    ${options.NAME}      an option (defaults in the blueprint, ``--set NAME=VALUE`` overrides);
                         an option may use the options above it
    ${services.DEP.NAME} the URL of port NAME of the service DEP this one depends on

Secrets are referenced (a Kubernetes Secret's name and key, or locally an environment
variable of the caller), never written into the blueprint or any file hpcml writes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpcml.errors import UsageError
from hpcml.files import ConfigLoader, key_text, line_map, load_yaml_with_nodes, read_config, unknown_key, validation_problem
from hpcml.unit_fields import Bytes, Seconds

_DNS = re.compile(r"^[a-z]([-a-z0-9]{0,50}[a-z0-9])?$")
_CPU = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m?)\s*$")
PLACEHOLDER = re.compile(r"\$\{([a-z_]+)(?:\.([A-Za-z0-9_-]+))?(?:\.([A-Za-z0-9_-]+))?\}")
GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
# The most text a blueprint's strings (options, command, env, files) may come to once their
# ${options.NAME} placeholders are filled: an option may hold text that a string uses many
# times, and an option may use the options above it, so 186 KB of YAML could ask for GBs
# (every place, render included, fills all of them). A real blueprint's come to a few KiB;
# 4 MiB leaves room for the 2 MiB that YAML aliases may add (hpcml.files).
EXPANDED_MAX = 4 << 20


def _dns_name(value: str) -> str:
    if not isinstance(value, str) or not _DNS.match(value):
        raise ValueError(f"expected a lower-case name of letters, digits and '-' (a DNS label), found {value!r}")
    return value


def parse_cpu(value: Any) -> float:
    """``2``, ``0.5``, ``"500m"`` -> cores."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number of cores such as 2 or '500m', found {value!r}")
    if isinstance(value, (int, float)):
        cores = float(value)
    else:
        m = _CPU.match(str(value))
        if not m:
            raise ValueError(f"expected a number of cores such as 2 or '500m', found {value!r}")
        cores = float(m.group(1)) / (1000 if m.group(2) else 1)
    if cores <= 0:
        raise ValueError(f"expected a positive number of cores, found {value!r}")
    return cores


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Python(_Strict):
    packages: list[str] = []                      # pip requirements of the service's own venv
    # The service is one of hpcml's own commands (the centre's collector): it runs with the
    # interpreter hpcml runs in, nothing is built, and hpcml's version is the service's.
    own: bool = False

    @model_validator(mode="after")
    def _some(self) -> Python:
        if not self.packages and not self.own:
            raise _KeyError(("python", "packages"), "expected the service's pip requirements "
                                                    "(or own: true for one of hpcml's own commands)")
        if self.packages and self.own:
            raise _KeyError(("python", "packages"), "own: true runs in hpcml's own environment: it installs no packages")
        return self


class Port(_Strict):
    name: str
    port: int = Field(ge=1, le=65535)             # the port in a pod / container
    public: bool = False                          # Kubernetes: an Ingress; locally: still loopback unless --bind
    path: str = "/"

    _name = field_validator("name")(_dns_name)


class Volume(_Strict):
    name: str
    mount: str                                    # path inside a container / pod
    size: Bytes
    storage_class: Optional[str] = None           # a hint; the cluster's default class when absent

    _name = field_validator("name")(_dns_name)

    @field_validator("mount")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"expected an absolute path, found {v!r}")
        return v


class Secret(_Strict):
    env: str                                      # the variable the service reads
    secret: str                                   # Kubernetes Secret name
    key: str                                      # key in that Secret
    optional: bool = False


class Resources(_Strict):
    cpu: float = 1.0
    memory: Bytes = 2 * 2**30
    gpus: int = Field(default=0, ge=0)
    gpu_vendor: Optional[Literal["nvidia", "amd"]] = None

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, v: Any) -> float:
        return parse_cpu(v)

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: float) -> float:
        if v <= 0:
            raise ValueError(f"expected a positive size, found {v!r}")
        return v


class Health(_Strict):
    port: str                                     # a port name
    http: Optional[str] = "/"                     # a path answered with 2xx/3xx; null: the port accepting is enough
    timeout: Seconds = 120.0                      # how long ``up`` waits for it


class Auth(_Strict):
    kind: Literal["none", "service", "token"] = "none"   # service: its own login; token: hpcml generates one
    env: Optional[str] = None                     # token: the variable the service reads it from

    @model_validator(mode="after")
    def _env(self) -> Auth:
        if self.kind == "token" and not self.env:
            raise _KeyError(("auth", "env"), "kind: token needs the variable the service reads the token from")
        return self


class File(_Strict):
    name: str
    mount: str                                    # a directory inside the container / pod
    content: dict[str, str]                       # file name -> text (a ConfigMap in Kubernetes)

    _name = field_validator("name")(_dns_name)


class Slurm(_Strict):
    time: str = "1-00:00:00"                      # the job's time limit (sbatch --time)
    partition: Optional[str] = None


class Blueprint(_Strict):
    name: str
    description: str
    kind: Literal["supporting", "inference"] = "supporting"
    image: Optional[str] = None
    python: Optional[Python] = None
    command: list[str] = Field(min_length=1)
    ports: list[Port] = Field(min_length=1)
    volumes: list[Volume] = []
    files: list[File] = []
    env: dict[str, str] = {}
    secrets: list[Secret] = []
    options: dict[str, str] = {}
    resources: Resources = Resources()
    health: Health
    auth: Auth = Auth()
    depends_on: list[str] = []
    slurm: Slurm = Slurm()
    source: str = Field(default="", exclude=True)  # the file it was read from

    _name = field_validator("name")(_dns_name)

    @field_validator("depends_on")
    @classmethod
    def _deps(cls, v: list[str]) -> list[str]:
        return [_dns_name(d) for d in v]            # a name, never a path to some other file

    @model_validator(mode="after")
    def _consistent(self) -> Blueprint:
        if self.image is None and self.python is None:
            raise _KeyError(("image",), "a blueprint needs an image or python.packages (or both)")
        if self.resources.gpus and self.kind != "inference":
            raise _KeyError(("resources", "gpus"), f"a {self.kind} service is CPU-only: GPUs are for kind: inference "
                                                   f"(found gpus: {self.resources.gpus})")
        if self.resources.gpu_vendor and not self.resources.gpus:
            raise _KeyError(("resources", "gpu_vendor"), "set without resources.gpus")
        names = [p.name for p in self.ports]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _KeyError(("ports", i, "name"), f"duplicate port name '{name}'")
        if self.health.port not in names:
            raise _KeyError(("health", "port"), f"no port called '{self.health.port}' (ports: {', '.join(names)})")
        for i, vol in enumerate(self.volumes):
            if vol.name in [v.name for v in self.volumes[:i]]:
                raise _KeyError(("volumes", i, "name"), f"duplicate volume name '{vol.name}'")
        for i, port in enumerate(self.ports):
            if port.public and self.auth.kind == "none":
                raise _KeyError(("ports", i, "public"), "a public port needs auth (kind: service or token): "
                                                        "this service has none")
        for key, text in self.templates():
            for m in PLACEHOLDER.finditer(text):
                problem = self._placeholder_problem(m)
                if problem:
                    raise _KeyError(key, problem)
        found = self._expansion_problem()
        if found:
            raise _KeyError(*found)
        return self

    def _expansion_problem(self) -> tuple[tuple, str] | None:
        """(key, problem) when filling the ``${options.NAME}`` placeholders would need an option
        below the one that uses it (or itself), or would make the strings longer than
        ``EXPANDED_MAX``. Counted, never built: one pass over the strings, each option's filled
        length computed once (other placeholders are counted at their own length: a host, a
        port, a path or a URL, never a copy of other text)."""
        filled: dict[str, int] = {}            # option -> its length once filled
        total = 0
        for key, text in sorted(self.templates(), key=lambda kt: kt[0][0] != "options"):   # options first
            n = len(text)
            for m in PLACEHOLDER.finditer(text):
                if m.group(1) != "options":
                    continue
                if m.group(2) not in filled:   # validated: a known option, so one not filled yet
                    return key, f"{m.group(0)}: an option can use only the options above it"
                n += filled[m.group(2)] - len(m.group(0))
            if key[0] == "options":
                filled[key[1]] = n
            total += n
            if total > EXPANDED_MAX:
                big = max(filled, key=lambda k: filled[k], default=None)
                return key, (f"with its placeholders filled, the blueprint's strings come to more than "
                             f"{_size(EXPANDED_MAX)}" + (f" (${{options.{big}}} is {_size(filled[big])})" if big else "")
                             + "; no service needs that much: write the text out or use fewer placeholders")
        return None

    def templates(self) -> list[tuple[tuple, str]]:
        """(key path, text) of every string that may hold placeholders."""
        return ([(("command", i), c) for i, c in enumerate(self.command)]
                + [(("env", k), v) for k, v in self.env.items()]
                + [(("options", k), v) for k, v in self.options.items()]
                + [(("files", i, "content", k), v) for i, f in enumerate(self.files) for k, v in f.content.items()])

    def _placeholder_problem(self, m: re.Match) -> str | None:
        kind, a, b = m.groups()
        known = {"port": [p.name for p in self.ports], "volumes": [v.name for v in self.volumes],
                 "files": [f.name for f in self.files], "options": list(self.options)}
        if kind == "host" and a is None:
            return None
        if kind in known and a is not None and b is None:
            return None if a in known[kind] else f"{m.group(0)}: no {kind} called '{a}' (known: {', '.join(known[kind])})"
        if kind == "services" and a is not None and b is not None:
            return None if a in self.depends_on else f"{m.group(0)}: '{a}' is not in depends_on"
        return f"unknown placeholder {m.group(0)} (known: ${{host}}, ${{port.NAME}}, ${{volumes.NAME}}, " \
               "${files.NAME}, ${options.NAME}, ${services.DEP.PORT})"

    def port(self, name: str) -> Port:
        return next(p for p in self.ports if p.name == name)

    @property
    def gpu_resource(self) -> str | None:
        return GPU_RESOURCE[self.resources.gpu_vendor or "nvidia"] if self.resources.gpus else None

    def with_options(self, overrides: dict[str, str]) -> Blueprint:
        """A copy whose options have ``--set`` values; an unknown option is exit 2."""
        for key in overrides:
            if key not in self.options:       # a flag's value, not the catalogue file's fault
                problem = (unknown_key(key, list(self.options)).replace("unknown key", f"{self.name} has no option "
                                                                         f"'{key}'", 1)
                           if self.options else f"{self.name} has no options")
                raise UsageError(f"{key}={overrides[key]}: {problem}", key="set")
        # model_copy does not validate again: the placeholders of the values set, and what
        # filling them costs, are checked here (the blueprint alone passed: the values are the cause)
        copy = self.model_copy(update={"options": {**self.options, **overrides}})
        for key, value in overrides.items():
            for m in PLACEHOLDER.finditer(value):
                bad = copy._placeholder_problem(m)
                if bad:
                    raise UsageError(f"{key}: {bad}", key="set")
        found = copy._expansion_problem()
        if found:
            where, why = found
            name = where[1] if where[0] == "options" and where[1] in overrides else None
            raise UsageError(f"{name}: {why}" if name else
                             f"{key_text(where)} with {', '.join(overrides)} set so: {why}", key="set")
        return copy


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / (1 << 10):.0f} KiB" if n >= 1 << 10 else f"{n} characters"


class _KeyError(ValueError):
    """A cross-field problem that belongs to a key other than the model's own."""

    def __init__(self, path: tuple, problem: str) -> None:
        super().__init__(problem)
        self.path, self.problem = path, problem


def _problem(err: Any, raw: dict) -> str:   # a pydantic ErrorDetails
    if err["type"] == "extra_forbidden":
        loc = tuple(err["loc"])
        parent: Any = Blueprint
        for part in loc[:-1]:
            field = parent.model_fields.get(part) if isinstance(part, str) and hasattr(parent, "model_fields") else None
            if field is None:
                continue
            ann = field.annotation
            args = getattr(ann, "__args__", ())
            parent = next((a for a in (ann, *args) if hasattr(a, "model_fields")), parent)
        return unknown_key(str(loc[-1]), list(parent.model_fields) if hasattr(parent, "model_fields") else [])
    return validation_problem(err)


def loads(text: str, source: str = "<blueprint>") -> Blueprint:
    """Parse and validate a blueprint; the first problem is a one-line ``UsageError``."""
    data, node = load_yaml_with_nodes(text, source)
    ld = ConfigLoader(source, line_map(node) if node is not None else {})
    if not isinstance(data, dict):
        raise ld.error((), "expected a mapping with name, command, ports and health at the top")
    data.pop("source", None)
    bad = [k for k in data if not isinstance(k, str)]
    if bad:                 # YAML reads `1:` as an int: Blueprint(**data) would end in a TypeError
        typed = [k.value for k, _ in getattr(node, "value", ()) if k.tag != "tag:yaml.org,2002:str"]
        raise ld.error((typed[0] if typed and isinstance(typed[0], str) else str(bad[0]),),
                       f"keys should be strings (found {bad[0]!r})")
    try:
        bp = Blueprint(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        ctx_error = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_error, _KeyError):
            raise ld.error(ctx_error.path, ctx_error.problem) from None
        loc = tuple(p for p in err["loc"] if p not in ("function-after[_consistent(), Blueprint]",))
        raise ld.error(loc, _problem(err, data)) from None
    except _KeyError as exc:
        raise ld.error(exc.path, exc.problem) from None
    return bp.model_copy(update={"source": source})


def load(path: str | Path) -> Blueprint:
    """Read and validate a blueprint file."""
    return loads(read_config(path), str(path))
