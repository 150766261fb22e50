"""Inputs of ``hpcml farm create``: a task file or a sweep file -> task specs.

A task file has one shell command per line, as GNU Parallel and META read them (blank
lines and lines starting with ``#`` are skipped). A sweep file is YAML::

    command: python train.py --lr {lr} --bs {bs} --seed {seed}
    product: {lr: [0.1, 0.01], bs: [32, 64]}      # every combination
    zip: {seed: [1, 2, 3], tag: [a, b, c]}          # side by side (same lengths)
    random:                                         # samples drawn with a fixed seed
      samples: 8
      seed: 0
      params: {dropout: {uniform: [0, 0.5]}, wd: {loguniform: [1e-6, 1e-2]},
               opt: {choice: [adam, sgd]}, layers: {randint: [2, 8]}}
    retries: 2
    time_limit: 2 h
    task_dirs: true          # the default: each task runs in SWEEP/tasks/ID ({task_dir})
    metrics_file: out/metrics.jsonl   # what each task writes there, shown by farm results

The parameter sets are the product of the three parts (a part left out is one empty set).
Several stages with dependencies (pre-process -> train xN -> evaluate) go under ``tasks:``,
each a mapping like the above with ``group:`` and ``after: [groups or task ids]``.
The command is a Python format string: ``{name}`` is a parameter, ``{{`` a brace; a name
that no parameter defines, and a parameter that the command does not use (every value of
it would run the same command), are errors. Each value is inserted shell-quoted, one word
with its exact bytes, also inside quotes in the template (``hpcml.farm.template``): sweep
files are shared, and a value ``b; rm -rf ~`` must stay a value. ``raw: true`` (or ``raw:
[names]``) inserts values as shell code, for a template that wants that. Two parameter sets
that give the same command are refused; ``repeat: N`` runs each set N times on purpose
(``{repeat}``, 1..N, is then a parameter the command may use, e.g. as a seed). A sweep
makes at most ``MAX_TASKS`` tasks (counted before any is made) and no command longer than
the kernel passes (``template.COMMAND_MAX``). A task file is shell by design: each line is
run as it is written; a NUL byte (which no command can hold) is refused in both.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import re
import string
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hpcml.errors import UsageError
from hpcml.farm.model import Settings, TaskSpec
from hpcml.farm.template import REFS, TemplateError, command_problem, fill
from hpcml.files import ConfigLoader, line_map, load_yaml_with_nodes, read_config, unknown_key
from hpcml.units import parse_seconds

Scalar = str | int | float | bool | None


class Dist(BaseModel):
    """One random parameter: exactly one of the four keys."""

    model_config = ConfigDict(extra="forbid")
    choice: list[Scalar] | None = None
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None

    def kind(self) -> Literal["choice", "uniform", "loguniform", "randint"]:
        set_ = [k for k in ("choice", "uniform", "loguniform", "randint") if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError(f"give exactly one of choice, uniform, loguniform, randint (found {len(set_)})")
        if set_[0] == "loguniform" and min(self.loguniform or (1, 1)) <= 0:
            raise ValueError("loguniform bounds must be positive")
        if set_[0] == "choice" and not self.choice:
            raise ValueError("choice needs at least one value")
        if set_[0] == "randint" and self.randint and self.randint[0] > self.randint[1]:
            raise ValueError(f"randint bounds must be [low, high] with low <= high, found {list(self.randint)}")
        return set_[0]  # type: ignore[return-value]

    def draw(self, rng: random.Random) -> Any:
        kind = self.kind()
        if kind == "choice":
            return rng.choice(self.choice or [None])
        if kind == "uniform":
            lo, hi = self.uniform or (0.0, 0.0)
            return rng.uniform(lo, hi)
        if kind == "loguniform":
            lo, hi = self.loguniform or (1.0, 1.0)
            return math.exp(rng.uniform(math.log(lo), math.log(hi)))
        lo_i, hi_i = self.randint or (0, 0)
        return rng.randint(lo_i, hi_i)


class RandomPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    samples: int = Field(ge=1)
    seed: int
    params: dict[str, Dist]


class Stage(BaseModel):
    """One command template and its parameter sets."""

    model_config = ConfigDict(extra="forbid")
    command: str
    group: str | None = None
    after: list[int | str] = Field(default_factory=list)
    product: dict[str, list[Scalar] | Scalar] = Field(default_factory=dict)
    zip: dict[str, list[Scalar]] = Field(default_factory=dict)
    random: RandomPart | None = None
    raw: bool | list[str] = False
    repeat: int = Field(1, ge=1)

    @field_validator("command")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the command is empty")
        return v


STAGE_KEYS = tuple(Stage.model_fields)
SETTING_KEYS = ("retries", "backoff", "time_limit", "task_dirs", "metrics_file")


#: the most tasks one sweep file may expand to (all stages together), checked before any is
#: made: a typo such as ``repeat: 3000000`` would otherwise take minutes and gigabytes
MAX_TASKS = 1_000_000


# A task file is generated, not written by hand: one line per task, 100k tasks of a few
# hundred characters each is tens of MiB. The sweep (YAML) keeps the config files' limit.
TASK_FILE_MAX = 64 << 20


def parse_task_file(path: str | Path) -> list[TaskSpec]:
    """One command per line; blank lines and ``#`` comments are skipped."""
    text = read_config(path, max_bytes=TASK_FILE_MAX)
    specs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if problem := command_problem(line):      # the task could never start
            raise UsageError(problem, file=str(path), line=n)
        specs.append(TaskSpec(command=line.strip()))
    if not specs:
        raise UsageError("no commands in this task file", file=str(path))
    return specs


