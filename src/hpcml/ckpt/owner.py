"""Which job writes a checkpoint directory: ``DIR/.owner``, claimed when a writing
``Checkpointer`` opens the directory.

Two jobs pointed at one directory (a copied job script, a stale ``--dependency``) would
each resume from the other's checkpoints and prune them under each other. So the writer
records itself (attempt token, host, pid and its start time, Slurm job id) and a second
writer is refused in one line naming the first, unless that one has ended or the caller
takes over. The same owner is: the same attempt token, the same Slurm job (a requeued job
keeps its id), or the same process. Whether another owner still runs: its Slurm job's state
(``scontrol``), else on the same host its pid with the same start time; an owner on another
host without Slurm cannot be checked and counts as running (take over if it is not).

A farm task (``hpcml.farm.taskenv.current``) is owned by its farm and task id, not by its
Slurm job: every task of one farm allocation shares that job (same id, same restart count),
and a retry may run in another allocation while the failed attempt's one still runs. Its
attempt ended when the farm wrote ``ends/ID.A``, or when a later attempt of the task started
(the farm reruns a task only once the earlier attempt's process tree is gone: ``farm.claim``).

Claiming is lock-free and safe on NFS and Lustre: the record is written whole under a
temporary name and ``link``-ed into place (fails if one exists); a stale record is first
renamed away, which only one of two racing claimants can do, and what was renamed is read
again: when it is not the record judged stale (a claimant replaced that one between our
read and our rename) it is linked back, and this claimant tries again (and is refused).
A take-over fences the old writer: its next commit finds another token in ``.owner`` and
refuses (``check``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from hpcml.ckpt import layout
from hpcml.errors import UsageError
from hpcml.farm import taskenv
from hpcml.farm.model import ENDS
from hpcml.files import load_json_bounded, write_atomic
from hpcml.proctree import start_time

OWNER = ".owner"


def me(token: str) -> dict[str, Any]:
    pid = os.getpid()
    task = taskenv.current()
    return {"token": token, "host": socket.gethostname(), "pid": pid, "started": start_time(pid),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID") or None, "claimed_at": time.time(),
            "farm_task": None if task is None else {"farm": str(task.farm.absolute()), "id": task.id,
                                                    "attempt": task.attempt}}


def _task(owner: dict[str, Any]) -> tuple[str, int, int] | None:
    """(farm, id, attempt) of an owner that is a farm task; None otherwise (or malformed)."""
    t = owner.get("farm_task")
    if not isinstance(t, dict) or not isinstance(t.get("farm"), str) \
            or not all(isinstance(t.get(k), int) for k in ("id", "attempt")):
        return None
    return t["farm"], t["id"], t["attempt"]


def read(root: Path) -> dict[str, Any] | None:
    """The owner record, or None (absent, or unreadable: written by no hpcml)."""
    return _read(root / OWNER)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = load_json_bounded(path, 1 << 20, follow_symlinks=False)   # a few hundred bytes
    except (OSError, ValueError):                      # absent, garbage, '[' * 100000, a FIFO
        return None
    return doc if isinstance(doc, dict) else None


def same(owner: dict[str, Any], mine: dict[str, Any]) -> bool:
    if owner.get("token") == mine["token"]:
        return True
    if _task(owner) is None and _task(mine) is None and owner.get("slurm_job_id") \
            and owner.get("slurm_job_id") == mine["slurm_job_id"]:     # a farm's tasks share one job
        return True
    return owner.get("host") == mine["host"] and owner.get("pid") == mine["pid"]


def running(owner: dict[str, Any], mine: dict[str, Any] | None = None) -> bool | None:
    """True, False, or None where it cannot be told (another host, no Slurm). An ended
    Slurm job whose process still runs on this host counts as running: never two writers.
    A farm task's attempt has ended once the farm says so, whatever its allocation does."""
    if owner.get("released"):
        return False
    task, gone = _task(owner), False
    if task is not None:
        later = _task(mine) if mine is not None else None
        if later is not None and later[:2] == task[:2] and later[2] > task[2]:
            return False                                # this task's next attempt: the farm ended that one
        if os.path.lexists(f"{task[0]}/{ENDS}/{task[1]}.{task[2]}"):
            return False
    job = owner.get("slurm_job_id")
    if job:
        from hpcml.cluster import slurm
        state = slurm.job_state(str(job))
        if state in slurm.ALIVE:
            return True
        gone = state is not None                       # ended, or forgotten by Slurm: not None
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False if gone else None
    started = start_time(owner["pid"])
    return started is not None and (owner.get("started") is None or abs(started - owner["started"]) < 1)


