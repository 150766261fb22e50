"""``hpcml farm results``: one row per task, its parameters, its optimizer steps and their
rate, and the last value of each metric it logged, so a sweep's best run is one sort away.
Read from observe/ID.A (the directory the worker gave the attempt in HPCML_OBSERVE_DIR:
``hpcml.observe.log``, and the optimizer steps the farm's hooks count without a script
change), from runs/ID.A/observe where the task is an ``hpcml run``, and from the
framework logs in the task's own directory (``hpcml.observe.framelogs``: HF Trainer's
``trainer_state.json``, Lightning's ``metrics.csv``, the sweep's ``metrics_file``).

It reads the farm, observe stores and run job directories, so it sits with ``run`` (the
top of the library layers), not in ``farm``, which run, observe and ckpt build on."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import logs
from hpcml.cluster.taskenv import run_dirs
from hpcml.errors import HpcmlError, UsageError
from hpcml.farm.lease import Liveness
from hpcml.farm.model import OBSERVE, RESULTS_SCHEMA, TASK_DIRS
from hpcml.farm.status import open_view, task_state
from hpcml.observe.framelogs import Logged, read_task_logs
from hpcml.observe.progress import RULE, last_values, summarise

log = logs.get(__name__)

#: the columns besides parameters and metrics that --sort takes
#: (optimizer_steps: not "steps", which a sweep may name a parameter or a script a metric)
COLUMNS = ("id", "group", "state", "attempts", "exit_code", "node", "seconds", "optimizer_steps", "optimizer_steps_per_s")


@dataclass
class AttemptResults:
    """What one attempt shows in the results: each metric's last value and whose it is (a
    rank of an observe store, or a framework log's file), and its optimizer steps."""

    metrics: dict[str, float | None] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    non_finite: dict[str, str] = field(default_factory=dict)    # metric -> "nan"/"inf"/"-inf" its last value was
    steps: dict[str, Any] | None = None
    logs: list[Logged] = field(default_factory=list)

    def add_store(self, directory: str) -> None:
        """An observe store's metrics (rank 0's last, ``hpcml.observe.progress.RULE``) and
        steps (the optimizer steps ``hpcml run``'s or the farm's hooks counted, or the
        script's own): a later store (the attempt's ``hpcml run``) overrides an earlier one."""
        series = _series(directory)
        if series is None:
            return
        for k, v in last_values(series).items():
            self.metrics[k], self.ranks[k], self.sources[k] = v.value, v.rank, "observe"
            if v.non_finite:                # the last logged value was not a number: the task diverged
                self.non_finite[k] = v.non_finite
            else:
                self.non_finite.pop(k, None)
        done = summarise(series)
        st = done.get("steps") if done else None
        if st and st.get("count"):
            secs = st.get("seconds")
            self.steps = {"count": st["count"], "rank": st["rank"], "seconds": secs,
                          "per_s": round(st["count"] / secs, 4) if secs else None}

    def add_logs(self, found: list[Logged]) -> None:
        """Framework logs: their values where no observe store gave the metric."""
        self.logs += found
        for got in found:
            for k, v in got.values.items():
                if self.sources.get(k) == "observe":
                    continue
                self.metrics[k], self.sources[k] = v, got.source
                self.ranks.pop(k, None)
                self.non_finite.pop(k, None)
            for k, what in got.non_finite.items():
                if self.sources.get(k) == "observe":
                    continue
                self.metrics[k], self.sources[k], self.non_finite[k] = None, got.source, what
                self.ranks.pop(k, None)


