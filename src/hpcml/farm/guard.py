"""Making a task's whole process tree die with its attempt, whatever kills the worker.

PR_SET_PDEATHSIG reaches one process: a task's ``/bin/sh -c`` died with its worker, but
the shell's children (a ``python train.py``, a ``sleep``) lived on and ran beside the
rerun. So each worker is two processes (``guarded``, one fork at the worker's start, no
cost per task):

* the guard, in a session of its own (a ``kill -9`` of the farm's process group does not
  reach it) and a child subreaper, with PR_SET_PDEATHSIG set to the catchable SIGTERM.
  When its parent (the agent, ``hpcml farm run``) dies, or its worker does (kill -9, a
  crash), it kills every descendant: orphans re-parent to a subreaper, so a daemonised
  grandchild (``setsid sleep &``, ``nohup``) is among them too; then it exits the way its
  worker did.
* the worker, its child (PR_SET_PDEATHSIG SIGKILL: it dies with the guard), itself a
  subreaper, so what a finished task left behind is its child and is killed at the end
  of each attempt (``process.kill_leftovers``).

When the guard is stopped (its parent died: ``kill -9`` of the farm's process group), it
first asks the worker to stop (``STOP``, SIGUSR1) and gives it ``STOP_GRACE`` seconds: the
worker kills a task still running (that attempt is lost, no end is written) but records the
end of a task that had already exited, which it, the process that waits on the task, alone
knows. Only then is everything killed. So a task that finished is not rerun merely because
the farm was killed in the milliseconds between its exit and its end record.

What only the guard cannot cover is a guard killed on its own with SIGKILL (and its
worker with it): then ``sweep`` proves the attempt gone before it is rerun on that host.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpcml.proctree import (
    become_subreaper,
    die_with_parent,
    environ,
    kill_and_reap_descendants,
    kill_until_gone,
    session_and_state,
    start_time,
)

_STOPS = (signal.SIGTERM, signal.SIGHUP)
STOP = signal.SIGUSR1                          # guard -> worker: record what has ended, start nothing, exit
STOP_GRACE = 5.0                               # seconds the worker has for that before it is killed


class _Stopped(Exception):
    pass


_STOPPING = [False]                            # once set, a stop signal changes nothing


def _stop(*_: object) -> None:
    if not _STOPPING[0]:
        _STOPPING[0] = True
        raise _Stopped


def guarded(work: Callable[[], int]) -> int:
    """Run ``work`` in a forked child guarded by this process (see the module docstring);
    returns the child's exit code as ``Popen.returncode`` gives it (-N: signal N)."""
    try:
        os.setsid()
    except PermissionError:
        pass                                   # already leads its own session
    become_subreaper()
    for sig in _STOPS:
        signal.signal(sig, _stop)
    die_with_parent(signal.SIGTERM)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                               # the worker
        code = 1
        try:
            for sig in _STOPS:
                signal.signal(sig, signal.SIG_DFL)
            die_with_parent(signal.SIGKILL)
            become_subreaper()
            code = work()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return _guard(pid)


def _guard(worker: int) -> int:
    code = -signal.SIGKILL                     # what it ends as if we are stopped first
    try:
        while True:
            try:
                got, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if got == worker:
                code = os.waitstatus_to_exitcode(status)
                break
        _STOPPING[0] = True                    # in the try: a signal until here is caught
    except _Stopped:
        _let_finish(worker)
    kill_and_reap_descendants()               # a descendant forked meanwhile: caught next round
    return code


def _let_finish(worker: int) -> None:
    """Ask the worker to stop (``STOP``) and wait for it, ``STOP_GRACE`` seconds at most,
    reaping the orphans that come to this subreaper meanwhile."""
    try:
        os.kill(worker, STOP)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE
    while time.monotonic() < deadline:
        try:
            got, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if got == worker:
            return
        if got == 0:
            time.sleep(0.005)


def exit_like(code: int) -> int:
    """End this process as ``code`` says: a signal is re-raised (the agent respawns a
    worker that was killed), else the code is returned for sys.exit."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):   # no handler can be set for these
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


# -- proving a lost attempt gone on this host ------------------------------------------------

def members(session: int | None, since: float | None, marker: list[bytes]) -> list[int]:
    """Live processes of ``session`` (unless that id now belongs to a newer process: the
    kernel reuses a session id only once nothing is left in it) and processes whose
    environment holds every ``marker`` (``VAR=value``)."""
    if session == os.getsid(0) or since is None or (session is not None and session <= 1):
        session = None                         # never our own, init's, or one no start time identifies
    if session is not None and since is not None:
        leader = start_time(session)
        if leader is not None and abs(leader - since) > 1.0:
            session = None                     # reused: the recorded session is gone
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        st = session_and_state(entry)
        if st is None or st[1] in ("Z", "X"):
            continue
        if st[0] == session:
            out.append(int(entry))
            continue
        env = environ(entry).split(b"\0")
        if marker and all(m in env for m in marker):
            out.append(int(entry))
    return out


def sweep(session: int | None, since: float | None, marker: list[bytes], timeout: float = 10.0) -> bool:
    """Kill what is left of a lost attempt on this host; True once nothing is (proven gone)."""
    return kill_until_gone(lambda: members(session, since, marker), timeout)


def attempt_marker(farm: Path, tid: int, attempt: int) -> list[bytes]:
    """The variables every process of an attempt inherits (worker.py sets them)."""
    return [f"HPCML_FARM_DIR={Path(farm).absolute()}".encode(), f"HPCML_FARM_TASK_ID={tid}".encode(),
            f"HPCML_FARM_ATTEMPT={attempt}".encode()]
