"""Run checks in forked children with hard timeouts, several at once.

A check may hang in the kernel (a dead NFS mount, a GPU that fell off the bus) or crash
the interpreter (a segfault in a driver binding). Threads cannot be killed, so each check
runs in its own forked child, in its own process group: on timeout the whole group is
killed and the worker carries on. fork costs about a millisecond, far less than starting
a fresh interpreter per check, and children that run side by side are waited for with one
``select`` loop, without threads (forking from a threaded process risks deadlocks).
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class Timeout(Exception):
    """The check did not finish in time. ``ran_s`` and ``waited_s``: the seconds its process
    spent on a CPU and waiting in the run queue for one (``/proc/PID/schedstat``; None where
    the kernel does not say), so a check starved of CPU is told from one that hung."""

    def __init__(self, message: str, ran_s: float | None = None, waited_s: float | None = None) -> None:
        super().__init__(message)
        self.ran_s = ran_s
        self.waited_s = waited_s


def cpu_times(pid: int) -> tuple[float, float] | tuple[None, None]:
    """(seconds on a CPU, seconds runnable but waiting for one) of a process, from the
    scheduler's own accounting."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            ran, waited, _ = f.read().split()
        return int(ran) / 1e9, int(waited) / 1e9
    except (OSError, ValueError):
        return None, None


class ChildFailed(Exception):
    pass


class Interrupted(Exception):
    """The user interrupted the run (SIGINT) before this check finished; it was killed."""


_interrupted = False


def interrupted() -> bool:
    """Whether a run in this process was interrupted: callers start no further checks."""
    return _interrupted


def mark_interrupted() -> None:
    global _interrupted
    _interrupted = True


#: a check runs with these as a fresh process has them, not as its parent (``hpcml run``'s
#: launcher keeps USR1 for its ranks and stops on TERM before the command starts)
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _child(fn: Callable[[], dict[str, Any]], write_fd: int) -> None:
    for sig in DEFAULT_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    os.setpgid(0, 0)
    faulthandler.disable()  # a crash is reported as this check's error, not a stack dump
    os.dup2(2, 1)  # a check's prints must not break the worker's result lines on stdout
    sys.stdout = sys.stderr  # ... whatever object sys.stdout was
    try:
        payload: dict[str, Any] = {"ok": fn()}
    except BaseException as exc:  # everything a check raises becomes an error outcome
        import traceback  # only when a check raised
        text = str(exc).strip()
        payload = {"exc": type(exc).__name__, "msg": text.splitlines()[0] if text else "",
                   "tb": traceback.format_exc(limit=6)}
    data = json.dumps(payload, default=str).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(write_fd, view):]
    os.close(write_fd)
    os._exit(0)


@dataclass
class _Running:
    pid: int
    fd: int
    timeout: float
    deadline: float
    chunks: list[bytes] = field(default_factory=list)
    outcome: Any = None
    done: bool = False


def _start(fn: Callable[[], dict[str, Any]], timeout: float) -> _Running:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        _child(fn, write_fd)
    os.close(write_fd)
    return _Running(pid, read_fd, timeout, time.monotonic() + timeout)


def _finish(run: _Running, timed_out: bool) -> None:
    os.close(run.fd)
    run.done = True
    ran, waited = cpu_times(run.pid) if timed_out else (None, None)
    if timed_out:
        _kill_group(run.pid)
    status = _reap(run.pid)
    if timed_out:
        run.outcome = Timeout(f"timed out after {run.timeout:g} s", ran, waited)
    elif not run.chunks:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        run.outcome = ChildFailed(f"check crashed (signal {signal.Signals(sig).name})" if sig
                                  else f"check exited without a result (status {status})")
    else:
        payload = json.loads(b"".join(run.chunks))
        run.outcome = payload["ok"] if "ok" in payload else \
            ChildFailed(payload["exc"], payload["msg"], payload.get("tb", ""))


def run_many(jobs: Sequence[tuple[Callable[[], dict[str, Any]], float]]) -> list[Any]:
    """Start every ``(fn, timeout)`` at once; return each result dict or its exception."""
    global _interrupted
    if _interrupted:
        return [Interrupted("interrupted before it started") for _ in jobs]
    runs: list[_Running] = []
    try:
        for fn, timeout in jobs:
            runs.append(_start(fn, timeout))
        _wait(runs)
    except KeyboardInterrupt:
        # the children run in their own process groups (a timeout kills a whole group), so
        # the terminal's SIGINT does not reach them: kill them here, never leave one running
        _interrupted = True
        for r in _stop_unfinished(runs):
            r.outcome = Interrupted("interrupted (SIGINT): the check was stopped")
        return [r.outcome for r in runs] + [Interrupted("interrupted before it started")
                                            for _ in jobs[len(runs):]]
    except BaseException:          # the launcher stopped by TERM (hpcml.run.launcher): none left running
        _stop_unfinished(runs)
        raise
    return [r.outcome for r in runs]


def _stop_unfinished(runs: list[_Running]) -> list[_Running]:
    """Kill and reap every check still running (its whole process group); those it stopped."""
    stopped = [r for r in runs if not r.done]
    for r in stopped:
        os.close(r.fd)
        r.done = True
        _kill_group(r.pid)
        _reap(r.pid)
    return stopped


def _wait(runs: list[_Running]) -> None:
    while not all(r.done for r in runs):
        now = time.monotonic()
        for r in runs:
            if not r.done and now >= r.deadline:
                _finish(r, timed_out=True)
        waiting = [r for r in runs if not r.done]
        if not waiting:
            break
        wait = max(0.0, min(r.deadline for r in waiting) - now)
        ready, _, _ = select.select([r.fd for r in waiting], [], [], wait)
        for r in waiting:
            if r.fd in ready:
                chunk = os.read(r.fd, 1 << 16)
                if chunk:
                    r.chunks.append(chunk)
                else:
                    _finish(r, timed_out=False)


def _kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def _reap(pid: int, patience: float = 0.5) -> int:
    """Wait status of the child; give up after ``patience`` seconds when a killed child
    is stuck in uninterruptible sleep (a hung mount): a zombie is better than a hang."""
    end = time.monotonic() + patience
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > end:
            return 0
        time.sleep(0.001)
