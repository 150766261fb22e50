"""Run one check in a forked child with a hard timeout.

A check may hang in the kernel (a dead NFS mount, a GPU that fell off the bus) or crash
the interpreter (a segfault in a driver binding). Threads cannot be killed, so each check
runs in its own forked child, in its own process group: on timeout the whole group is
killed and the worker carries on with the next check. fork costs about a millisecond,
far less than starting a fresh interpreter per check.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any


class Timeout(Exception):
    pass


class ChildFailed(Exception):
    pass


def _child(fn: Callable[[], dict[str, Any]], write_fd: int) -> None:
    os.setpgid(0, 0)
    faulthandler.disable()  # a crash is reported as this check's error, not a stack dump
    os.dup2(2, 1)  # a check's prints must not break the worker's result line on stdout
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        payload = {"ok": fn()}
    except BaseException as exc:  # everything a check raises becomes an error outcome
        payload = {"exc": type(exc).__name__, "msg": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                   "tb": traceback.format_exc(limit=6)}
    data = json.dumps(payload, default=str).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(write_fd, view):]
    os.close(write_fd)
    os._exit(0)


def _kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def run_isolated(fn: Callable[[], dict[str, Any]], timeout: float) -> dict[str, Any]:
    """Return ``fn()``'s dict, or raise Timeout / ChildFailed (with the child's error)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        _child(fn, write_fd)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill_group(pid)
                raise Timeout(f"timed out after {timeout:g} s")
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if ready:
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read_fd)
        status = _reap(pid)
    if not chunks:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        raise ChildFailed(f"check crashed (signal {signal.Signals(sig).name})" if sig
                          else f"check exited without a result (status {status})")
    payload = json.loads(b"".join(chunks))
    if "exc" in payload:
        raise ChildFailed(payload["exc"], payload["msg"], payload.get("tb", ""))
    return payload["ok"]


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
        time.sleep(0.002)
