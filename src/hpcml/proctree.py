"""Owning a process tree: the one place hpcml talks to the kernel about whose children die.

A launcher (``hpcml run``'s task wrapper, a farm worker) must guarantee that what it started
does not outlive it, even when it is killed with SIGKILL and runs no cleanup of its own:

* ``die_with_parent`` (PR_SET_PDEATHSIG) makes a direct child die when its parent does. It
  reaches one process only: the child's own children are not signalled.
* So the child runs in its own process group (``start_new_session``), and a small process
  that survives nothing but its parent's death (the wrapper) kills that group: a rank's
  ``sleep 300`` or a task's inner ``sh -c`` dies with it.
* A process that leaves the group (``setsid``, a daemon's double fork) escapes ``killpg``;
  a child subreaper (PR_SET_CHILD_SUBREAPER) inherits such orphans, so ``kill_descendants``
  can still find them through the process table.

Written with ctypes rather than a dependency: prctl(2) is two constants, and the libraries
that wrap it (python-prctl) need a compiler and libcap headers on every node.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61     # Yama's
PR_SET_CHILD_SUBREAPER = 36

_LIBC: Any = None
_LOADED = False


def libc() -> Any:
    """libc through ctypes (None where it cannot be loaded), with ``prctl`` resolved.

    Loaded when this module is imported, never first in a forked child: ``die_with_parent``
    runs as a ``preexec_fn`` between fork and exec, and a ``dlopen`` or ``dlsym`` there
    deadlocks on the loader's lock when another thread of the parent held it at the fork
    (the launcher imports numpy in a thread while it starts srun)."""
    global _LIBC, _LOADED
    if not _LOADED:
        _LOADED = True
        try:
            _LIBC = ctypes.CDLL(None, use_errno=True)
            _LIBC.prctl                     # noqa: B018 - ctypes caches the symbol on first access
        except (OSError, AttributeError):
            _LIBC = None
    return _LIBC


libc()


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a forked child (``preexec_fn`` or after fork): get ``sig`` when the parent thread
    dies; exit at once if it already has (the race between fork and prctl)."""
    parent = os.getppid()
    lib = libc()
    if lib is not None:
        lib.prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent or parent == 1:
        os._exit(1)


def allow_tracing_by(pid: int) -> bool:
    """Let ``pid`` and its descendants ptrace this process where Yama's ptrace_scope 1 allows
    only ancestors (Ubuntu's default): the task wrapper's py-spy, a child of the wrapper, can
    then read the rank's stack. Survives exec. False where the kernel has no Yama."""
    lib = libc()
    return lib is not None and lib.prctl(PR_SET_PTRACER, int(pid)) == 0


class ExitWatch:
    """Wake up as soon as a child process ends, not at the next poll: ``Popen.wait(timeout)``
    polls with sleeps of up to 50 ms, which a launcher and each rank's recorder would add to
    every job's end. A pidfd (Linux 5.3) becomes readable when the process ends; where
    there is none, ``wait`` is ``proc.wait(timeout)`` as before (a bare sleep without it)."""

    def __init__(self, pid: int, proc: Any = None) -> None:
        self.fd: int | None = None
        self.proc = proc                            # a Popen: polled where there is no pidfd
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):          # an older kernel, or the process is already reaped
            self.fd = None

    def wait(self, timeout: float) -> None:
        """Return when the process has ended or ``timeout`` seconds passed."""
        if self.fd is None:
            if self.proc is None:
                time.sleep(timeout)
                return
            import subprocess
            try:
                self.proc.wait(timeout=timeout)     # polls every 50 ms at most, as before
            except subprocess.TimeoutExpired:
                pass
            return
        import select
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.poll(max(0, int(timeout * 1000)))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def become_subreaper() -> bool:
    """Orphaned descendants (a daemonised grandchild) are re-parented to this process
    instead of init, so it can find and kill them. False where the kernel refuses."""
    lib = libc()
    return lib is not None and lib.prctl(PR_SET_CHILD_SUBREAPER, 1) == 0


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (what tells it from a later process given the same pid);
    None when it is gone, a zombie (killed, not yet reaped: as good as gone) or not ours to
    see."""
    import psutil
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def began(pid: int, now: float) -> float | None:
    """When ``pid`` started, to the clock tick (10 ms): its age from /proc (its start and the
    uptime, both since boot) taken from ``now`` (``time.time()``). psutil adds the start to
    the boot time, which /proc gives in whole seconds: up to a second off. None when /proc
    cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:
            up = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return now - max(0.0, up - ticks / os.sysconf("SC_CLK_TCK"))


