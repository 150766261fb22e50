"""Slurm's record of a job from accounting when its id was used before (``sacct
--duplicates``, sacct(1): "some job numbers will probably appear more than once ... but
refer to different jobs"): only the newest job's rows count, a requeue's rows all do.

sacct is a stand-in here answering as sacct -P -n does, oldest submitted first (sacct's
order); the real sacct is ``test_jobrecord_slurm.py``'s.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from hpcml.cluster import jobrecord, slurm
from hpcml.errors import SlurmError


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


DAY = 86400.0
NOW = datetime(2025, 6, 1, 12).timestamp()


def _row(user: str, uid: int, nodes: str, submit: float, start: float, end: float | None, state: str) -> tuple:
    return ("123", "123", user, str(uid), nodes, _iso(submit), _iso(start), _iso(end) if end else "Unknown", state)


def _steps(row: tuple) -> list[tuple]:
    """A job's allocation row and its steps' (sacct without -X), which the record leaves out."""
    return [row, ("123.batch", "123.batch", "", "", row[4], row[5], row[6], row[7], row[8])]


@pytest.fixture
def accounting(monkeypatch):
    """Set ``rows`` (sacct's rows, oldest first); ``jobcomp``: answer as a cluster without a
    database, from the completion log (no JobIDRaw, no Submit)."""
    answer: dict = {"rows": [], "jobcomp": False}

    def sacct(job_id, fields, *, jobcomp=False, timeout=20.0, extra=()):
        if answer["jobcomp"] and not jobcomp:
            raise SlurmError("sacct: error: Slurm accounting storage is disabled")
        rows = [r for row in answer["rows"] for r in _steps(row)]
        if jobcomp:
            cols = jobrecord._SACCT_FIELDS
            return [{f: r[cols.index(f)] for f in fields} for r in rows if "." not in r[0]]
        assert "--duplicates" in extra
        return [dict(zip(fields, r)) for r in rows]

    monkeypatch.setattr(slurm, "sacct", sacct)
    return answer


@pytest.mark.parametrize("jobcomp", [False, True])
def test_another_users_earlier_job_with_the_id_is_not_the_newest_owners(accounting, jobcomp):
    accounting["jobcomp"] = jobcomp
    accounting["rows"] = [_row("bob", 1002, "gpu[007-008]", NOW - 90 * DAY, NOW - 90 * DAY, NOW - 89 * DAY, "COMPLETED"),
                          _row("alice", 1001, "gpu001", NOW - 4 * 3600, NOW - 3 * 3600, NOW - 3600, "COMPLETED")]
    rec = jobrecord.lookup("123", via=("sacct",))
    assert rec is not None and (rec.user, rec.uid, rec.nodes, rec.restarts) == ("alice", 1001, frozenset({"gpu001"}), 0)
    assert rec.start == NOW - 3 * 3600 and rec.end == NOW - 3600
    assert rec.source == ("jobcomp" if jobcomp else "sacct")


def test_the_same_users_older_job_with_the_id_is_not_a_run_of_this_one(accounting):
    accounting["rows"] = [_row("alice", 1001, "gpu007", NOW - 40 * DAY, NOW - 40 * DAY, NOW - 39 * DAY, "COMPLETED"),
                          _row("alice", 1001, "gpu001", NOW - 4 * 3600, NOW - 3 * 3600, None, "RUNNING")]
    rec = jobrecord.lookup("123", via=("sacct",))
    assert rec is not None and (rec.nodes, rec.restarts, rec.start, rec.end) == \
        (frozenset({"gpu001"}), 0, NOW - 3 * 3600, None)


def test_a_requeued_jobs_runs_are_all_its_own(accounting):
    """Slurm resets Submit when it requeues a job (sacct(1), "Submit"): each earlier run
    ended just before the next was submitted, in whatever state the requeue left it."""
    first, requeued, again = NOW - 10 * 3600, NOW - 8 * 3600, NOW - 2 * 3600
    accounting["rows"] = [_row("alice", 1001, "n[1-2]", first - 60, first, requeued, "NODE_FAIL"),
                          _row("alice", 1001, "n[2-3]", requeued + 5, requeued + 600, again, "PREEMPTED"),
                          _row("alice", 1001, "n[3-4]", again + 30, again + 60, None, "RUNNING")]
    rec = jobrecord.lookup("123", via=("sacct",))
    assert rec is not None and (rec.nodes, rec.restarts, rec.start, rec.state) == \
        (frozenset({"n1", "n2", "n3", "n4"}), 2, first, "RUNNING")
