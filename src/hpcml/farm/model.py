"""The farm's data: a task, the farm's settings, and the names of its files.

A farm directory holds::

    farm.json            tag hpcml.farm/1, settings (retries, backoff, time limit, lease)
    tasks.jsonl          one task per line (id, command, parameters, group, after); append-only
    claims/ID.A          attempt A of task ID was taken by one worker (created O_CREAT|O_EXCL)
    ends/ID.A            how attempt A ended (linked into place: complete or absent, never half)
    logs/ID.A.out|.err   the attempt's stdout and stderr
    observe/ID.A/        where the attempt's ``hpcml.observe.log`` calls write (HPCML_OBSERVE_DIR)
    runs/ID.A/           the job directory of an ``hpcml run`` in the attempt (made by that run;
                         the attempt's next runs: ID.A-1/, ID.A-2/...)
    workers/WID          one file per worker: who it is; its mtime is the worker's heartbeat
    nodes/NODE.bad       a node where tasks kept failing: no worker takes tasks there
    nodes/NODE.told      its retirement was sent to the centre's collector (by one farm run)
    tasks/ID/            the task's own directory, its working directory unless task_dirs is
                         false ({task_dir} in a command, HPCML_FARM_TASK_DIR), with params.json

Claims and ends are immutable once they exist, so a reader may cache them forever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hpcml.cluster.taskenv import OBSERVE as OBSERVE  # a task is told these two (taskenv)
from hpcml.cluster.taskenv import RUNS as RUNS
from hpcml.cluster.taskenv import TASK_DIRS as TASK_DIRS
from hpcml.schemas import tag

FARM_SCHEMA = tag("farm", 1)
TASK_SCHEMA = tag("farm.task", 1)
CLAIM_SCHEMA = tag("farm.claim", 1)
END_SCHEMA = tag("farm.end", 1)
WORKER_SCHEMA = tag("farm.worker", 1)
STATUS_SCHEMA = tag("farm.status", 1)
RESULTS_SCHEMA = tag("farm.results", 1)

FARM_FILE = "farm.json"
TASKS_FILE = "tasks.jsonl"
CLAIMS, ENDS, LOGS, WORKERS, NODES = "claims", "ends", "logs", "workers", "nodes"
#: the task's parameters, in its own directory (tasks/ID/params.json)
PARAMS = "params.json"
SUBDIRS = (CLAIMS, ENDS, LOGS, OBSERVE, WORKERS, NODES)

#: outcomes of an attempt; "lost": its worker died (or lost its lease) before it ended;
#: "damaged": never written, what a reader makes of an end or claim file that is not a record
OK, FAILED, TIMEOUT, LOST, DAMAGED = "ok", "failed", "timeout", "lost", "damaged"
OUTCOMES = (OK, FAILED, TIMEOUT, LOST)


@dataclass(frozen=True)
class Settings:
    """How a farm runs its tasks; stored in farm.json, each may be overridden by ``farm run``."""

    retries: int = 2                 # failed attempts retried this many times
    backoff: float = 1.0             # seconds before retry 1; doubles for each further retry
    time_limit: float | None = None  # seconds an attempt may run before it is stopped ("timeout")
    lease: float = 60.0              # a worker whose heartbeat stood still this long is dead
    node_failures: int = 5           # different tasks failing in a row on a node, not elsewhere: node or code (0: never)
    task_dirs: bool = True           # each task runs in tasks/ID (its own relative paths); False: farm run's directory
    metrics_file: str | None = None  # a JSON-lines file each task writes, relative to its directory (farm results)

    @property
    def heartbeat(self) -> float:
        return max(0.05, self.lease / 6)

    def to_json(self) -> dict[str, Any]:
        return {"retries": self.retries, "backoff": self.backoff, "time_limit": self.time_limit,
                "lease": self.lease, "node_failures": self.node_failures, "task_dirs": self.task_dirs,
                "metrics_file": self.metrics_file}


#: ``json.dumps(..., sort_keys=True, default=str)`` made once: dumps with options builds an
#: encoder per call, a third of the key's cost over a million tasks
_KEY_ENCODER = json.JSONEncoder(sort_keys=True, default=str)


@dataclass(frozen=True)
class TaskSpec:
    """A task before it has an id: what ``farm create`` reads from a task or sweep file."""

    command: str
    params: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    after: tuple[int | str, ...] = ()

    def key(self) -> str:
        """What makes two tasks the same for an idempotent ``farm create``."""
        return _KEY_ENCODER.encode([self.group, self.command, self.params])


@dataclass(frozen=True)
class Task(TaskSpec):
    id: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "command": self.command, "params": self.params, "group": self.group,
                "after": list(self.after)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        """A record of tasks.jsonl; ValueError names what is wrong (the file may have been
        edited or damaged, and a wrong type would fail later, far from its cause)."""
        tid, command, params = d["id"], d["command"], d.get("params") or {}
        group, after = d.get("group"), d.get("after") or []
        if not _is_int(tid) or not 0 <= tid <= MAX_ID:
            raise ValueError(f"'id' must be a whole number from 0 to {MAX_ID}, found {_shown(tid)}")
        if not isinstance(command, str):
            raise ValueError(f"'command' must be a string, found {_shown(command)}")
        if not isinstance(params, dict) or _depth(params) > MAX_PARAMS_DEPTH:
            raise ValueError(f"'params' must be a mapping nested at most {MAX_PARAMS_DEPTH} deep")
        if group is not None and not isinstance(group, str):
            raise ValueError(f"'group' must be a string or null, found {_shown(group)}")
        if not isinstance(after, list) or not all(isinstance(a, str) or _is_int(a) for a in after):
            raise ValueError(f"'after' must be a list of task ids and group names, found {_shown(after)}")
        return cls(id=tid, command=command, params=params, group=group, after=tuple(after))


#: the largest task id (ids are file names: claims/ID.A); deeper params than any sweep makes
MAX_ID = 2**63 - 1
MAX_PARAMS_DEPTH = 32


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _depth(v: Any, level: int = 0) -> int:
    """How deep ``v`` nests, counted no further than just past the limit."""
    if level > MAX_PARAMS_DEPTH or not isinstance(v, (dict, list)):
        return level
    items = v.values() if isinstance(v, dict) else v
    return max((_depth(x, level + 1) for x in items), default=level + 1)


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
