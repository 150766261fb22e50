"""Job summaries shaped exactly as ``hpcml.run.summary.build`` writes them, for the
collector's and the centre report's tests and benchmark (hostile ones too, so not validated
here); ``test_jobs`` checks the shape against the summary of a real job's directory."""

from __future__ import annotations

import time
from typing import Any


def event(node: str, rank: int | None = None, attempt: int = 0, detail: str = "") -> dict[str, Any]:
    return {"node": node, "rank": rank, "attempt": attempt, "detail": detail}


def summary(job: str, attempt: int = 0, *, nodes: list[str] | None = None, user: str | None = "alice",
            account: str | None = "a1", ended: float | None = None, hours: float = 1.0, gpus_per_node: int = 4,
            score: float | None = 0.5, bound: str | None = "memory", outcome: str = "completed",
            stragglers: list[dict] | None = None, culprits: list[dict] | None = None,
            excluded: list[dict] | None = None, lost: list[dict] | None = None,
            time_lost_s: float | None = None, cluster: str = "alps", crashed: list[dict] | None = None,
            vetting: list[dict] | None = None, hangs: int = 0, requeues: int | None = None,
            ettr: float | None = None, why: str | None = None, counted: bool = True) -> dict[str, Any]:
    """A summary as ``hpcml.run.summary`` writes it; ``ettr``: the share of the allocation's
    node time that trained (its ledger), the rest not training, mostly ``why``; not
    ``counted``: no rank ran to say how many GPUs the job had (no score either), so its GPUs
    and GPU-hours are left out and every other GPU-hour figure is null."""
    nodes = list(nodes or ["nid001", "nid002"])
    for e in (stragglers or []) + (culprits or []) + (excluded or []) + (lost or []) + (crashed or []):
        if e["node"] not in nodes:             # a job names only nodes it held
            nodes.append(e["node"])
    ended = time.time() - 60 if ended is None else ended
    gpus = gpus_per_node * len(nodes)
    if not counted:
        score = None
    return {
        "schema": "hpcml.job.summary/1", "cluster": cluster, "job_id": job, "attempt": attempt,
        "user": user, "account": account, "partition": "normal", "started": ended - hours * 3600,
        "ended": ended, "duration_s": hours * 3600, "exit_code": 5 if outcome == "hung" else 0 if outcome == "completed"
        else 1, "outcome": outcome, "nodes": nodes, "ntasks": gpus,
        **({"gpus": gpus if score is not None else 0} if counted else {}),     # uncounted: left out, as sent
        **({"requeues": requeues} if requeues is not None else {}),
        "excluded": excluded or [], "stragglers": stragglers or [], "culprits": culprits or [], "lost": lost or [],
        "crashed": crashed or [], "vetting": vetting or [], "hangs": hangs,
        "gpu": {"score": score, "bound": bound if score is not None else None},
        "throughput": {"median": 1234.5, "unit": "samples/s"}, "attempts": attempt + 1,
        "time_lost_s": time_lost_s, "ettr": None, "ettr_bound": None, "productive_s": None,
        "node_hours": hours * len(nodes),
        **({"gpu_hours": hours * gpus if score is not None else 0.0} if counted else {}),
        "gpu_hours_lost": (time_lost_s / 3600 * gpus) if time_lost_s is not None and score is not None else None,
        **({"ettr": ettr, "node_hours_not_training": round(hours * len(nodes) * (1 - ettr), 4),
            "gpu_hours_not_training": round(hours * gpus * (1 - ettr), 4) if score is not None else None,
            "not_training_why": why} if ettr is not None else
           {"node_hours_not_training": None, "gpu_hours_not_training": None, "not_training_why": None}),
    }


def proven(doc: dict[str, Any], uid: int | None = None):
    """A summary as the collector stores it once MUNGE proved its user (and Slurm its job):
    for tests that write the store directly, without the HTTP path that proves senders."""
    from hpcml.centre.summaries import Proven
    from hpcml.centre.summaries import Received as JobSummary
    user = doc.get("user")
    return JobSummary.model_validate(doc).proven(
        Proven(how="munge", user=user, uid=uid if uid is not None else 1000 + sum(map(ord, user or "")),
               verified=True))
