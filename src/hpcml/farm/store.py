"""The farm directory: create it, append tasks (idempotently), read it back.

``create`` is idempotent: a task that is already in the farm (same group, command and
parameters; the k-th copy of a repeated line matches the k-th copy recorded) is not added
again, and new tasks get the next free ids, so appending never renumbers. tasks.jsonl is
rewritten through a rename (readers see the old or the new list, never half of one) under
a lock file created with O_CREAT|O_EXCL, so two ``farm create`` runs cannot both append.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml.errors import HpcmlError, UsageError
from hpcml.farm.model import FARM_FILE, FARM_SCHEMA, SUBDIRS, TASK_SCHEMA, TASKS_FILE, Settings, Task, TaskSpec
from hpcml.farm.template import command_problem
from hpcml.files import read_bounded, read_json, write_atomic
from hpcml.schemas import check


@dataclass
class Farm:
    """A farm directory as read: its settings and tasks."""

    path: Path
    settings: Settings
    tasks: list[Task] = field(default_factory=list)
    created: float = 0.0

    def sub(self, name: str) -> Path:
        return self.path / name


@dataclass
class CreateResult:
    path: Path
    added: int
    existing: int
    total: int


def _read_farm_json(path: Path) -> dict[str, Any]:
    f = path / FARM_FILE
    if not f.exists():
        what = "does not exist" if not path.exists() else f"has no {FARM_FILE}"
        raise UsageError(f"not a farm directory ({what}); make one with hpcml farm create", file=str(path))
    return read_json(f, FARM_SCHEMA)


#: the largest task file read (a million tasks of a few hundred bytes each is under 1 GiB)
TASKS_MAX = 4 << 30


def _read_tasks(path: Path) -> list[Task]:
    f = path / TASKS_FILE
    tasks: list[Task] = []
    ids: set[int] = set()
    try:      # a FIFO or a device put in its place (a task's program shares the farm) is not waited on
        lines = read_bounded(f, TASKS_MAX).decode("utf-8").splitlines()
    except FileNotFoundError:
        return tasks
    except (OSError, ValueError) as exc:          # UnicodeDecodeError is a ValueError
        raise UsageError(f"unreadable ({getattr(exc, 'strerror', None) or exc})", file=str(f)) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            # every line is tagged; an older hpcml tagged only the first: its farms still read
            check(doc, TASK_SCHEMA, f"{f}:{n}", untagged=n > 1)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            task = Task.from_json(doc)
        except (KeyError, TypeError, ValueError, RecursionError) as exc:    # JSONDecodeError: a ValueError
            problem = "nested too deeply" if isinstance(exc, RecursionError) else (
                f"missing {exc}" if isinstance(exc, KeyError) else str(exc))
            raise UsageError(f"a task record is damaged: {problem}", file=str(f), line=n) from None
        if task.id in ids:
            raise UsageError(f"a task record is damaged: task id {task.id} appears twice", file=str(f), line=n)
        ids.add(task.id)
        tasks.append(task)
    return tasks


def load(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> Farm:
    """Read a farm directory; one from another hpcml version is refused (exit 2)."""
    p = Path(path)
    doc = _read_farm_json(p)
    for sub in SUBDIRS:
        if not (p / sub).is_dir():
            raise UsageError(f"not a complete farm directory: {sub}/ is missing or not a directory "
                             "(hpcml farm create on it again makes what is missing)", file=str(p))
    settings = Settings(**{**(doc.get("settings") or {}), **{k: v for k, v in (overrides or {}).items()
                                                             if v is not None}})
    return Farm(path=p, settings=settings, tasks=_read_tasks(p), created=float(doc.get("created") or 0))


def tasks_signature(path: Path) -> tuple[int, int]:
    """(size, mtime_ns) of tasks.jsonl: a worker reloads the tasks when it changes."""
    try:
        st = os.stat(path / TASKS_FILE)
    except FileNotFoundError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def reload_tasks(farm: Farm) -> None:
    farm.tasks = _read_tasks(farm.path)


class _Lock:
    """An O_CREAT|O_EXCL lock file (atomic on local and shared filesystems)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> _Lock:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise UsageError(f"another hpcml farm create holds this lock ({self.path.read_text().strip()}); "
                             "remove it if that process is gone", file=str(self.path)) from None
        try:
            os.write(fd, f"{socket.gethostname()} pid {os.getpid()}\n".encode())
        except OSError:                        # a full disk: no empty lock left to refuse the next create
            self.path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


