"""A job as Slurm itself records it: owner, nodes, state, restarts, start and end.

What a job's own files say about it is the sender's word; this is the cluster's. Read from
``scontrol show job`` while slurmctld still holds the job (running, and ``MinJobAge``
after it ended), else from accounting (``sacct`` over slurmdbd), else from the job
completion log (``sacct -c``, the ``jobcomp/filetxt`` plugin of clusters without a
database). Every requeue of a job is a restart: ``Restarts=`` in scontrol, one record per
run in the completion log, ``sacct --duplicates`` in accounting.

Both also hold the other jobs that once had the id (Slurm's ids restart after its state is
lost, or wrap at ``MaxJobId``): a record is read from the newest job's rows only
(``_newest_job``), so that no one can claim an earlier job's nodes or time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from hpcml import logs
from hpcml.cluster import slurm
from hpcml.cluster.hostlist import expand
from hpcml.errors import SlurmError

log = logs.get(__name__)

_JOB_ID = re.compile(r"^[0-9]{1,12}(_[0-9]{1,9})?$")
_OWNER = re.compile(r"^(?P<name>[^()]*)(?:\((?P<uid>[0-9]+)\))?$")
_NOT_FOUND = re.compile(r"\bjob \S+ not found")        # scontrol: "Job 123_0 not found"
_SACCT_FIELDS = ("JobIDRaw", "JobID", "User", "UID", "NodeList", "Submit", "Start", "End", "State")
_COMP_FIELDS = ("JobID", "User", "UID", "NodeList", "Start", "End", "State")
#: the longest a requeued run's row may end before the next run's ``Submit`` (which Slurm
#: resets when it requeues the job: sacct(1), "Submit"); longer, and the earlier row is another
#: job that had the id. Slurm's own guess for federated duplicates: ids never roll in a day
REQUEUE_GAP_S = 86400.0
_SAME_CLOCK_S = 60.0            # both times are slurmctld's: only their rounding differs


@dataclass(frozen=True)
class JobRecord:
    job_id: str                 # Slurm's own id (an array task's JobId, not ARRAY_TASK)
    user: str
    uid: int | None
    nodes: frozenset[str]       # every node the job ran on, over all its runs where known
    state: str
    restarts: int
    start: float | None
    end: float | None
    source: str                 # scontrol | sacct | jobcomp


def is_job_id(value: str) -> bool:
    """A Slurm job id (``123``, an array task ``123_4``): what Slurm can be asked about."""
    return bool(_JOB_ID.match(value))


def _time(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None", "(null)", "N/A"):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()     # Slurm prints local time
    except ValueError:
        return None


def _owner(value: str, uid: str = "") -> tuple[str, int | None]:
    m = _OWNER.match(value.strip())
    name, num = (m.group("name"), m.group("uid")) if m else (value, None)
    num = num or (uid if uid.strip().isdigit() else None)
    return name.strip(), int(num) if num is not None else None


def _nodes(value: str | None) -> set[str]:
    if not value or value in ("(null)", "None assigned", "Unknown"):
        return set()
    try:
        return set(expand(value))
    except ValueError:
        return set()


def _from_scontrol(job_id: str, timeout: float) -> JobRecord | None:
    try:
        recs = slurm.scontrol_show("job", job_id, timeout=timeout)
    except SlurmError as exc:
        if _no_such_job(exc):
            return None
        raise
    rec = next((r for r in recs if r.get("JobId") == job_id.split("_")[0] or r.get("JobId") == job_id
                or f"{r.get('ArrayJobId')}_{r.get('ArrayTaskId')}" == job_id), None)
    if rec is None:
        return None
    user, uid = _owner(rec.get("UserId", ""))
    restarts = rec.get("Restarts", "0")
    return JobRecord(rec.get("JobId") or job_id, user, uid, frozenset(_nodes(rec.get("NodeList"))),
                     rec.get("JobState", "").split()[0] if rec.get("JobState") else "",
                     int(restarts) if restarts.isdigit() else 0, _time(rec.get("StartTime")),
                     _time(rec.get("EndTime")), "scontrol")


def _no_such_job(exc: SlurmError) -> bool:
    """Slurm's answer that the id names no job it knows (an array task of a job that is not
    an array, an id past its records): a fact about the job, not an outage."""
    text = str(exc).lower()
    return "invalid job id" in text or "invalid jobid" in text or bool(_NOT_FOUND.search(text))


def _from_sacct(job_id: str, timeout: float) -> JobRecord | None:
    try:
        rows = slurm.sacct(job_id, _SACCT_FIELDS, timeout=timeout, extra=("--duplicates",))
        source, key = "sacct", "JobIDRaw"
    except SlurmError as exc:
        if _no_such_job(exc):
            return None
        if "accounting storage is disabled" not in str(exc).lower():
            raise
        try:
            rows = slurm.sacct(job_id, _COMP_FIELDS, jobcomp=True, timeout=timeout)
        except SlurmError as exc2:
            if _no_such_job(exc2):
                return None
            raise
        source, key = "jobcomp", "JobID"
    runs = _newest_job(job_id, [r for r in rows if r.get(key) == job_id or r.get("JobID") == job_id],
                       requeue_submits=source == "sacct")
    if not runs:
        return None
    last = runs[-1]
    user, uid = _owner(last.get("User", ""), last.get("UID", ""))
    nodes: set[str] = set()
    for r in runs:
        nodes |= _nodes(r.get("NodeList"))
    raw = last.get("JobIDRaw") or last.get("JobID") or job_id
    return JobRecord(raw, user, uid, frozenset(nodes), last.get("State", "").split()[0] if last.get("State") else "",
                     len(runs) - 1, _time(runs[0].get("Start")), _time(last.get("End")), source)


def _newest_job(job_id: str, runs: list[dict[str, str]], requeue_submits: bool) -> list[dict[str, str]]:
    """The rows of the newest job with the id, oldest run first: the last row and each row
    before it that ran for the same owner (a job never changes owner) and, where ``Submit``
    is the requeue's (accounting; the completion log prints the start there), ended within
    ``REQUEUE_GAP_S`` before the next run was submitted. ``runs``: oldest submitted first
    (sacct's order)."""
    if not runs:
        return []
    kept = [runs[-1]]
    owner = _owner(runs[-1].get("User", ""), runs[-1].get("UID", ""))
    for row in reversed(runs[:-1]):
        name, uid = _owner(row.get("User", ""), row.get("UID", ""))
        if (uid != owner[1]) if uid is not None and owner[1] is not None else (name != owner[0] or not name):
            break                           # another user's job that once had the id
        if requeue_submits:
            submitted, ended = _time(kept[0].get("Submit")), _time(row.get("End"))
            if submitted is None or ended is None or not -_SAME_CLOCK_S <= submitted - ended <= REQUEUE_GAP_S:
                break                       # an older job of the same user that had the id
        kept.insert(0, row)
    if len(kept) < len(runs):
        log.debug("job %s: %d of Slurm's %d rows are earlier jobs with the id, left out", job_id,
                  len(runs) - len(kept), len(runs))
    return kept


SOURCES = ("scontrol", "sacct")


def lookup(job_id: str, *, timeout: float = 10.0, via: tuple[str, ...] = SOURCES) -> JobRecord | None:
    """Slurm's record of ``job_id``; None when Slurm has none. ``SlurmError`` when Slurm
    cannot be asked (not installed, controller down): the caller cannot tell, and must
    not take that for "no such job". ``via``: which of Slurm's records to read, in order
    (``sacct`` is accounting, else the job completion log)."""
    if not is_job_id(job_id):
        return None
    readers = {"scontrol": _from_scontrol, "sacct": _from_sacct}
    for name in via:
        rec = readers[name](job_id, timeout)
        if rec is not None:
            return rec
    return None
