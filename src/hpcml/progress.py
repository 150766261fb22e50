"""Progress of long work (indexing shards, reading a job's ranks, vetting nodes), said by the
library and drawn by the CLI.

Library code calls ``advance(what, done, total)`` as it goes: a no-op unless a command
installed a reporter. ``on_terminal`` installs one, a Rich bar on stderr, only where stderr
is a terminal and the command is not printing JSON: a log file or a pipe gets nothing, and
stdout (the result) never gets a bar. One reporter per process, behind a lock, so that work
on threads (a pool indexing shards, the vet's reader thread) reports into it too; a
``ContextVar`` would not reach threads a pool started.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Reporter(Protocol):
    def __call__(self, what: str, done: int, total: int | None) -> None: ...


_lock = threading.Lock()
_reporter: Reporter | None = None


def advance(what: str, done: int, total: int | None = None) -> None:
    """``done`` of ``total`` (None: not known) items of the work called ``what`` are done."""
    reporter = _reporter
    if reporter is not None:
        try:
            reporter(what, done, total)
        except Exception:  # noqa: BLE001 - a bar that fails must not stop the work
            pass


class Counter:
    """A count shared by threads, reported at each step (``advance`` for work done in a pool)."""

    def __init__(self, what: str, total: int | None) -> None:
        self.what, self.total, self.done = what, total, 0
        self._lock = threading.Lock()

    def step(self, *_: Any) -> None:
        with self._lock:
            self.done += 1
            done = self.done
        advance(self.what, done, self.total)


def wanted(as_json: bool = False) -> bool:
    """Whether a bar is drawn: stderr is a terminal and the output is not JSON."""
    return not as_json and sys.stderr.isatty()


@contextmanager
def on_terminal(enabled: bool = True) -> Iterator[None]:
    """A Rich bar per kind of work while the block runs, where ``wanted``; nothing else
    changes (the reporter is uninstalled after, the bar erased)."""
    global _reporter
    if not enabled or not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    tasks: dict[str, Any] = {}

    def report(what: str, done: int, total: int | None) -> None:
        with _lock:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done, total=total)
    with _lock:
        previous, _reporter = _reporter, report
    try:
        with bar:
            yield
    finally:
        with _lock:
            _reporter = previous
