"""Which job writes a checkpoint directory: ``DIR/.owner``, claimed when a writing
``Checkpointer`` opens the directory.

Two jobs pointed at one directory (a copied job script, a stale ``--dependency``) would
each resume from the other's checkpoints and prune them under each other. So the writer
records itself (attempt token, host, pid and its start time, Slurm job id) and a second
writer is refused in one line naming the first, unless that one has ended or the caller
takes over. The same owner is: the same attempt token, the same Slurm job (a requeued job
keeps its id), or the same process. Whether another owner still runs: its Slurm job's state
(``scontrol``: a running job is a running owner), else what ``hpcml.owner.local_liveness``
tells on this host (its pid with the same start time); an owner on another host without
Slurm cannot be checked and counts as running (take over if it is not).

A farm task (``hpcml.cluster.taskenv.current``) is owned by its farm and task id, not by its
Slurm job: every task of one farm allocation shares that job (same id, same restart count),
and a retry may run in another allocation while the failed attempt's one still runs. Its
attempt ended when the farm wrote ``ends/ID.A``, or when a later attempt of the task started
(the farm reruns a task only once the earlier attempt's process tree is gone: ``farm.claim``).
Another task of the same farm is refused even after that task ended: its checkpoints hold
another task's state (a sweep's lr 0.5 run resumed by its lr 0.05 one).

Claiming is lock-free and safe on NFS and Lustre (``hpcml.owner.claim``: a record linked
into place whole; a stale one renamed away, which only one of two racing claimants can do).
A take-over fences the old writer: its next commit finds another token in ``.owner`` and
refuses (``check``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hpcml.ckpt import layout
from hpcml.cluster import taskenv
from hpcml.errors import UsageError
from hpcml.farm.model import ENDS
from hpcml.files import write_atomic
from hpcml.owner import CHECKPOINT, Contended, Liveness, Owner, job_liveness, local_liveness, read_record
from hpcml.owner import claim as take

OWNER = ".owner"


def me(token: str) -> dict[str, Any]:
    task = taskenv.current()
    return {"token": token, **Owner.me().to_json(CHECKPOINT), "claimed_at": time.time(),
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
    return _parse(read_record(root / OWNER))


def _parse(raw: bytes | None) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):               # garbage, '[' * 100000
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
    task = _task(owner)
    if task is not None:
        later = _task(mine) if mine is not None else None
        if later is not None and later[:2] == task[:2] and later[2] > task[2]:
            return False                                # this task's next attempt: the farm ended that one
        if os.path.lexists(f"{task[0]}/{ENDS}/{task[1]}.{task[2]}"):
            return False
    who = Owner.from_json(owner, CHECKPOINT)
    job = job_liveness(who.job) if who.job else Liveness.UNKNOWN
    if job is Liveness.ALIVE:                          # the owner is its job: running while it runs
        return True
    here = local_liveness(who)
    if here is not Liveness.UNKNOWN:
        return here is Liveness.ALIVE
    return False if job is Liveness.DEAD else None


def describe(owner: dict[str, Any]) -> str:
    job = f", Slurm job {owner['slurm_job_id']}" if owner.get("slurm_job_id") else ""
    return f"token {owner.get('token')}, host {owner.get('host')}, pid {owner.get('pid')}{job}"


def claim(root: Path, token: str, *, take_over: bool = False, mode: int = layout.FILE_MODE) -> None:
    """Make this process the owner of ``root``; UsageError (exit 2) naming the other owner
    when another job that still runs (or may) has it and ``take_over`` is false."""
    mine = me(token)

    def free(raw: bytes | None) -> bool:
        owner = _parse(raw)
        if owner is None or same(owner, mine):
            return True                             # absent, garbage, or this job's own
        theirs, ours = _task(owner), _task(mine)
        if theirs is not None and ours is not None and theirs[0] == ours[0] and theirs[1] != ours[1] \
                and not take_over:                  # ended or not: its state is not this task's
            raise UsageError(f"belongs to task {theirs[1]} of the farm {ours[0]}, and this is task {ours[1]}: a "
                             "task that resumed it would go on from another task's state; give each task its own "
                             "directory (a relative path: tasks run in FARM/tasks/ID; or {task_dir}/ckpt)",
                             file=str(root))
        alive = running(owner, mine)
        if alive is not False and not take_over:
            how = "still runs" if alive else "may still run (it cannot be checked from here)"
            raise UsageError(f"in use by another job ({describe(owner)}) that {how}; two jobs in one "
                             "checkpoint directory resume from and prune each other's checkpoints: give this "
                             "job its own directory, or take over (take_over=True, HPCML_CKPT_TAKE_OVER=1) if "
                             "that job has ended", file=str(root))
        return True

    try:
        take(root / OWNER, json.dumps(mine).encode(), free, mode=mode)
    except IsADirectoryError:
        raise UsageError(f"{OWNER} is a directory, not the owner record hpcml writes there: move it away",
                         file=str(root)) from None
    except Contended:
        raise UsageError("could not claim the directory: its owner record keeps changing", file=str(root)) from None


def check(root: Path, token: str) -> None:
    """Refuse to commit after another job took the directory over (fencing)."""
    owner = read(root)
    if owner is not None and owner.get("token") != token:
        from hpcml.ckpt.layout import CheckpointError
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
