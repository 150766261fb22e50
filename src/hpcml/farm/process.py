"""Starting and waiting for task processes: the pieces of a worker that talk to the kernel.

Tasks carry PR_SET_PDEATHSIG (``hpcml.proctree.die_with_parent``, or util-linux's
``setpriv --pdeathsig`` in front of the command) so they die with their worker; a plain
command is exec'd without a shell; a worker waits for its task on a pidfd, or, on kernels
before 5.3, on a pipe that SIGCHLD writes to; what a task left behind is killed when it
ends (``kill_leftovers``, guard.py says why that finds daemons too).
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import time

from hpcml.proctree import kill_children_and_reap

_PLAIN = re.compile(r"^[A-Za-z0-9_./:,+@%=-][A-Za-z0-9_./:,+@%= -]*$")
_SHELL_WORDS = {"cd", "exit", "export", "source", ".", "exec", "set", "unset", "ulimit", "umask", "eval"}
_FOUND: dict[str, str | None] = {}


def argv_of(command: str) -> list[str]:
    """Exec a plain command directly; anything with shell syntax, a builtin or a program not
    on PATH (the shell gives the usual message) via /bin/sh."""
    if _PLAIN.match(command):
        words = shlex.split(command)
        if words and "=" not in words[0] and words[0] not in _SHELL_WORDS:
            if words[0] not in _FOUND:
                _FOUND[words[0]] = shutil.which(words[0])
            if _FOUND[words[0]]:
                return words
    return ["/bin/sh", "-c", command]


class ExitWaiter:
    """``wait(ms)``: True once the task has exited (not reaped), False after ``ms``."""

    def wait(self, ms: int) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        pass


class PidfdWaiter(ExitWaiter):
    """poll() on the task's pidfd: woken by its exit, nothing else."""

    def __init__(self, proc: subprocess.Popen):
        self.fd = os.pidfd_open(proc.pid)
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

    def wait(self, ms: int) -> bool:
        return bool(self.poller.poll(ms))

    def close(self) -> None:
        os.close(self.fd)


class SigchldPipe:
    """Without pidfds: SIGCHLD writes a byte to a pipe (``signal.set_wakeup_fd``), so a
    task that exits between the check and the poll still wakes the worker."""

    def __init__(self) -> None:
        self.read, write = os.pipe()
        os.set_blocking(self.read, False)
        os.set_blocking(write, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self.poller = select.poll()
        self.poller.register(self.read, select.POLLIN)

    def waiter(self, proc: subprocess.Popen) -> ExitWaiter:
        pipe = self

        class _Waiter(ExitWaiter):
            def wait(self, ms: int) -> bool:
                deadline = time.monotonic() + ms / 1000
                while True:
                    try:
                        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                            return True
                    except ChildProcessError:
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    if pipe.poller.poll(int(left * 1000) + 1):
                        try:
                            while os.read(pipe.read, 512):
                                pass
                        except BlockingIOError:
                            pass
        return _Waiter()


def kill_leftovers() -> None:
    """After a task ended (and was reaped): SIGKILL every child of this worker, which as a
    subreaper adopts what the task daemonised (``setsid``, a double fork), with its group,
    and reap them, round after round (``proctree.kill_children_and_reap``)."""
    kill_children_and_reap()