def is_sweep(path: str | Path) -> bool:
    return Path(path).suffix.lower() in (".yaml", ".yml")


def parse_sweep(path: str | Path) -> tuple[list[TaskSpec], dict[str, Any]]:
    """A sweep file -> its task specs and the settings it names (retries, backoff, time_limit)."""
    source = str(path)
    data, node = load_yaml_with_nodes(read_config(path), source)
    where = ConfigLoader(source, line_map(node) if node is not None else {})
    if not isinstance(data, dict):
        raise UsageError("expected a mapping with a command (or tasks:) and parameters", file=source)
    settings = _settings(data, where)
    stages_raw = data.get("tasks")
    if stages_raw is None:
        top = {k: v for k, v in data.items() if k not in SETTING_KEYS}
        stages, prefix = [top], cast(tuple, ())
    else:
        extra = [k for k in data if k not in SETTING_KEYS + ("tasks",)]
        if extra:
            raise where.error((extra[0],), unknown_key(extra[0], ("tasks",) + SETTING_KEYS)
                              + "; with tasks: each stage has its own command and parameters")
        if not isinstance(stages_raw, list) or not stages_raw:
            raise where.error(("tasks",), "expected a list of stages (each with a command)")
        stages, prefix = stages_raw, ("tasks",)
    parsed = [_stage(raw, (*prefix, i) if prefix else (), where) for i, raw in enumerate(stages)]
    total = 0
    for i, stage in enumerate(parsed):
        total += _count(stage, (*prefix, i) if prefix else (), where, total)
    specs: list[TaskSpec] = []
    for i, stage in enumerate(parsed):
        later = {st.group for st in parsed[i:] if st.group}
        specs += _expand(stage, (*prefix, i) if prefix else (), where, later)
    return specs, settings


def _settings(data: dict, where: ConfigLoader) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "retries" in data:
        v = data["retries"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise where.error(("retries",), f"expected a count >= 0, found {v!r}")
        out["retries"] = v
    for key in ("backoff", "time_limit"):
        if key in data:
            out[key] = where.convert((key,), data[key], parse_seconds)
    if "task_dirs" in data:
        if not isinstance(data["task_dirs"], bool):
            raise where.error(("task_dirs",), f"expected true (each task in its own directory, the default) or "
                                              f"false (every task in farm run's directory), found {data['task_dirs']!r}")
        out["task_dirs"] = data["task_dirs"]
    if "metrics_file" in data:
        v = data["metrics_file"]
        if not isinstance(v, str) or not v or os.path.isabs(v) or ".." in Path(v).parts or "\0" in v:
            raise where.error(("metrics_file",), f"expected a path relative to each task's directory, inside it "
                                                 f"(e.g. out/metrics.jsonl), found {v!r}")
        out["metrics_file"] = v
    Settings(**out)   # validates types
    return out


def _stage(raw: Any, path: tuple, where: ConfigLoader) -> Stage:
    if not isinstance(raw, dict):
        raise where.error(path, "expected a mapping with a command and parameters")
    for key in raw:
        if key not in STAGE_KEYS and not (not path and key in SETTING_KEYS):
            raise where.error((*path, key), unknown_key(str(key), STAGE_KEYS))
    try:
        stage = Stage.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith(("list[", "tuple[")))
        found = err.get("input")
        shown = "" if isinstance(found, (dict, list)) or err["type"] == "missing" else f", found {found!r}"
        raise where.error((*path, *loc), err["msg"].removeprefix("Value error, ") + shown) from None
    if stage.random:
        for name, dist in stage.random.params.items():
            where.convert((*path, "random", "params", name), dist, lambda d: d.kind())
    lengths = {k: len(v) for k, v in stage.zip.items()}
    if len(set(lengths.values())) > 1:
        raise where.error((*path, "zip"), f"lists of different lengths: {lengths}")
    names = [*stage.product, *stage.zip, *(stage.random.params if stage.random else {})]
    if "repeat" in raw:
        names.append("repeat")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise where.error((*path, twice[0]), "parameter defined more than once (product, zip, random, repeat)")
    for name in stage.raw if isinstance(stage.raw, list) else ():
        if name not in names:
            raise where.error((*path, "raw"), f"names '{name}', which is not a parameter (parameters: "
                                              f"{', '.join(names) or 'none'})")
    return stage