def signal_group(pgid: int, sig: int) -> bool:
    """``killpg`` that treats a group already gone as done; True if the signal was sent."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_group(pgid: int, grace: float, gone: Callable[[], bool], poll: float = 0.1) -> bool:
    """TERM a process group, wait up to ``grace`` seconds for ``gone()`` (its leader ended,
    the service's pid no longer the service), then KILL whatever is left of the group (the
    leader's children that ignored TERM). True if ``gone()`` came within the grace."""
    if not signal_group(pgid, signal.SIGTERM):
        return True                                 # no such group: nothing to stop
    deadline = time.monotonic() + grace
    while not (ended := gone()) and time.monotonic() < deadline:
        time.sleep(poll)
    signal_group(pgid, signal.SIGKILL)
    return ended


def kill_descendants(sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to every descendant of this process (children, their children, and
    orphans re-parented here as a subreaper); returns how many were signalled."""
    import psutil

    count = 0
    try:
        family = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for proc in family:
        try:
            proc.send_signal(sig)
            count += 1
        except psutil.Error:
            pass
    return count


def kill_orphans(keep: set[int]) -> tuple[list, bool]:
    """SIGKILL each child of this process that is not in ``keep``, with its whole tree: as a
    subreaper, what a killed wrapper or guard left running was re-parented here, and a
    grandchild that left the session and cleared its environment is found by nothing else
    once its parent is gone. Returns those children (psutil processes, zombies included,
    for the caller to reap) and whether any of them or theirs still lived. One pass: call
    again for what is re-parented meanwhile."""
    import psutil

    try:
        orphans = [c for c in psutil.Process().children() if c.pid not in keep]
    except psutil.Error:
        return [], False
    live = False
    for child in orphans:
        try:
            family = [child, *child.children(recursive=True)]
        except psutil.Error:
            family = [child]
        for proc in family:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    proc.kill()
                    live = True
            except psutil.Error:
                pass
    return orphans, live


def reap_orphans(keep: set[int], rounds: int = 100) -> None:
    """``kill_orphans`` until none is left, each reaped: for a subreaper none of whose own
    children (``keep``) is left to reap them through its Popen."""
    for _ in range(rounds):
        orphans, _ = kill_orphans(keep)
        if not orphans:
            return
        for child in orphans:
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass


def _living_descendants() -> list:
    import psutil

    try:
        family = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    alive = []
    for proc in family:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            pass
    return alive


def stop_descendants(grace: float, poll: float = 0.05, rounds: int = 20) -> bool:
    """SIGTERM to every descendant, SIGKILL to whatever still lives after ``grace`` seconds
    (listed again each round, so a process forked meanwhile is caught too); True if SIGKILL
    was needed. It never reaps: a caller's ``Popen.wait`` must still see its child's status
    (a child reaped by someone else reads as exit 0)."""
    if not kill_descendants(signal.SIGTERM):
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _living_descendants():
        time.sleep(poll)
    killed = False
    for _ in range(rounds):
        if not _living_descendants():
            break
        killed = kill_descendants(signal.SIGKILL) > 0 or killed
        time.sleep(poll)
    return killed


# -- kill loops: every loop that kills and waits or reaps is here (tests/test_helpers.py) ----------

def kill_orphans_while_alive(keep: set[int], rounds: int = 50, poll: float = 0.02) -> None:
    """``kill_orphans`` again while any of them or theirs lived (what is re-parented here
    meanwhile comes next round); the caller reaps them."""
    for _ in range(rounds):
        if not kill_orphans(keep)[1]:
            return
        time.sleep(poll)


def kill_and_reap_descendants(rounds: int = 200) -> None:
    """SIGKILL every descendant and reap them until this (subreaper) process has no child
    left: a descendant forked meanwhile re-parents here and is caught in the next round."""
    for _ in range(rounds):
        kill_descendants(signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return
        time.sleep(0.01)


def kill_children_and_reap(rounds: int = 100) -> None:
    """SIGKILL every child of this process, with its group when it leads one, and reap them;
    their own orphans (re-parented here, a subreaper) come next round."""
    for _ in range(rounds):
        kids = children()
        if not kids:
            return
        for pid in kids:
            try:
                if os.getpgid(pid) != pid or not signal_group(pid, signal.SIGKILL):
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def kill_until_gone(find: Callable[[], list[int]], timeout: float, poll: float = 0.02) -> bool:
    """SIGKILL what ``find()`` lists (processes not our children: nothing to reap) until it
    lists none; True then, False at ``timeout`` seconds. A process another user owns is not
    ours to signal and is left out from then on."""
    deadline = time.monotonic() + timeout
    foreign: set[int] = set()
    while True:
        left = [p for p in find() if p not in foreign]
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError:
                foreign.add(pid)
        time.sleep(poll)


def stop_processes(procs: Sequence[Any], timeout: float = 5.0) -> None:
    """``multiprocessing`` processes ended: TERM to each alive, then each joined, SIGKILLed
    and joined again if still alive after ``timeout`` seconds."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join()


# -- /proc: who a process is (tests/test_helpers.py) ---------------------------------------------

def children() -> list[int]:
    """This process's children: /proc/self/task/TID/children is one small read (psutil
    scans every process; it is the fallback where the kernel lacks that file)."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children", "rb") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        import psutil
        return [c.pid for c in psutil.Process().children()]


def cgroup_v2(pid: int) -> str | None:
    """The cgroup v2 path of process ``pid`` (``/proc/PID/cgroup``'s ``0::`` line), None
    when it has none or is gone."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return next((ln.split(":", 2)[2].strip() for ln in f if ln.startswith("0::")), None)
    except OSError:
        return None


def cpu_wait(pid: int) -> float | None:
    """Seconds the threads of process ``pid`` have waited on a run queue for a CPU, summed
    (``/proc/PID/task/*/schedstat``, its second field: the scheduler's run delay); None
    when gone, or without schedstats. A thread that ended takes its count with it."""
    total, seen = 0, False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                fields = f.read(256).split()
        except OSError:
            continue
        if len(fields) >= 2 and fields[1].isdigit():
            total, seen = total + int(fields[1]), True
    return total / 1e9 if seen else None


def session_and_state(pid: int | str) -> tuple[int, str] | None:
    """(session id, state letter) of a process, from /proc/PID/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[3]), fields[0].decode()


def parent_of(pid: int | str) -> int | None:
    """A process's parent pid, from /proc/PID/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rsplit(b")", 1)[1].split()     # the name may hold spaces and ')'
    except (OSError, IndexError):
        return None
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def descends_from(pid: int, ancestor: int, depth: int = 64) -> bool:
    """Whether ``ancestor`` is among ``pid``'s parents (at most ``depth`` up)."""
    for _ in range(depth):
        parent = parent_of(pid)
        if parent is None or parent <= 1:
            return False
        if parent == ancestor:
            return True
        pid = parent
    return False


def environ(pid: int | str) -> bytes:
    """A process's environment as the kernel keeps it (``VAR=value`` each ended by NUL);
    empty when gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def command_line(pid: int | str) -> bytes:
    """A process's command line as the kernel keeps it (each argument ended by NUL);
    OSError when it is gone or not ours to read."""
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def command_lines() -> Iterator[tuple[int, list[str]]]:
    """(pid, argv) of every process whose command line this one can read."""
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = [a for a in cmd.read_bytes().decode(errors="replace").split("\0") if a]
        except OSError:
            continue
        yield int(cmd.parent.name), argv