def describe(owner: dict[str, Any]) -> str:
    job = f", Slurm job {owner['slurm_job_id']}" if owner.get("slurm_job_id") else ""
    return f"token {owner.get('token')}, host {owner.get('host')}, pid {owner.get('pid')}{job}"


def claim(root: Path, token: str, *, take_over: bool = False, mode: int = layout.FILE_MODE) -> None:
    """Make this process the owner of ``root``; UsageError (exit 2) naming the other owner
    when another job that still runs (or may) has it and ``take_over`` is false."""
    mine = me(token)
    tmp = root / f".owner.{mine['host']}.{mine['pid']}.tmp"
    with os.fdopen(layout.create(tmp, mode), "w") as fh:
        json.dump(mine, fh)
    try:
        for _ in range(20):
            try:
                os.link(tmp, root / OWNER)
                return
            except FileExistsError:
                pass
            owner = read(root)
            if owner is not None and same(owner, mine):
                os.replace(tmp, root / OWNER)
                return
            if owner is None and (root / OWNER).is_dir() and not (root / OWNER).is_symlink():
                raise UsageError(f"{OWNER} is a directory, not the owner record hpcml writes there: "
                                 "move it away", file=str(root))
            alive = running(owner, mine) if owner is not None else False
            if alive is not False and not take_over:
                how = "still runs" if alive else "may still run (it cannot be checked from here)"
                raise UsageError(f"in use by another job ({describe(owner or {})}) that {how}; two jobs in one "
                                 "checkpoint directory resume from and prune each other's checkpoints: give this "
                                 "job its own directory, or take over (take_over=True, HPCML_CKPT_TAKE_OVER=1) if "
                                 "that job has ended", file=str(root))
            stale = root / f".owner.stale-{mine['host']}.{mine['pid']}"
            try:
                os.rename(root / OWNER, stale)      # one of two racing claimants wins this
            except FileNotFoundError:
                continue
            if _read(stale) != owner:               # not the record judged stale: a claimant that
                try:                                # took it over since we read it; put its back
                    os.link(stale, root / OWNER)
                except FileExistsError:
                    pass
            os.unlink(stale)
        raise UsageError("could not claim the directory: its owner record keeps changing", file=str(root))
    finally:
        tmp.unlink(missing_ok=True)


def check(root: Path, token: str) -> None:
    """Refuse to commit after another job took the directory over (fencing)."""
    owner = read(root)
    if owner is not None and owner.get("token") != token:
        from hpcml.ckpt.checkpointer import CheckpointError
        raise CheckpointError(f"{root}: taken over by another job ({describe(owner)}); this job's checkpoint "
                              "was not committed")


def release(root: Path, token: str, mode: int = layout.FILE_MODE) -> None:
    """Mark the record released if it is still this attempt's. It stays, so that a job this
    one took over still finds another token at its next commit (``check``)."""
    owner = read(root)
    if owner is not None and owner.get("token") == token:
        write_atomic(root / OWNER, json.dumps({**owner, "released": True}), mode=mode)


def live_token(root: Path) -> str | None:
    """The owner's token if it runs (or may), for ``prune`` run from outside the job."""
    owner = read(root)
    return owner.get("token") if owner is not None and running(owner) is not False else None
