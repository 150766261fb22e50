"""kill -9 at random moments, many times: a forked child repeats one piece of hpcml's work
for ever and is killed with SIGKILL after a random delay (no ``finally`` runs), and the
test then counts, by path, what was left. Forked, not spawned, so that a hundred kills
cost a fraction of a second each rather than an interpreter's start.

The work is done once in the test's own process first: what a first call pays once (an
import, a validator built on first use) would otherwise take every child's whole life,
and the kills would never land in the work."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil  # noqa: F401 - imported here, so that a forked child judging a leftover's maker does not pay its import

#: the kills spread over at least this long, so that on a loaded machine (a child's first
#: piece of work late by milliseconds) some children still finish pieces before their kill
MIN_SPAN_S = 0.05


@dataclass
class Kills:
    killed: int          # children killed by SIGKILL (all of them, unless one's work raised)
    done: int            # pieces of work the children finished before their kill
    one_s: float         # how long one piece took in the test's process


def kill_loop(work: Callable[[int], None], *, times: int = 40, seed: int = 61,
              after: Callable[[], None] | None = None) -> Kills:
    """Time ``work(-1)`` here, then fork ``times`` children, each calling ``work(0)``,
    ``work(1)``, ... until it is killed with SIGKILL after a uniform random delay of up to
    three pieces of work (at least ``MIN_SPAN_S``; 25% more after each child while none has
    finished a piece: on a loaded machine a child's pieces can take several times the
    parent's); ``after()`` looks at what each kill left, before the next child
    starts (a child's work may clear what the one before it left). A child whose work
    raises exits 3 (not counted as killed)."""
    t0 = time.perf_counter()
    work(-1)
    one = time.perf_counter() - t0
    rng = random.Random(seed)
    killed = done = 0
    span = max(3 * one, MIN_SPAN_S)
    for _ in range(times):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # the child: work until killed
            os.close(r)
            try:
                os.write(w, b"s")
                i = 0
                while True:
                    work(i)
                    os.write(w, b"d")
                    i += 1
            finally:
                os._exit(3)
        os.close(w)
        os.read(r, 1)
        time.sleep(rng.uniform(0, span))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        finished = 0
        while chunk := os.read(r, 4096):
            finished += len(chunk)
        done += finished
        if not done:            # no child has finished a piece yet (a loaded machine, a slow fork):
            span *= 1.25        # the kills spread wider, still at random, so some land after work
        os.close(r)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            killed += 1
        if after is not None:
            after()
    return Kills(killed, done, one)


def left(directory: Path) -> list[str]:
    """Every path under ``directory``, relative, sorted (what a kill left is in it)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))
