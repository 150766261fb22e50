"""Each GPU of a node is recorded by one task: the first to claim it.

Several tasks per node often see the same GPU list (SLURM_STEP_GPUS / SLURM_JOB_GPUS list
the node's GPUs for every task), and one task per GPU sees its own. Either way a task
claims each of its GPUs by creating a file with ``O_CREAT | O_EXCL`` (atomic on a local
file system) in a node-local directory: ``$SLURM_TMPDIR``, else ``/dev/shm``, else the
temporary directory. The name holds the job id, the step id and the GPU (UUID or index),
so steps and jobs never collide. The task samples only the GPUs it claimed and removes its
claims when it stops.

A claim left by a task that died (its process is gone) is taken over: the file holds the
owner's pid and process start time, and the take-over happens under a lock file, where the
stale claim is checked again before it is removed and the new one created with
``O_EXCL`` again, so two tasks never both win a GPU.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

PREFIX = "hpcml-gpu-claim"
LOCK = f"{PREFIX}.lock"
EMPTY_GRACE_S = 5.0        # an empty claim older than this: its creator died mid-write


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


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner_alive(content: str) -> bool:
    try:
        pid_text, _, start = content.strip().partition(" ")
        pid = int(pid_text)
    except ValueError:
        return False                 # half-written or foreign: not ours to honour
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                  # exists, another user's
    return not start or _start_time(pid) in ("", start)


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ""


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
            if _read(path) == self.token:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
        self.paths.clear()

    def __enter__(self) -> GpuClaims:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _create(path: Path, token: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    return True


def _take_over(directory: Path, path: Path, token: str) -> bool:
    """Replace a claim whose owner is gone; False if it is alive (or someone beat us)."""
    lock_fd = os.open(directory / LOCK, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        content = _read(path)
        if content is None:
            return _create(path, token)
        if content == "" and _age(path) < EMPTY_GRACE_S:
            return False            # being written right now by its creator
        if content and _owner_alive(content):
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return _create(path, token)
    finally:
        os.close(lock_fd)


def claim_gpus(gpus: Sequence[str], env: Mapping[str, str] | None = None,
               directory: str | os.PathLike | None = None) -> GpuClaims:
    """Claim each of ``gpus`` (indices or UUIDs) for this task on this node."""
    d = Path(directory) if directory is not None else claim_dir(env)
    token = f"{os.getpid()} {_start_time(os.getpid())}"
    claims = GpuClaims(directory=d, token=token)
    where = scope(env)
    for gpu in dict.fromkeys(str(g) for g in gpus):
        path = d / f"{PREFIX}-{_safe(where)}-{_safe(gpu)}"
        try:
            won = _create(path, token) or _take_over(d, path, token)
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
