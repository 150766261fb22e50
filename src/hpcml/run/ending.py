"""How an attempt ended, from what its ranks left in the job directory.

The exit code of ``hpcml run`` is the first failing rank's (by when its command ended),
else the launch's, else 0; an attempt Slurm requeued did not fail by the ranks the requeue
stopped. ``conclude`` completes, for the next attempt, the record of one whose launcher
the requeue killed before it could write its end.

A rank that ended once the attempt was being stopped (``stop_began``: hpcml run stopped it
for a hang, a straggler or a lost node, or got TERM or INT from outside and passed it on)
was stopped, not failed: it gives the exit code as before (Ctrl-C's 130), but it is not the
attempt's ``first_failure``, and the report does not list it as a failed rank.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpcml import logs
from hpcml.cluster import requeue
from hpcml.jobmodel import Attempt, FirstFailure, Requeued, RunRecord
from hpcml.run.config import HANG
from hpcml.run.jobdir import attempt_dir, log_path, rank_meta, write_own
from hpcml.run.ranklog import failure_line

log = logs.get(__name__)


def stop_began(record: Attempt) -> float | None:
    """When the attempt began to be stopped (hpcml run's own stop, or the first TERM or INT
    it got from outside), by the launcher's clock; None when it was not."""
    return min((t for t in (record.stopped_at, record.signalled_at) if t is not None), default=None)


def failed_ranks(d: Path, attempt: int = 0, requeued: bool = False, stopped: float | None = None) -> dict[int, int]:
    """Rank -> exit code of the ranks that failed: ended non-zero, but not by Slurm's
    requeue (``requeued``: its TERM, its SIGKILL) nor once the attempt was being stopped
    (``stopped``, ``stop_began``: the recorder notes a rank's end after its command ended)."""
    return {int(f[0]): f[1] for f in _failures(d, attempt, requeued, stopped) if f[0] is not None}


def _failures(d: Path, attempt: int, requeued: bool, stopped: float | None) -> list[tuple]:
    failed = []
    for m in rank_meta(d, attempt):
        ec, end = m.get("exit_code"), m.get("end")
        if not isinstance(ec, int) or ec == 0 or (requeued and ec in requeue.KILLED_BY_REQUEUE):
            continue
        if stopped is not None and isinstance(end, (int, float)) and end >= stopped:
            continue
        failed.append((m.get("rank"), ec, end or float("inf"), m.get("node"), signal_name(m.get("signal")),
                       m.get("oom_kill") is True or None))
    return failed


def first_failure(d: Path, attempt: int = 0, requeued: bool = False, stopped: float | None = None) -> FirstFailure | None:
    """The rank that failed first (by when its command ended), from the recorder's metadata.
    ``requeued``: the ranks that Slurm's requeue ended (TERM, SIGKILL) did not fail;
    ``stopped``: nor did those that ended once the attempt was being stopped (``stop_began``)."""
    failed = [(end, rank, ec, node, sig, oom) for rank, ec, end, node, sig, oom in _failures(d, attempt, requeued,
                                                                                             stopped)]
    if not failed:
        return None
    end, rank, ec, node, sig, oom = min(failed, key=lambda f: (f[0], f[1] if f[1] is not None else 0))
    return FirstFailure(rank=rank, exit_code=ec, node=node, end=None if end == float("inf") else end,
                        failed_ranks=len(failed), signal=sig, oom_killer=oom)


def signal_name(number: object) -> str | None:
    """SIGKILL for 9: the signal that ended a rank's command (the recorder's ``signal``),
    by its name; None when none did (an exit code of 137 the program chose is not one)."""
    import signal
    if not isinstance(number, int) or isinstance(number, bool):
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}" if 0 < number < 128 else None


def requeued(d: Path, record: Attempt, ask_slurm: bool) -> Requeued | None:
    found = requeue.find(attempt_dir(d, record.attempt), record.job_id, record.restart_of, ask_slurm)
    return None if found is None else Requeued.model_validate(found)


def conclude(d: Path, prev: RunRecord, restart: int) -> Attempt:
    """The previous attempt's record, completed where its launcher did not get to (Slurm's
    requeue kills it ``KillWait`` seconds after TERM): requeued it was, since this attempt
    runs under a higher restart count."""
    done = prev.as_attempt()
    if done.requeued is not None:
        return done
    done.requeued = requeued(d, done, ask_slurm=False) or Requeued(by="slurm", restart_count=restart)
    # its launcher's own ending stands unless the requeue's 143/137 made it: a vet abort (4)
    # or an srun that could not launch (no rank recorded) was the attempt's own exit
    if done.ended is None or done.exit_code in requeue.KILLED_BY_REQUEUE:
        first = first_failure(d, done.attempt, requeued=True)   # the ranks the requeue stopped did not fail
        done.exit_code = first.exit_code if first else 0
        done.first_failure = first_failure(d, done.attempt, requeued=True, stopped=stop_began(done))
    if done.ended is None:
        ends = [m["end"] for m in rank_meta(d, done.attempt) if isinstance(m.get("end"), (int, float))]
        done.ended = max(ends, default=None)
        done.end_recorded_by_next_attempt = True
    return done


def _scheduled(mode: str) -> bool:
    """Whether the run's backend ran across the allocation's nodes, which the scheduler may
    have requeued (then Slurm is asked)."""
    from hpcml.registry import UnknownName
    from hpcml.run.backends import BACKENDS
    try:
        return BACKENDS.get(mode).spans_nodes
    except UnknownName:              # a site's backend no longer installed: ask, to be safe
        return True


def finish(d: Path, record: RunRecord, rc: int) -> tuple[int, bool]:
    """Write the attempt's end: (its exit code, whether run.json took it). The exit code is
    the first failing rank's; in an attempt that was requeued the ranks the requeue stopped
    are not failures, and with none other it is 0. Not taken: a later attempt of this Slurm
    job holds the directory (Slurm requeued it while this launcher still ran)."""
    asked = _scheduled(record.mode) and (rc != 0 or "SIGTERM" in (record.signals_forwarded or ()))
    again = requeued(d, record, ask_slurm=asked)
    ended = first_failure(d, record.attempt, requeued=again is not None)      # the exit code: stopped ranks too
    first = first_failure(d, record.attempt, requeued=again is not None, stopped=stop_began(record))
    code = ended.exit_code if ended else (0 if again else rc)
    if record.hang is not None and record.hang.action == "stop":
        code = HANG                                       # the watch stopped a hung job
    record.ended, record.exit_code, record.first_failure = time.time(), code, first
    record.launcher_exit_code, record.requeued = rc, again
    taken = write_own(d, record)
    if not taken:
        log.info(f"hpcml run: {d} now holds a later attempt of this job (Slurm requeued it while this launcher still "
              "ran); this attempt's end is not written there")
    if again:
        log.info(f"hpcml run: attempt {record.attempt} {requeue.describe(again.to_json())}; Slurm runs the job "
              f"again, as the next attempt in {d}")
    if first and code != HANG and not record.stopped_at:     # the ranks it stopped did not fail
        err = log_path(d, int(first.rank or 0), "err")
        killed = f", killed by {first.signal}" + (" from the kernel's OOM killer" if first.oom_killer else "") \
            if first.signal else ""
        log.warning(f"hpcml run: rank {first.rank} failed first (exit {first.exit_code}{killed}); see {err}")
        last = failure_line(err, record.attempt, None if first.signal else first.exit_code)
        if last:
            log.info(f"  {last}")          # the cause, e.g. a command that cannot start
    return code, taken