def _fields(template: str, path: tuple, where: ConfigLoader) -> list[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise where.error((*path, "command"), f"not a valid template: {exc}") from None
    out = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        base = name.split(".")[0].split("[")[0]
        if not base or base.isdigit():
            raise where.error((*path, "command"), "a template field needs a parameter name, e.g. {lr}")
        out.append(base)
    return out


def _count(stage: Stage, path: tuple, where: ConfigLoader, before: int) -> int:
    """How many tasks the stage expands to, refused over ``MAX_TASKS`` (with the ``before``
    of earlier stages) before any is made."""
    factors: dict[tuple, int] = {("product", name): len(v) if isinstance(v, list) else 1
                                 for name, v in stage.product.items()}
    if stage.zip:
        factors[("zip",)] = len(next(iter(stage.zip.values())))
    if stage.random:
        factors[("random", "samples")] = stage.random.samples
    factors[("repeat",)] = stage.repeat
    n = math.prod(factors.values())
    if before + n > MAX_TASKS:
        key = max(factors, key=lambda k: factors[k])
        earlier = f" (and {before:,} from earlier stages)" if before else ""
        raise where.error((*path, *key), f"the sweep would make {n:,} tasks{earlier}, more than the "
                                         f"{MAX_TASKS:,} one sweep may have: make fewer, or split it into "
                                         "several farms")
    return n


def _sections(stage: Stage) -> dict[str, tuple]:
    """Each parameter -> the key that defines it (for messages)."""
    out: dict[str, tuple] = {name: ("product", name) for name in stage.product}
    out.update({name: ("zip", name) for name in stage.zip})
    out.update({name: ("random", "params", name) for name in (stage.random.params if stage.random else {})})
    if stage.repeat > 1 or "repeat" in stage.model_fields_set:
        out["repeat"] = ("repeat",)
    return out


def _expand(stage: Stage, path: tuple, where: ConfigLoader, later: set[str]) -> list[TaskSpec]:
    """Every parameter set of a stage, in a stable order (so re-creating appends nothing)."""
    sections = _sections(stage)
    used = _fields(stage.command, path, where)
    for name in used:
        if name not in sections and name not in REFS:
            known = ", ".join(sections) or "none"
            raise where.error((*path, "command"), f"the template names parameter '{name}', which is not "
                                                  f"defined (parameters: {known})")
    for name, key in sections.items():
        if name not in used and name != "repeat":
            raise where.error((*path, *key), f"parameter '{name}' is not used by the command, so each of its "
                                             "values would run the same command: use it as {" + name + "} "
                                             "in the command or remove it (repeat: N runs copies on purpose)")
    for dep in stage.after:
        if isinstance(dep, str) and dep in later:     # unknown groups: store.create knows the farm's
            raise where.error((*path, "after"), f"waits for group '{dep}', which this stage or a later one "
                                                "defines: a stage may only wait for earlier ones")
    prod_lists = [v if isinstance(v, list) else [v] for v in stage.product.values()]
    product_sets = [dict(zip(stage.product, combo)) for combo in itertools.product(*prod_lists)]
    zip_sets = [dict(zip(stage.zip, row)) for row in zip(*stage.zip.values())] if stage.zip else [{}]
    rand_sets: list[dict[str, Any]] = [{}]
    if stage.random:
        rng = random.Random(stage.random.seed)
        rand_sets = [{k: d.draw(rng) for k, d in stage.random.params.items()}
                     for _ in range(stage.random.samples)]
    raw = set(sections) if stage.raw is True else set(stage.raw or ())
    copies = [{"repeat": i} for i in range(1, stage.repeat + 1)] if "repeat" in sections else [{}]
    specs: list[TaskSpec] = []
    seen: dict[tuple, dict[str, Any]] = {}
    for p, z, r, c in itertools.product(product_sets, zip_sets, rand_sets, copies):
        values = {**p, **z, **r, **c}
        try:
            command = fill(stage.command, values, raw)
        except (KeyError, IndexError, ValueError, AttributeError, TypeError, OverflowError) as exc:
            problem = str(exc) if isinstance(exc, TemplateError) else f"cannot fill the template: {exc}"
            raise where.error((*path, "command"), problem) from None
        if "\0" in command:            # no program can be given it: the task could never start
            holder = next((k for k, v in values.items() if "\0" in str(v)), None)
            key = sections.get(holder, ("command",)) if holder else ("command",)
            raise where.error((*path, *key), "contains a NUL byte, which no command can hold")
        same = (command, c.get("repeat") if "repeat" not in used else None)
        if same in seen:
            sets = " and ".join(", ".join(f"{k}={v!r}" for k, v in d.items()) for d in (seen[same], values))
            raise where.error((*path, "command"), f"two parameter sets ({sets}) give the same command "
                                                  f"{command!r}: it would run twice (repeat: N runs copies "
                                                  "on purpose)")
        seen[same] = values
        specs.append(TaskSpec(command=command, params=values, group=stage.group, after=tuple(stage.after)))
    return specs


#: how ``{workdir}`` reads in a command, before and after ``fill`` (shlex has taken the quotes off)
WORKDIR_WORDS = ("{workdir}", "$HPCML_FARM_WORKDIR", "${HPCML_FARM_WORKDIR}")


#: a command of only these characters splits into the words shlex would give (no quote,
#: escape, comment or punctuation of the shell; only the whitespace shlex splits on): a
#: million tasks' commands are split by ``str.split``, not by shlex's character loop
_PLAIN_COMMAND = re.compile(r"[A-Za-z0-9 \t\r\n_./:=,+@%{}$~*?!\[\]^-]*")


#: words whose lookup ``relative_paths`` keeps at once
WORDS_KEPT = 100_000


def _words(command: str) -> list[str] | None:
    """The command's words as shlex (posix, the shell's punctuation) splits them; None
    where it cannot (an open quote)."""
    if _PLAIN_COMMAND.fullmatch(command):
        return command.split()
    import shlex
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        return list(lexer)
    except ValueError:
        return None


def relative_paths(specs: list[TaskSpec], here: Path, shown: int = 3) -> list[str]:
    """Words of the commands that are relative paths to files here (``train.py``,
    ``configs/a.yaml``): a task runs in its own directory, where they are not. A warning,
    not an error: ``ckpt`` from an earlier run here is meant to become the task's own.
    Each word is looked up once (tasks repeat their program and most of their values)."""
    found: dict[str, None] = {}
    is_file: dict[str, bool] = {}
    for spec in specs:
        words = _words(spec.command)
        if words is None:
            continue
        moved = False                   # after ``cd {workdir}``, a relative path is the farm run's directory's
        for i, w in enumerate(words):
            if w == "cd" and i + 1 < len(words):
                target = words[i + 1]
                moved = any(target == w or target.startswith(w + "/") for w in WORKDIR_WORDS)
                continue
            if (not moved and w and not w.startswith(("/", "-", "$", "~", "{")) and "=" not in w
                    and (i == 0 or words[i - 1] != "cd")):
                if w not in is_file:
                    if len(is_file) >= WORDS_KEPT:          # a million distinct seeds: not all kept
                        is_file.clear()
                    try:
                        is_file[w] = (here / w).is_file()
                    except OSError:                      # a word longer than a file name can be
                        is_file[w] = False
                if is_file[w]:
                    found[w] = None
    if not found:
        return []
    names = list(found)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return [f"{', '.join(names[:shown])}{more}: relative to {here}, but each task runs in its own directory "
            f"(FARM/tasks/ID): write {{workdir}}/{names[0]} in the command (the directory farm run starts in), "
            "an absolute path, or create the farm with --shared-dir (task_dirs: false)"]
