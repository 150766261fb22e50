"""``hpcml farm status``: how far a farm is, from its directory alone (nothing is written).

States of a task: ``pending`` (not started, or waiting for its dependencies), ``running``
(an attempt claimed and not ended, its worker alive), ``lost`` (claimed, not ended, its
worker dead or its Slurm job over, e.g. scancel'ed: the next ``farm run`` reruns it), ``damaged`` (its last claim or end file is
not a record: rerun too), ``retrying`` (an attempt failed; another will run after the
backoff), ``ok``, ``failed`` (retries spent, as the last run counted them: ``--retries``),
``blocked`` (a dependency failed for good).
The ETA is the remaining tasks times the mean duration of the finished ones, over the
number running now (or one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpcml.farm import store
from hpcml.farm.claim import TaskState, View, claim_damaged
from hpcml.farm.lease import Liveness
from hpcml.farm.model import CLAIMS, DAMAGED, LOGS, STATUS_SCHEMA, WORKERS, Settings

STATES = ("pending", "running", "lost", "damaged", "retrying", "ok", "failed", "blocked")


def task_state(view: View, tid: int, settings: Settings, alive: Liveness | None = None) -> str:
    """The state of one task; ``alive`` (status) tells running from lost attempts."""
    st = view.state(tid)
    if st.ok:
        return "ok"
    if st.running:
        if alive is None:
            return "running"
        if claim_damaged(f"{view.path}/{CLAIMS}/{tid}.{st.claimed}"):
            return "damaged"
        owner = view.owner(tid, st.claimed)
        return "lost" if owner and alive.seems_dead(str(owner.get("worker", ""))) else "running"
    if (st.latest_end() or {}).get("outcome") == DAMAGED and not st.gave_up(settings, view.recorded):
        return "damaged"
    if st.gave_up(settings, view.recorded):
        return "failed"
    if view.deps(tid, settings) == "blocked":
        return "blocked"
    return "retrying" if st.ends else "pending"


def open_view(path: str | os.PathLike) -> tuple[store.Farm, View]:
    farm = store.load(path)
    view = View(farm, recorded=True)
    view.refresh()
    return farm, view


def damaged_files(path: str | os.PathLike) -> list[str]:
    """One line per claim or end file that is not a record (``farm run`` warns of each
    once, then reruns its task)."""
    farm, view = open_view(path)
    out = []
    for tid in view.order:
        st = view.state(tid)
        end = st.latest_end() or {}
        if end.get("outcome") == DAMAGED:
            out.append(f"{end['reason']}: task {tid} is run again")
        claim = f"{farm.path}/{CLAIMS}/{tid}.{st.claimed}"
        if st.running and claim_damaged(claim):
            out.append(f"{claim} is damaged (not a complete claim record): task {tid} is run again "
                       "after a lease")
    return out


def _last(st: TaskState) -> dict[str, Any]:
    return st.latest_end() or {}


def live_workers(directory: Path, alive: Liveness) -> int:
    """Workers not seen dead (for display): a heartbeat younger than a lease by this host's
    clock and, on this host, a live pid (a worker killed with kill -9 leaves its file)."""
    try:
        names = [e.name for e in os.scandir(directory) if not e.name.startswith(".")]
    except FileNotFoundError:
        return 0
    return sum(1 for wid in names if not alive.seems_dead(wid))


def summarize(path: str | os.PathLike) -> dict[str, Any]:
    """The status document (schema hpcml.farm.status/1)."""
    farm, view = open_view(path)
    s = farm.settings
    counts = dict.fromkeys(STATES, 0)
    running, failed, durations = [], [], []
    alive = Liveness(farm.path, s.lease, None)
    for tid in view.order:
        state = task_state(view, tid, s, alive)
        counts[state] += 1
        st = view.state(tid)
        if state == "running":
            owner = view.owner(tid, st.claimed)
            running.append({"id": tid, "attempt": st.claimed, "node": owner.get("node"),
                            "gpu": owner.get("gpu"), "worker": owner.get("worker"), "start": owner.get("start")})
        elif state == "failed":
            end = _last(st)
            failed.append({"id": tid, "attempts": st.claimed, "outcome": end.get("outcome"),
                           "exit_code": end.get("exit_code"), "signal": end.get("signal"),
                           "stderr": str(Path(farm.path) / LOGS / f"{tid}.{st.claimed}.err")})
        elif state == "ok":
            end = _last(st)
            if end.get("start") is not None and end.get("end") is not None:
                durations.append(float(end["end"]) - float(end["start"]))
    remaining = counts["pending"] + counts["running"] + counts["lost"] + counts["damaged"] + counts["retrying"]
    workers = live_workers(farm.path / WORKERS, alive)
    eta = None
    if durations and remaining and workers:        # no live worker: nothing to time
        eta = remaining * (sum(durations) / len(durations)) / max(1, counts["running"])
    elif not remaining:
        eta = 0.0
    return {"schema": STATUS_SCHEMA, "farm": str(farm.path), "total": len(view.order), "counts": counts,
            "done": remaining == 0, "eta_s": eta, "workers": workers, "bad_nodes": sorted(view.bad_nodes),
            "running": running, "failed": failed, "settings": s.to_json()}


class Progress:
    """Tasks final out of all, for a progress bar: reads only the end records it has not
    seen (a View kept between calls)."""

    def __init__(self, path: str | os.PathLike):
        self.farm, self.view = open_view(path)

    def __call__(self) -> tuple[int, int]:
        self.view.refresh()
        s = self.farm.settings
        return sum(1 for t in self.view.order if self.view.final(t, s)), len(self.view.order)
