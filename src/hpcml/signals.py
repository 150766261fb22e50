"""Passing Slurm's signals on to the processes a wrapper started.

A wrapper (``hpcml observe record`` around a task, ``hpcml run`` around srun or its local
ranks) is the process Slurm signals: TERM at the time limit, USR1/USR2 as the pre-emption
or "checkpoint now" warning (``#SBATCH --signal=B:USR1@300`` signals the batch shell's
process, which ``exec hpcml run`` makes hpcml), HUP, CONT. Python's default for USR1,
USR2 and HUP is to die at once, leaving the training processes without their warning.
srun passes what it gets on to every task, so forwarding to srun reaches all ranks.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

#: what a wrapper forwards; SIGINT only where the terminal's Ctrl-C does not reach the
#: children itself (a foreground process group gets it already)
SLURM_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)


class Forwarder:
    """Each signal received is sent on to every running process of ``targets()``
    (``subprocess.Popen`` objects) exactly once, and kept in ``seen`` in order. Held (not
    ``open``) while the targets are being started: a signal then waits and goes to all of
    them once they are (a launcher's TERM while its ranks start, which Python's default
    would have turned into the launcher's death with its ranks unrecorded). Each signal is
    taken from a deque by one ``popleft`` (atomic for a handler that interrupts the loop),
    so a handler and the opening never send one twice."""

    def __init__(self, targets: Callable[[], Iterable], *, held: bool = False) -> None:
        self.targets = targets
        self.seen: list[int] = []
        self._unsent: deque[int] = deque()
        self._open = not held

    def handler(self, sig: int, _frame: Any) -> None:
        self.add(sig)

    def add(self, sig: int) -> None:
        """``sig`` as if just received (also a signal noted before this forwarder existed)."""
        self.seen.append(sig)
        self._unsent.append(sig)
        if self._open:
            self._drain()

    def open(self) -> None:
        """The targets run: what waited is sent now, what comes later at once."""
        self._open = True
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                sig = self._unsent.popleft()
            except IndexError:
                return
            for p in self.targets():
                if p.poll() is None:
                    try:
                        p.send_signal(sig)
                    except ProcessLookupError:
                        pass                  # ended between the poll and the kill


@contextmanager
def forwarding_to(targets: Callable[[], Iterable], signals: Iterable[int] = SLURM_SIGNALS, *,
                  held: bool = False) -> Iterator[Forwarder]:
    """A ``Forwarder`` handling ``signals`` while inside; the previous handlers come back
    on exit. Main thread only (Python's rule)."""
    fw = Forwarder(targets, held=held)
    previous = install(signals, fw.handler)
    try:
        yield fw
    finally:
        restore(previous)


@contextmanager
def forwarding(targets: Callable[[], Iterable], signals: Iterable[int] = SLURM_SIGNALS) -> Iterator[list[int]]:
    """While inside, each of ``signals`` is sent on to every running process of
    ``targets()``; yields the list of signals received, in order. The previous handlers
    come back on exit. Main thread only (Python's rule)."""
    with forwarding_to(targets, signals) as fw:
        yield fw.seen


@contextmanager
def handling(signals: Iterable[int], handler: Callable) -> Iterator[None]:
    """``handler`` for ``signals`` while inside; the previous handlers come back on exit
    (a server's TERM/INT loop, a service job's body: called from tests too, whose own
    handlers must survive)."""
    previous = install(signals, handler)
    try:
        yield
    finally:
        restore(previous)


def install(signals: Iterable[int], handler: Callable) -> dict[int, Any]:
    """Set ``handler`` for each of ``signals``; returns what was there, for ``restore``.
    A library that installs handlers must give the caller's back when it is done."""
    return {s: signal.signal(s, handler) for s in signals}


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers ``install`` replaced."""
    for s, h in previous.items():
        signal.signal(s, h)
