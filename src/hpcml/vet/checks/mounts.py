"""Required mounts: present, mounted, and answering. A hung parallel filesystem blocks
``stat`` in the kernel, so each path is probed in a daemon thread with its own timeout and
a hung one is named instead of hanging the check."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import MountsParams  # noqa: F401


def _probe(path: str, mountpoint: bool) -> str | None:
    if not os.path.exists(path):
        return "missing"
    if mountpoint and not os.path.ismount(path):
        return "not a mount point"
    os.statvfs(path)
    if os.path.isdir(path):
        with os.scandir(path) as it:
            next(it, None)
    return None


def _queued_s(thread: threading.Thread) -> float:
    """Seconds the thread has been runnable but waiting for a CPU (the kernel's schedstat)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def join_running(thread: threading.Thread, timeout: float) -> None:
    """Wait for the thread until it has had ``timeout`` seconds not spent waiting for a CPU.
    A probe blocked on a hung mount is not runnable, so its time counts in full; one starved
    of CPU on an oversubscribed node is not called a hung mount (the check's own timeout
    still bounds the wait)."""
    start, queued = time.monotonic(), _queued_s(thread)
    while thread.is_alive():
        spent = time.monotonic() - start - (_queued_s(thread) - queued)
        if spent >= timeout:
            return
        thread.join(min(timeout - spent, 0.25))


class MountsCheck(Check["MountsParams"]):
    default_timeout = 10.0

    def run(self) -> CheckReport:
        p = self.params
        answers: dict[str, str | None] = {}
        threads = []
        for path in p.paths:
            path = os.path.expandvars(path)

            def probe(path=path):
                try:
                    answers[path] = _probe(path, p.must_be_mountpoint)
                except OSError as exc:
                    answers[path] = exc.strerror or str(exc)
            t = threading.Thread(target=probe, daemon=True)
            t.start()
            threads.append((path, t))
        for _path, t in threads:
            join_running(t, p.probe_timeout)
        problems = [f"{path}: {answers[path] if path in answers else f'no answer within {p.probe_timeout:g} s'}"
                    for path, _ in threads if answers.get(path, "hung") is not None]
        return judge(not problems, len(problems), threshold="0 bad paths", unit="bad paths",
                     message="; ".join(problems) or f"{len(threads)} paths answer")
