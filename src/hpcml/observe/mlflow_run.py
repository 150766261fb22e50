"""What an MLflow run says about the job it records: a name, tags and parameters.

A tracking server shows runs side by side, so each says which job it was: named by job
and attempt (``1234-a0``, ``1234-a1`` after a requeue; a local job by its directory's
name; a farm task ``FARM-task3.1``, its id and farm attempt), the command and job
directory as tags, and a farm task's sweep parameters as MLflow params.

Tags, not params, for the command and the directory: params are the run's inputs that the
UI compares across runs (columns, parallel coordinates, ``params.lr > 0.01``); a sweep's
parameters belong there, a path that differs for every run would only clutter them. Tags
also hold 8,000 characters to a param's 6,000, and ``mlflow.source.name`` is where the UI's
"Source" column looks for what ran.
"""

from __future__ import annotations

import getpass
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcml.cluster.ranks import restart_count
from hpcml.cluster.requeue import ENV_ATTEMPT, ENV_DIR
from hpcml.cluster.taskenv import FarmTask
from hpcml.cluster.taskenv import current as farm_task
from hpcml.farm.model import RUNS, TASKS_FILE
from hpcml.files import load_json_bounded, read_bounded
from hpcml.observe.store import RANK_META

# MLflow's limits (mlflow/utils/validation.py, 2.x and 3.x): longer values fail the whole call
MAX_KEY, MAX_PARAM_VALUE, MAX_TAG_VALUE = 250, 6000, 8000
# a sweep of 100,000 tasks writes ~20 MB of tasks.jsonl; bigger is not a farm's own file
TASKS_MAX = 64 << 20
RANK_META_MAX = 16 << 20            # a rank file is a few KB; a requeued job's 'earlier' list grows it
_BAD_KEY = re.compile(r"[^\w.\- :]")        # what MLflow accepts in a param name (no '/': paths)


@dataclass
class RunMeta:
    name: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _attempt(env: Mapping[str, str]) -> int:
    """hpcml run's attempt, else Slurm's restart count (a requeued job's)."""
    if env.get(ENV_ATTEMPT, "").isdigit():
        return int(env[ENV_ATTEMPT])
    return restart_count(env)


def _job_dir(store: Path, env: Mapping[str, str]) -> Path:
    """hpcml run's job directory when the recorder runs under it (its attempt N >= 1
    records under JOB/attempts/N, see hpcml.run.jobdir), else the store itself."""
    run_dir = env.get(ENV_DIR)
    if not run_dir:
        return store.absolute()
    d = Path(run_dir).absolute()
    return d.parents[1] if d.parent.name == "attempts" else d


def task_params(task: FarmTask) -> dict[str, object]:
    """The sweep parameters of a farm task, from the farm's tasks.jsonl (read bounded: the
    file is on a shared filesystem where anyone may have replaced it)."""
    text = read_bounded(task.farm / TASKS_FILE, TASKS_MAX).decode("utf-8", errors="replace")
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("id") == task.id:
            params = doc.get("params")
            return dict(params) if isinstance(params, dict) else {}
    return {}


def _param(key: object, value: object) -> tuple[str, str]:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return _clip(_BAD_KEY.sub("_", str(key)) or "_", MAX_KEY), _clip(text, MAX_PARAM_VALUE)


def describe(cmd: list[str], store: Path, job_id: str, nodes: str, env: Mapping[str, str]) -> RunMeta:
    """The name, tags and params of the MLflow run of the job recorded into ``store``."""
    job_dir, attempt, task = _job_dir(store, env), _attempt(env), farm_task(env)
    label = job_id if job_id != "local" else job_dir.name
    name = f"{label}-a{attempt}"
    if task is not None:                    # runs/ID.A, then ID.A-1... for the attempt's next hpcml run
        own = job_dir.parent == task.farm.absolute() / RUNS
        name = f"{task.farm.name}-task{job_dir.name if own else f'{task.id}.{task.attempt}'}"
    command = _clip(shlex.join(cmd), MAX_TAG_VALUE)
    meta = RunMeta(_clip(name, MAX_TAG_VALUE), {
        "mlflow.runName": name, "mlflow.source.name": command, "mlflow.source.type": "JOB",
        "hpcml.command": command, "hpcml.job_dir": _clip(str(job_dir), MAX_TAG_VALUE),
        "hpcml.job_id": job_id, "hpcml.attempt": str(attempt), "hpcml.nodes": nodes})
    try:
        meta.tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):
        pass                            # a container's uid without a passwd entry
    if task is not None:
        meta.tags.update({"hpcml.farm.dir": str(task.farm.absolute()), "hpcml.farm.task": str(task.id),
                          "hpcml.farm.attempt": str(task.attempt)})
        try:
            meta.params = dict(_param(k, v) for k, v in task_params(task).items())
        except (OSError, ValueError) as exc:
            meta.problems.append(f"the farm task's parameters were not read: {task.farm / TASKS_FILE}: {exc}")
    return meta


def outcome(store: Path) -> dict | None:
    """What became of rank 0's metrics sent to MLflow, from its rank file in ``store`` (the
    recorder's 'mlflow' entry: url, run, sent, dropped, unreachable), with ``line``, the
    sentence a report prints. None when the job sent nothing to MLflow (or the file is gone)."""
    try:
        meta = load_json_bounded(store / RANK_META.format(rank=0), RANK_META_MAX)
    except (OSError, ValueError):
        return None
    entry = meta.get("mlflow") if isinstance(meta, dict) else None
    if not isinstance(entry, dict):
        return None
    url, dropped, sent = entry.get("url"), int(entry.get("dropped") or 0), int(entry.get("sent") or 0)
    if entry.get("unreachable") or not entry.get("run_id"):
        line = f"unreachable at {url}, {dropped} metric{'s' * (dropped != 1)} dropped"
    else:
        line = f"run {entry.get('run_name')} at {url}: {sent} metric{'s' * (sent != 1)} sent" \
               + (f", {dropped} dropped" if dropped else "")
    return {**entry, "line": line}