def create(path: str | os.PathLike, specs: list[TaskSpec], settings: dict[str, Any] | None = None) -> CreateResult:
    """Make the farm directory (or open it) and append the specs it does not hold yet."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError("exists and is not a directory", file=str(p))
    fresh = not (p / FARM_FILE).exists()
    if not fresh:
        doc = _read_farm_json(p)
    else:
        if p.exists() and any(p.iterdir()):
            raise UsageError(f"not empty and has no {FARM_FILE}: not a farm directory", file=str(p))
        doc = {"schema": FARM_SCHEMA, "created": time.time(), "settings": Settings().to_json()}
    doc["settings"] = Settings(**{**doc.get("settings", {}), **(settings or {})}).to_json()
    keys = [s.key() for s in specs]                       # made once: _plan runs twice
    _plan(p, [] if fresh else _read_tasks(p), specs, keys)   # bad input: refused before anything is made
    made = [d for d in (*reversed(p.parents), p) if not d.exists()]
    try:
        p.mkdir(parents=True, exist_ok=True)
        for sub in SUBDIRS:
            made += [p / sub] if not (p / sub).exists() else []
            (p / sub).mkdir(exist_ok=True)
        with _Lock(p / "create.lock"):
            tasks = _read_tasks(p)
            new = _plan(p, tasks, specs, keys)
            try:
                write_atomic(p / FARM_FILE, json.dumps(doc, indent=2) + "\n")
                if new or fresh:
                    lines = [json.dumps({"schema": TASK_SCHEMA, **t.to_json()}) for t in tasks + new]
                    write_atomic(p / TASKS_FILE, "".join(line + "\n" for line in lines))
            except OSError:
                if fresh and not tasks:            # under the lock: this create's farm.json, no one else's
                    (p / FARM_FILE).unlink(missing_ok=True)
                raise
    except OSError as exc:                         # a full disk: one line, and what this create made is gone
        for d in reversed(made):
            try:
                d.rmdir()                          # only if still empty
            except OSError:
                pass
        raise HpcmlError(f"{exc.filename or p}: {exc.strerror or exc}") from None
    return CreateResult(path=p, added=len(new), existing=len(specs) - len(new), total=len(tasks) + len(new))


def _plan(p: Path, tasks: list[Task], specs: list[TaskSpec], keys: list[str]) -> list[Task]:
    """The specs not in ``tasks`` yet, numbered on (``keys``: each spec's ``key()``); UsageError
    if one waits for a task or group that is not there (checked before the directory is made,
    and again under the lock)."""
    known_ids = {t.id for t in tasks}
    have = Counter(t.key() for t in tasks)
    seen: Counter[str] = Counter()
    new: list[Task] = []
    next_id = max(known_ids, default=-1) + 1
    for s, k in zip(specs, keys):
        if problem := command_problem(s.command):    # a Python caller's spec: the files' readers refuse it too
            raise UsageError(problem, file=str(p), key="command")
        seen[k] += 1
        if seen[k] <= have[k]:
            continue
        new.append(Task(command=s.command, params=s.params, group=s.group, after=s.after, id=next_id))
        next_id += 1
    groups = {t.group for t in tasks + new if t.group}
    for t in new:
        for dep in t.after:
            if isinstance(dep, int) and not 0 <= dep < t.id:
                raise UsageError(f"'after' names task {dep}: a task may only wait for an earlier one "
                                 f"(this one is task {t.id})", file=str(p), key="after")
            if isinstance(dep, str) and dep not in groups:
                raise UsageError(f"'after' names group '{dep}', which no task has", file=str(p), key="after")
    return new
