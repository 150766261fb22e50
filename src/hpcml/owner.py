"""Who owns something hpcml hands to one process at a time (a job directory, a checkpoint
directory, a farm worker's claims, a GPU to sample), whether that owner still runs, and
taking a claim over from one that does not.

An owner is a process: its host, the kernel's boot (``boot_id``), its pid namespace, its pid
and start time (which tells it from a later process given the same pid), and its Slurm job.
Whether it still runs (``liveness``), most certain first:

* on this host, in this boot and pid namespace: its pid, with the start time it recorded (a
  zombie, killed and not yet reaped, is dead);
* on this host in another boot: dead (a reboot ended every process);
* in another pid namespace or on another host, where its pid means nothing: its Slurm job,
  when it recorded one and Slurm can be asked; UNKNOWN otherwise.

A boot id or pid namespace that a record does not hold (written before this module, or
unreadable where it was written) counts as this host's, and a pid without a start time as
whatever process has that pid now (never two owners): such records are judged as before.
Each caller keeps its own policy on top (a checkpoint's owner is its whole Slurm job;
a farm worker also has its heartbeat; a ``local`` run inside a job is not that job).

All identity is read from procfs here, through ``Proc``: its ``root`` lets a test hand in a
process table of its own, as prometheus_client's ``proc`` root does.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcml import scratch
from hpcml.files import fill, read_bounded

#: an owner record is a few hundred bytes: anything larger is not one
RECORD_MAX = 1 << 20
#: recorded and current start times of one process differ by float rounding only (or by
#: a step of the wall clock, which moves the boot time they are computed from)
SAME_START_S = 1.0


@dataclass(frozen=True)
class Proc:
    """This host's process table as procfs shows it (``root``: where it is mounted)."""

    root: str = "/proc"

    def boot_id(self) -> str | None:
        """The kernel's boot: another one after a reboot."""
        try:
            return Path(self.root, "sys/kernel/random/boot_id").read_text().strip() or None
        except OSError:
            return None

    def pid_namespace(self) -> int | None:
        """The inode of this process's pid namespace: pids compare only within one."""
        try:
            return os.stat(f"{self.root}/self/ns/pid").st_ino
        except OSError:
            return None

    def start_ticks(self, pid: int) -> int | None:
        """When ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat); None
        when it is gone, a zombie (killed, not yet reaped: as good as gone) or not ours to see."""
        try:
            with open(f"{self.root}/{int(pid)}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()      # the name in () may hold anything
            return None if fields[0] in (b"Z", b"X") else int(fields[19])
        except (OSError, IndexError, ValueError):
            return None

    def time_of(self, ticks: int) -> float | None:
        """Clock ticks since boot as seconds since the epoch, as psutil's ``create_time``
        computes it (so start times recorded through ``hpcml.proctree.start_time`` compare)."""
        try:
            with open(f"{self.root}/stat", "rb") as f:
                boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime "))
        except (OSError, StopIteration, IndexError, ValueError):
            return None
        return ticks / os.sysconf("SC_CLK_TCK") + boot

    def start_time(self, pid: int) -> float | None:
        ticks = self.start_ticks(pid)
        return None if ticks is None else self.time_of(ticks)


PROC = Proc()


@dataclass(frozen=True)
class Fields:
    """The keys an owner record spells three of its fields with. Each kind of record keeps
    those its earlier writers and readers use: a farm worker's file (``WORKER``; its
    ``started`` is when the worker began work), a checkpoint directory's ``.owner``
    (``CHECKPOINT``), run.json's ``launcher`` (``LAUNCHER``: no job, run.json has its own
    ``job_id``)."""

    started: str = "pid_start"
    job: str | None = "job"
    pidns: str = "pidns"


WORKER = Fields()
CHECKPOINT = Fields(started="started", job="slurm_job_id")
LAUNCHER = Fields(started="created", job=None, pidns="pid_ns")


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _integer(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Owner:
    """One process that owns something; None: not recorded."""

    host: str
    pid: int                            # 0: none recorded, nothing to check
    started: float | None               # its start time (``Proc.start_time``)
    boot_id: str | None = None
    pidns: int | None = None
    job: str | None = None              # its Slurm job

    @classmethod
    def me(cls, proc: Proc = PROC, env: Mapping[str, str] | None = None) -> Owner:
        """This process (its job: SLURM_JOB_ID)."""
        env = os.environ if env is None else env
        pid = os.getpid()
        return cls(socket.gethostname(), pid, proc.start_time(pid), proc.boot_id(), proc.pid_namespace(),
                   env.get("SLURM_JOB_ID") or None)

    def to_json(self, fields: Fields = WORKER) -> dict[str, Any]:
        doc: dict[str, Any] = {"host": self.host, "boot_id": self.boot_id, fields.pidns: self.pidns, "pid": self.pid,
                               fields.started: self.started}
        if fields.job is not None:
            doc[fields.job] = self.job
        return doc

    @classmethod
    def from_json(cls, doc: Any, fields: Fields = WORKER) -> Owner:
        """The owner a record names; a field it lacks, or holds in a type hpcml never wrote,
        is not recorded."""
        d = doc if isinstance(doc, dict) else {}
        host, boot = d.get("host"), d.get("boot_id")
        job = d.get(fields.job) if fields.job else None
        return cls(host if isinstance(host, str) else "", _integer(d.get("pid")) or 0, _number(d.get(fields.started)),
                   boot if isinstance(boot, str) and boot else None, _integer(d.get(fields.pidns)),
                   str(job) if isinstance(job, str) and job or _integer(job) is not None else None)


class Liveness(enum.Enum):
    """Whether an owner still runs; UNKNOWN: nothing here can tell (the caller decides)."""

    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


def _differ(recorded: object, mine: object) -> bool:
    return recorded is not None and mine is not None and recorded != mine


def local_liveness(owner: Owner, *, me: Owner | None = None, proc: Proc = PROC) -> Liveness:
    """What this host can tell by itself (``me``: this process, read once by a caller that
    judges many owners): UNKNOWN for an owner on another host or in another pid namespace."""
    me = Owner.me(proc) if me is None else me
    if owner.host != me.host or owner.pid <= 0:
        return Liveness.UNKNOWN
    if _differ(owner.boot_id, me.boot_id):
        return Liveness.DEAD
    if _differ(owner.pidns, me.pidns):
        return Liveness.UNKNOWN
    now = proc.start_time(owner.pid)
    if now is None:
        return Liveness.DEAD
    return Liveness.ALIVE if owner.started is None or abs(now - owner.started) < SAME_START_S else Liveness.DEAD


def job_liveness(job: str) -> Liveness:
    """A Slurm job's: ALIVE while it holds its allocation (``slurm.ALIVE``: pending, running,
    requeued...), DEAD once over (or forgotten), UNKNOWN where Slurm cannot be asked."""
    from hpcml.cluster import slurm
    state = slurm.job_state(job)
    return Liveness.UNKNOWN if state is None else Liveness.ALIVE if state in slurm.ALIVE else Liveness.DEAD


def liveness(owner: Owner, *, me: Owner | None = None, proc: Proc = PROC) -> Liveness:
    """``local_liveness``; where that cannot tell, the owner's Slurm job's (``job_liveness``)."""
    here = local_liveness(owner, me=me, proc=proc)
    return job_liveness(owner.job) if here is Liveness.UNKNOWN and owner.job else here


# -- claims ----------------------------------------------------------------------------------

class Contended(Exception):
    """The record in place kept changing while this claimant tried to replace it."""


def read_record(path: str | os.PathLike) -> bytes | None:
    """The bytes of a claim; None when there is none, or something that is not one (a
    symlink is not followed, a FIFO not waited on: ``files.read_bounded``)."""
    try:
        return read_bounded(path, RECORD_MAX, follow_symlinks=False)
    except (OSError, ValueError):
        return None


def _link(tmp: Path, path: Path) -> bool:
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False


@contextlib.contextmanager
def _holding(lock: Path | None) -> Iterator[None]:
    if lock is None:
        yield
        return
    fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim(path: Path, record: bytes, free: Callable[[bytes | None], bool], *, mode: int = 0o644,
          lock: Path | None = None, tries: int = 20) -> bool:
    """Put ``record`` at ``path``, where no other claimant's is; True once it is there.

    The record is written whole under a temporary name and ``link``-ed into place, which
    fails if a record is there: of claimants racing for a free ``path`` one wins, on a local
    file system and on NFS and Lustre alike. A record in place is shown to ``free`` (its
    bytes; None where it is not a regular file to read): False keeps it (``claim`` returns
    False), True replaces it (its owner is gone, is this claimant, or is taken over); ``free``
    may also raise, to refuse in its own words. A record judged free is renamed away first,
    which only one of two racing claimants can do, and what was renamed is read again: when it
    is not the record judged (another claimant put its own in place meanwhile) it is linked
    back and this claimant judges again. Among more than two claimants a third may link its
    record back too late, so the record renamed away is lost to its owner, which learns it
    only later (a checkpoint's writer at its next commit): ``lock``, a file ``flock``-ed while
    taking a record over, rules that out where flock is shared (one host). A directory in
    its place is never removed (IsADirectoryError); ``Contended`` after ``tries`` changes."""
    who = f"{socket.gethostname()}.{os.getpid()}"
    tmp, stale = path.with_name(f"{path.name}.{who}.tmp"), path.with_name(f"{path.name}.stale-{who}")
    _remove_dead_claimants(path)
    try:
        # nameless where the filesystem allows (a claimant killed here leaves nothing),
        # else under the temporary name (NFS), removed however this ends but by SIGKILL
        fd = scratch.anonymous(path.parent, mode, to_publish=True)
        if fd is not None:
            try:
                fill(fd, record, mode)
                return _place(fd, None, path, stale, free, lock, tries)
            except scratch.NotPublished:
                pass
            finally:
                os.close(fd)
        tmp.unlink(missing_ok=True)                     # a killed claimant's of this pid, or a planted link
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            fill(fd, record, mode)
        finally:
            os.close(fd)
        return _place(-1, tmp, path, stale, free, lock, tries)
    finally:
        tmp.unlink(missing_ok=True)


def _remove_dead_claimants(path: Path) -> None:
    """What claimants of ``path`` on this host left when killed with SIGKILL mid-claim: the
    record renamed away (``NAME.stale-HOST.PID``, between that rename and its unlink) and,
    on a filesystem without O_TMPFILE, the record being written (``NAME.HOST.PID.tmp``).
    Another host's are left alone: its pids mean nothing here."""
    host, proc = socket.gethostname(), Proc()
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(path.name + ".")]
    except OSError:
        return
    for p in siblings:
        rest = p.name[len(path.name) + 1:]
        who = rest[len("stale-"):] if rest.startswith("stale-") else rest[:-len(".tmp")] if rest.endswith(".tmp") else ""
        claimant, _, pid = who.rpartition(".")
        if claimant == host and pid.isdigit() and int(pid) != os.getpid() and proc.start_ticks(int(pid)) is None:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def _place(fd: int, tmp: Path | None, path: Path, stale: Path, free: Callable[[bytes | None], bool],
           lock: Path | None, tries: int) -> bool:
    """``claim``'s race, with the record written: in ``tmp``, or nameless in ``fd``."""
    def put() -> bool:
        if tmp is not None:
            return _link(tmp, path)
        try:
            scratch.publish(fd, path)
            return True
        except FileExistsError:
            return False

    if put():
        return True
    with _holding(lock):
        for _ in range(tries):
            held = read_record(path)
            if held is None and path.is_dir() and not path.is_symlink():
                raise IsADirectoryError(errno.EISDIR, "a directory, not a claim", str(path))
            if not free(held):
                return False
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, stale)              # one of two racing claimants wins this
                if read_record(stale) != held:      # not the record judged: put it back
                    with contextlib.suppress(FileExistsError):
                        os.link(stale, path)
                os.unlink(stale)
            if put():
                return True
        raise Contended(f"{path}: its record keeps changing")