def _series(directory: str) -> Any:
    if not os.path.isdir(directory):
        return None
    import pyarrow as pa

    from hpcml.observe.series import from_table
    from hpcml.observe.store import read_job
    try:
        return from_table(read_job(directory).table)
    except UsageError:                 # no store there (an attempt that logged nothing)
        return None
    except (HpcmlError, OSError, ValueError, KeyError, pa.ArrowException) as exc:   # one store, not the farm's results
        log.info(f"farm results: {directory}: not read: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
        return None


def attempt_results(farm: Path, name: str, task_dir: Path | None, metrics_file: str | None) -> AttemptResults:
    """An attempt's results: what its own processes logged or stepped (observe/ID.A), then
    what the ranks of each ``hpcml run`` in it did (runs/ID.A[-N]/observe, those runs'
    stores), then the framework logs in the task's own directory (``task_dir``; None where
    tasks share one directory, so no log is any one task's)."""
    from hpcml.run.jobdir import observe_dir
    out = AttemptResults()
    out.add_store(str(farm / OBSERVE / name))
    for d in run_dirs(farm, name):
        out.add_store(str(observe_dir(d)))
    if task_dir is not None:
        out.add_logs(read_task_logs(task_dir, metrics_file))
    return out


def collect(path: str | os.PathLike, sort: str | None = None) -> dict[str, Any]:
    """The results document (schema hpcml.farm.results/1); ``sort``: a parameter, metric or
    column name, ``-name`` for descending; rows without it go last."""
    farm, view = open_view(path)
    alive = Liveness(farm.path, farm.settings.lease, None)
    rows: list[dict[str, Any]] = []
    for tid in view.order:
        task, st = view.tasks[tid], view.state(tid)
        end = st.latest_end() or {}
        attempt = st.claimed if st.claimed in st.ends else max(st.ends, default=0)
        seconds = (float(end["end"]) - float(end["start"])) if end.get("start") is not None else None
        task_dir = farm.path / TASK_DIRS / str(tid) if farm.settings.task_dirs else None
        res = attempt_results(farm.path, f"{tid}.{attempt}", task_dir, farm.settings.metrics_file) if attempt \
            else AttemptResults()
        rows.append({"id": tid, "group": task.group, "state": task_state(view, tid, farm.settings, alive),
                     "attempts": st.claimed, "exit_code": end.get("exit_code"), "node": end.get("node"),
                     "gpu": end.get("gpu"), "seconds": seconds, "params": task.params,
                     "steps": res.steps, "metrics": res.metrics, "metric_ranks": res.ranks,
                     "metric_sources": res.sources, "metric_non_finite": res.non_finite,
                "logs": [got.to_json() for got in res.logs],
                     "command": task.command})
    params = list(dict.fromkeys(k for r in rows for k in r["params"]))
    metrics = sorted({k for r in rows for k in r["metrics"]})
    if sort:
        key, reverse = sort.lstrip("-"), sort.startswith("-")
        if key not in params and key not in metrics and key not in COLUMNS:
            raise UsageError(f"no parameter, metric or column named '{key}' (parameters: "
                             f"{', '.join(params) or 'none'}; metrics: {', '.join(metrics) or 'none'})", key="sort")

        def value(r: dict[str, Any]) -> Any:
            if key in params or key in metrics:
                return r["metrics"].get(key, r["params"].get(key))
            if key in ("optimizer_steps", "optimizer_steps_per_s"):
                return (r["steps"] or {}).get("count" if key == "optimizer_steps" else "per_s")
            return r.get(key)
        have = [r for r in rows if value(r) is not None]
        have.sort(key=lambda r: (isinstance(value(r), str), value(r)), reverse=reverse)
        rows = have + [r for r in rows if value(r) is None]
    return {"schema": RESULTS_SCHEMA, "farm": str(farm.path), "params": params, "metrics": metrics,
            "metric_rule": RULE, "rows": rows}


#: what makes a spreadsheet read a cell as a formula (OWASP's list)
FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")


def _cell(v: Any) -> Any:
    """A value as a CSV cell a spreadsheet shows as text: a metric name a job logged or a
    value it wrote that starts like a formula (``=HYPERLINK(...)``) gets a leading ``'``;
    a number, even a negative one written as text, stays as it is."""
    if not isinstance(v, str) or not v.startswith(FORMULA_LEADS):
        return v
    try:
        float(v)
        return v
    except ValueError:
        return "'" + v


def to_csv(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(map(_cell, ["id", "group", "state", "attempts", "exit_code", "seconds", "optimizer_steps",
                           "optimizer_steps_per_s", *doc["params"],
                           *(m for m in doc["metrics"] if m not in doc["params"])]))
    for r in doc["rows"]:
        st = r.get("steps") or {}
        w.writerow(map(_cell, [r["id"], r["group"] or "", r["state"], r["attempts"],
                               "" if r["exit_code"] is None else r["exit_code"],
                               "" if r["seconds"] is None else f"{r['seconds']:.3f}", st.get("count", ""),
                               "" if st.get("per_s") is None else st["per_s"],
                               *(r["params"].get(p, "") for p in doc["params"]),
                               *((r.get("metric_non_finite") or {}).get(m) or r["metrics"].get(m, "")
                                 for m in doc["metrics"] if m not in doc["params"])]))
    return buf.getvalue()
