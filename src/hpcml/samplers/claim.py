"""Each GPU of a node is recorded by one task: the first to claim it.

Several tasks per node often see the same GPU list (SLURM_STEP_GPUS / SLURM_JOB_GPUS list
the node's GPUs for every task), and one task per GPU sees its own. Either way a task
claims each of its GPUs with a file (``hpcml.owner.claim``: created whole, or not at all)
in a node-local directory: ``$SLURM_TMPDIR``, else ``/dev/shm``, else the temporary
directory. The name holds the job id, the step id and the GPU (UUID or index), so steps and
jobs never collide. The task samples only the GPUs it claimed and removes its claims when
it stops.

A claim left by a task that died (its process is gone) is taken over: the file holds the
owner's pid and process start time (``PID TICKS``: clock ticks since boot, as every hpcml
version writes and reads it), and the take-over happens under a lock file (``LOCK``), where
``hpcml.owner.claim`` checks the stale claim again before it replaces it, so two tasks never
both win a GPU.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from hpcml.owner import PROC, Contended, Liveness, Owner, claim, liveness, read_record

PREFIX = "hpcml-gpu-claim"
LOCK = f"{PREFIX}.lock"    # held while a stale claim is taken over: any number of tasks race for it
EMPTY_GRACE_S = 5.0        # an empty claim older than this: its creator (an older hpcml) died mid-write


def claim_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    for d in (env.get("SLURM_TMPDIR"), "/dev/shm", tempfile.gettempdir()):
        if d and os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            return Path(d)
    return Path(tempfile.gettempdir())


def scope(env: Mapping[str, str] | None = None) -> str:
    """Who shares claims: one job step. Outside Slurm, the processes of one launcher
    (torchrun's run id, else the parent process)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job:
        # the node's name too: virtual nodes of one host (and nodes sharing a tmpfs) must
        # not take each other's GPUs
        node = env.get("SLURMD_NODENAME")
        step = f"{job}-{env.get('SLURM_STEP_ID') or env.get('SLURM_STEPID') or 'nostep'}"
        return f"{step}-{node}" if node else step
    run = env.get("TORCHELASTIC_RUN_ID")
    return f"local-{run}" if run else f"local-ppid{os.getppid()}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:120]


def _token() -> str:
    """``PID TICKS`` of this process (TICKS empty where it cannot be read)."""
    pid = os.getpid()
    ticks = PROC.start_ticks(pid)
    return f"{pid} {'' if ticks is None else ticks}"


def _owner(content: bytes) -> Owner | None:
    """The task a claim names, on this node; None for one half-written or foreign."""
    try:
        pid_text, _, ticks = content.decode().strip().partition(" ")
        return Owner(socket.gethostname(), int(pid_text), PROC.time_of(int(ticks)) if ticks else None)
    except ValueError:
        return None


def _free(path: Path) -> Callable[[bytes | None], bool]:
    """Whether the claim at ``path`` may be taken: its task is gone (or it names none)."""
    def free(content: bytes | None) -> bool:
        if content == b"":
            return _age(path) >= EMPTY_GRACE_S       # an older hpcml's, being written right now
        owner = _owner(content) if content is not None else None
        return owner is None or liveness(owner) is Liveness.DEAD
    return free


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


@dataclass
class GpuClaims:
    """The GPUs this task claimed (``claimed``) and those another task holds (``others``)."""

    directory: Path
    claimed: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)
    token: str = ""

    def release(self) -> None:
        """Remove this task's claims (only files that are still ours)."""
        for path in self.paths.values():
            if read_record(path) == self.token.encode():
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
        self.paths.clear()

    def __enter__(self) -> GpuClaims:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim_gpus(gpus: Sequence[str], env: Mapping[str, str] | None = None,
               directory: str | os.PathLike | None = None) -> GpuClaims:
    """Claim each of ``gpus`` (indices or UUIDs) for this task on this node."""
    d = Path(directory) if directory is not None else claim_dir(env)
    token = _token()
    claims = GpuClaims(directory=d, token=token)
    where = scope(env)
    for gpu in dict.fromkeys(str(g) for g in gpus):
        path = d / f"{PREFIX}-{_safe(where)}-{_safe(gpu)}"
        try:
            won = claim(path, token.encode(), _free(path), lock=d / LOCK)
        except Contended:
            won = False
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EROFS, errno.ENOSPC):
                won = True           # cannot coordinate here: record rather than lose data
            else:
                raise
        if won:
            claims.claimed.append(gpu)
            if path.exists():
                claims.paths[gpu] = path
        else:
            claims.others.append(gpu)
    return claims
