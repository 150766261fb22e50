"""The job directory of ``hpcml run``: one place for everything a job left behind.

::

    run.json          what ran: command, mode, nodes, excluded nodes, rendezvous, launch line,
                      start, end, exit code and the first failing rank (schema hpcml.run/1)
    vet/              the vet report (report.json, bad-nodes, good-nodes), with --vet
    env.json          the resolved container environment, with --env
    observe/          the observe job store: steps, metrics, host and GPU samples per rank
                      (hpcml score reads its GPU rows)
    logs/rank-00000.out   each rank's stdout and stderr (the 5-digit rank of the observe
    logs/rank-00000.err   store and checkpoint files); a requeued job appends to them
    requeued.json     this attempt checkpointed and asked Slurm to requeue it (hpcml.cluster.requeue)
    attempts/N/       attempt N >= 1: the same Slurm job requeued (SLURM_RESTART_COUNT=N), or
                      restarted inside its allocation after a fault (--max-restarts): its own
                      observe/, requeued.json and resumed.json (the checkpoint step it resumed
                      from); attempt 0 keeps the paths above, so a job that ran once looks as
                      it always did
    vet/again-N/      the suspects of attempt N's fault, vetted again (--revet)

A requeued or restarted job is the one case where a job directory is used again: run.json
then holds the new attempt, with the earlier attempts' records (exit, failure, signals,
requeue or restart) under ``attempts``; ``hpcml report`` reads every attempt's store and shows the time
between two attempts as a requeue, not as a stall of the job.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpcml import jobmodel
from hpcml.cluster.requeue import MARKER
from hpcml.cluster.taskenv import current as farm_task
from hpcml.errors import HpcmlError, UsageError
from hpcml.farm.model import ENDS
from hpcml.files import load_json_bounded, write_atomic
from hpcml.jobmodel import MAX_RUN_JSON, RunRecord, dumps
from hpcml.owner import LAUNCHER, Liveness, Owner, job_liveness, local_liveness
from hpcml.run.jobpaths import attempt_dir as attempt_dir  # re-exported: callers import them here
from hpcml.run.jobpaths import log_path as log_path
from hpcml.run.jobpaths import observe_dir as observe_dir

SCHEMA = jobmodel.RUN_SCHEMA
RUN_JSON = "run.json"
#: what a job leaves in its directory, removed by --overwrite (nothing else is touched)
OWNED = (RUN_JSON, "vet", "env.json", "observe", "logs", "report.html", MARKER, "attempts", "summary")


def default_dir(job_id: str | None) -> Path:
    """``hpcml-run-JOBID``; in a farm task its attempt's ``runs/ID.A`` in the farm, then
    ``runs/ID.A-1``... for the attempt's next runs (read by ``hpcml farm results``; the
    task's working directory stays clean); without Slurm a name no other run has (time,
    pid, then a count)."""
    task = farm_task()
    if job_id and task is None:
        return Path(f"hpcml-run-{job_id}")
    stem = str(task.run_dir) if task else f"hpcml-run-local-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for n in range(1000):
        d = Path(stem if n == 0 else f"{stem}-{n}")
        if not d.exists():
            return d
    raise UsageError("every default job directory name is taken; give one", key="dir")


def rank_meta(d: Path, attempt: int = 0) -> list[dict[str, Any]]:
    """Each rank's metadata in the attempt's observe store (start, end, exit code, node);
    empty when no task got as far as recording."""
    from hpcml.observe.store import read_meta
    try:
        _, meta, _ = read_meta(observe_dir(d, attempt))
    except UsageError:
        return []
    return [m for m in (meta.get("ranks") or {}).values() if isinstance(m, dict)]


def vet_dir(d: Path) -> Path:
    return d / "vet"


def write_run(d: Path, record: RunRecord, exclusive: bool = False) -> None:
    """``exclusive``: the launch's first write, which claims the directory (of two runs
    started on it at once, one gets FileExistsError)."""
    write_atomic(d / RUN_JSON, dumps(record), exclusive)


def _holder(d: Path) -> tuple[bool, Any]:
    """Who holds run.json now (its ``launcher``), read as anyone could have written it;
    (False, None) when there is no record to hold it."""
    try:
        now = load_json_bounded(d / RUN_JSON, MAX_RUN_JSON)
    except (OSError, ValueError):
        return False, None
    return (True, now.get("launcher")) if isinstance(now, dict) else (False, None)


def write_own(d: Path, record: RunRecord) -> bool:
    """Rewrite run.json only while it is still this launcher's (``record.launcher``):
    Slurm may requeue a job whose old launcher it could not reach (a node cut off), and the
    next attempt, on another host, has taken the directory; the old one must not then
    overwrite the new attempt's record. False: not written."""
    held, holder = _holder(d)
    if held and holder != (record.launcher.to_json() if record.launcher is not None else None):
        return False
    write_run(d, record)
    return True


def launcher() -> dict[str, Any]:
    """Who writes run.json: enough to tell later whether that process still runs."""
    return Owner.me().to_json(LAUNCHER)


