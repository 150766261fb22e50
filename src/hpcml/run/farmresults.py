"""``hpcml farm results``: one row per task, its parameters and the last value of each
metric it logged through ``hpcml.observe.log`` (read from observe/ID.A, the directory the
worker gave the attempt in HPCML_OBSERVE_DIR, and from runs/ID.A/observe where the task is
an ``hpcml run``), so a sweep's best run is one sort away.

It reads the farm, observe stores and run job directories, so it sits with ``run`` (the
top of the library layers), not in ``farm``, which run, observe and ckpt build on."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from hpcml.cluster.taskenv import run_dirs
from hpcml.errors import UsageError
from hpcml.farm.lease import Liveness
from hpcml.farm.model import OBSERVE, RESULTS_SCHEMA
from hpcml.farm.status import open_view, task_state
from hpcml.observe.progress import RULE, Last, last_values


def last_metrics(directory: str) -> dict[str, Last]:
    """The last value of each user metric in one attempt's observe directory, rank 0's
    (``hpcml.observe.progress.RULE``): each rank logs its own loss, and the one whose value
    is shown is said, never whichever rank wrote last."""
    if not os.path.isdir(directory):
        return {}
    from hpcml.observe.series import from_table
    from hpcml.observe.store import read_job
    try:
        table = read_job(directory).table
    except UsageError:
        return {}
    return last_values(from_table(table))


def attempt_metrics(farm: Path, name: str) -> dict[str, Last]:
    """An attempt's metrics: what its own ``observe.log`` wrote (observe/ID.A), then what
    the ranks of each ``hpcml run`` in it logged (runs/ID.A[-N]/observe, those runs' stores)."""
    from hpcml.run.jobdir import observe_dir
    out = last_metrics(str(farm / OBSERVE / name))
    for d in run_dirs(farm, name):
        out.update(last_metrics(str(observe_dir(d))))
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
        last = attempt_metrics(farm.path, f"{tid}.{attempt}") if attempt else {}
        rows.append({"id": tid, "group": task.group, "state": task_state(view, tid, farm.settings, alive),
                     "attempts": st.claimed, "exit_code": end.get("exit_code"), "node": end.get("node"),
                     "gpu": end.get("gpu"), "seconds": seconds, "params": task.params,
                     "metrics": {k: v.value for k, v in last.items()},
                     "metric_ranks": {k: v.rank for k, v in last.items()}, "command": task.command})
    params = list(dict.fromkeys(k for r in rows for k in r["params"]))
    metrics = sorted({k for r in rows for k in r["metrics"]})
    if sort:
        key, reverse = sort.lstrip("-"), sort.startswith("-")
        if key not in params and key not in metrics and key not in ("id", "group", "state", "attempts",
                                                                      "exit_code", "node", "seconds"):
            raise UsageError(f"no parameter, metric or column named '{key}' (parameters: "
                             f"{', '.join(params) or 'none'}; metrics: {', '.join(metrics) or 'none'})", key="sort")

        def value(r: dict[str, Any]) -> Any:
            return r["metrics"].get(key, r["params"].get(key, r.get(key)))
        have = [r for r in rows if value(r) is not None]
        have.sort(key=lambda r: (isinstance(value(r), str), value(r)), reverse=reverse)
        rows = have + [r for r in rows if value(r) is None]
    return {"schema": RESULTS_SCHEMA, "farm": str(farm.path), "params": params, "metrics": metrics,
            "metric_rule": RULE, "rows": rows}


def to_csv(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["id", "group", "state", "attempts", "exit_code", "seconds", *doc["params"], *doc["metrics"]])
    for r in doc["rows"]:
        w.writerow([r["id"], r["group"] or "", r["state"], r["attempts"], "" if r["exit_code"] is None else r["exit_code"],
                    "" if r["seconds"] is None else f"{r['seconds']:.3f}",
                    *(r["params"].get(p, "") for p in doc["params"]), *(r["metrics"].get(m, "") for m in doc["metrics"])])
    return buf.getvalue()
