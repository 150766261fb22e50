"""Why Slurm stopped a job, in Slurm's own words, asked (``scontrol show job``) as soon as
``hpcml run`` gets TERM or INT from outside, within the ``KillWait`` grace the TERM gives.

While the steps are being signalled the job shows ``JobState=COMPLETING``, and the reason
is in ``Reason``: ``TimeLimit`` at the time limit, none after ``scancel`` (seen on Slurm
23.02: ``JobState=COMPLETING Reason=TimeLimit`` and ``Reason=None``). A preempted job shows
``Reason=None`` too, with a ``PreemptTime`` (``None`` for every other job; seen on 23.02 with
``PreemptMode=CANCEL``). A job still RUNNING was not stopped by Slurm (a TERM from someone
else): no reason is given then."""

from __future__ import annotations

import logging

from hpcml.cluster import slurm
from hpcml.errors import SlurmError

log = logging.getLogger(__name__)

#: Slurm's state -> the reason as a report tells it
WHY = {"TIMEOUT": "Slurm's time limit", "CANCELLED": "scancel (the job was cancelled)",
       "PREEMPTED": "preemption by another job", "NODE_FAIL": "a node failure", "DEADLINE": "the job's deadline",
       "OUT_OF_MEMORY": "the job's memory limit", "REQUEUED": "a requeue"}


#: Slurm's ``Reason`` while the job completes -> the state it ends in
REASONS = {"TimeLimit": "TIMEOUT", "Deadline": "DEADLINE", "NodeDown": "NODE_FAIL", "NodeFail": "NODE_FAIL",
           "Preempted": "PREEMPTED", "None": "CANCELLED"}


def state(job_id: str | None, timeout: float = 5.0) -> str | None:
    """The state Slurm is ending ``job_id`` in (TIMEOUT, CANCELLED, PREEMPTED, ...); None
    outside Slurm, when Slurm cannot be asked, or when it is not ending the job."""
    if not job_id:
        return None
    try:
        recs = slurm.scontrol_show("job", str(job_id), timeout=timeout)
    except (SlurmError, OSError) as exc:
        log.debug("hpcml run: Slurm's job state not read: %s", exc)
        return None
    if not recs:
        return None
    got = (recs[0].get("JobState") or "").split()[0] if recs[0].get("JobState") else ""
    reason = (recs[0].get("Reason") or "").split()[0] if recs[0].get("Reason") else ""
    if got == "COMPLETING":
        preempted = (recs[0].get("PreemptTime") or "None").split()[0] not in ("None", "Unknown", "")
        if reason == "None" and preempted:
            return "PREEMPTED"
        return REASONS.get(reason) or ("PREEMPTED" if "reempt" in reason else None)
    # a job that still runs (``slurm.ALIVE``) was not stopped by Slurm: a TERM from someone else
    return got if got and got not in slurm.ALIVE and got.replace("_", "").isalpha() and got.isupper() else None


def told(state_: str | None) -> str | None:
    return WHY.get(state_, f"Slurm's job state {state_}") if state_ else None