def launcher_alive(run: dict[str, Any]) -> bool | None:
    """Whether the run's ``hpcml run`` still runs: on this host by its pid and start time
    (``hpcml.owner.local_liveness``: gone after a reboot); from another host (a login node
    beside the job's compute node) by its Slurm job's state; None when neither can tell
    (another host, no Slurm to ask).

    A ``local`` run inside a job (a farm task's) is not the job: a running job says nothing
    of it, an ended one that it is gone. A farm task's run is gone once the farm ended its
    attempt (``ends/ID.A``: the farm kills an attempt's whole process tree before that)."""
    here = local_liveness(Owner.from_json(run.get("launcher"), LAUNCHER))
    if here is not Liveness.UNKNOWN:
        return here is Liveness.ALIVE
    task = run.get("farm_task") if isinstance(run.get("farm_task"), dict) else {}
    if task and os.path.lexists(f"{task.get('farm')}/{ENDS}/{task.get('id')}.{task.get('attempt')}"):
        return False
    if not run.get("job_id"):
        return None
    job = job_liveness(str(run["job_id"]))
    if job is not Liveness.ALIVE:
        return None if job is Liveness.UNKNOWN else False
    return True if run.get("mode") != "local" or task else None     # a farm attempt not ended: it runs


def restart_of(record: dict[str, Any]) -> int:
    """The Slurm restart count an attempt ran under: its attempt number, unless in-job
    restarts (``--max-restarts``) numbered attempts past it."""
    return int(record.get("restart_count", record.get("attempt")) or 0)


def is_requeue(prev: dict[str, Any], job_id: str | None, restart: int) -> bool:
    """The previous job in a directory is this Slurm job before Slurm requeued it: the same
    job id, a restart count above the one it recorded, and its launcher gone (on another
    host Slurm's requeue ended it; on this one its pid tells)."""
    try:
        recorded = restart_of(prev)
    except (TypeError, ValueError):
        return False
    return bool(job_id) and str(prev.get("job_id")) == job_id and restart > recorded \
        and local_liveness(Owner.from_json(prev.get("launcher"), LAUNCHER)) is not Liveness.ALIVE


def _make(d: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError("not a directory", file=str(d)) from None
    except OSError as exc:
        raise HpcmlError(f"{d}: cannot create the job directory: {exc.strerror}") from None


@contextmanager
def claiming(d: Path) -> Iterator[None]:
    """Hold ``flock`` on the directory while ``prepare`` decides and run.json claims it:
    without it, a second ``--overwrite`` could still be removing the old job's files while
    the first has claimed the directory and started writing its own. The exclusive link of
    run.json stays the claim where flock is not shared between hosts."""
    _make(d)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass                               # a filesystem without flock: the link still decides
        yield
    finally:
        os.close(fd)


def prepare(d: Path, *, overwrite: bool, job_id: str | None, restart: int) -> RunRecord | None:
    """Make ``d`` ready for a new job. A directory that holds a job is refused (its data
    would mix with the new run's), unless ``overwrite`` (never while that job runs) or it is
    this Slurm job, requeued (``is_requeue``): then its run.json is returned and the run
    continues there as a new attempt. The claim itself is ``write_run(exclusive=True)``,
    both inside ``claiming(d)``."""
    _make(d)
    if not (d / RUN_JSON).exists():
        return None
    try:
        prev = load_json_bounded(d / RUN_JSON, MAX_RUN_JSON)
    except (OSError, ValueError):
        prev = {}
    prev = prev if isinstance(prev, dict) else {}
    if is_requeue(prev, job_id, restart):
        return read_run(d)
    if prev.get("ended") is None:
        alive = launcher_alive(prev)
        who = prev.get("launcher") or {}
        if alive:
            job = f", Slurm job {prev['job_id']}" if prev.get("job_id") else ""
            raise UsageError(f"holds a running job (hpcml run, pid {who.get('pid')} on {who.get('host')}{job}); "
                             "give another --dir", file=str(d))
        if alive is None and overwrite:
            raise UsageError(f"holds a job that has not ended, started on {who.get('host')} (pid {who.get('pid')}), "
                             "which cannot be checked from here: run from that host, or remove the directory",
                             file=str(d))
    if not overwrite:
        raise UsageError("already holds a job (run.json); give another --dir, or --overwrite to replace it",
                         file=str(d))
    for name in OWNED:
        p = d / name
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)          # a symlink: the link goes, never what it names
        except OSError as exc:
            raise HpcmlError(f"{p}: cannot remove the previous job's files: {exc.strerror}") from None
    return None


def read_run(d: Path) -> RunRecord:
    p = Path(d) / RUN_JSON
    if not os.path.lexists(p):
        raise UsageError("not an hpcml run job directory (no run.json)", file=str(d))
    return jobmodel.read_run(p)             # a FIFO or a directory there: "unreadable", not a hang


def tail(path: Path, lines: int = 20, max_bytes: int = 64 << 10) -> list[str]:
    """The last ``lines`` lines of a log (read from its end: logs can be large), each as
    printed (``words.printable``). The log is the job's own program's: a FIFO put in its
    place is not waited on, a link is not followed out (``files.read_ends``), and a line's
    terminal escapes are shown, not sent to whoever reads hpcml's output."""
    from hpcml.files import tail_lines
    from hpcml.words import printable
    return [printable(line, LINE_MAX) for line in tail_lines(path, max_bytes)[-lines:]]


LINE_MAX = 2000          # characters of one log line kept (a progress bar's carriage-return line is longer)
