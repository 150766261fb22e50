"""Every optimizer step a step, for a training script that logs none itself.

``hpcml run``'s sitecustomize (``hpcml.run.inject``) calls ``install`` in a rank's main
process when ``torch.optim`` is first imported. torch's global optimizer step hooks then
record each step through ``hpcml.observe.api``, the path a script's own
``observe.section("step", step=n)`` takes: the recorder's heartbeat, the store, the report
and the live watch see it, so an unchanged ``torch.optim`` loop (HF Trainer, Lightning) gets
its hang stopped and its throughput reported.

What a step is:

* one ``optimizer.step()`` that returns: with gradient accumulation the micro-batches
  between two calls are one step; a step a ``GradScaler`` skips is none; a ``step()``
  called inside another's (ZeroRedundancyOptimizer's inner optimizer, a subclass's
  ``super().step()``) is part of it.
* Several optimizers (a GAN): the steps of one, the first to step. Another one takes over
  when it steps ``TAKEOVER`` times with none of the counted one's in between (that one was
  replaced: a new phase, an optimizer built again; its own first step there is not
  counted), so steps never stop while some optimizer steps: a rank the watch sees idle is
  idle. Optimizers that step once each per iteration never take over.
* Step n is this process's n-th (from 1). It ends when its ``step()`` returns and starts
  where step n-1 ended, so its time is the whole iteration (data loading, forward,
  backward, the optimizer, an evaluation in between); step 1 starts when its ``step()`` is
  called (what came before is start-up).
* A program that logs its own steps (``hpcml.observe.api.own_steps``) keeps them: from then
  on nothing is recorded here. Whether it does shows within its
  first iteration, so step 1 is held until step 2 ends (or the process exits).

Cost: two Python calls of a few microseconds per ``step()``; nothing in a forked child
(a DataLoader worker), whose steps are not the rank's.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from hpcml.observe import api

TAKEOVER = 2                # steps in a row of another optimizer that make it the one counted

Record = Callable[[int, float, int], bool]      # (step, seconds, end epoch ns) -> still wanted


def _ref(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:                            # an optimizer with __slots__: kept alive
        return lambda: obj


class Steps:
    """The rules above; ``pre`` and ``post`` are torch's hooks' signature and never raise."""

    def __init__(self, record: Record = api.optimizer_step, own: Callable[[], bool] = api.own_steps,
                 start: Callable[[], None] = api.start) -> None:
        self.record, self.own, self.start = record, own, start
        self.n = 0
        self.base = 0                    # the step the framework resumed at (resume_at)
        self.pacer: Callable[[], Any] | None = None      # the optimizer whose steps count
        self.others: dict[int, int] = {}                 # the others' steps since its last (by id)
        self.active: list[FrameType] = []                # the torch wrappers of the step() calls under way
        self.first = 0                                   # perf ns: when the first step() began
        self.last = 0                                    # perf ns: when the last counted step ended
        self.held: tuple[int, float, int] | None = None  # step 1, until the program showed whether it logs its own
        self.off = False
        self.handles: list[Any] = []

    # -- torch's hooks -------------------------------------------------------------------

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.off:
            return
        try:
            frame = sys._getframe(1)
            if self.active and not self._inside(frame):
                self.active.clear()                  # a step() that raised: its post hook never came
            self.active.append(frame)
            if len(self.active) == 1 and not self.first:
                self.first = time.perf_counter_ns()
        except Exception:  # noqa: BLE001, S110 - inside optimizer.step(): never raise
            pass

    def post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.off:
            return
        try:
            frame = sys._getframe(1)
            if frame in self.active:
                del self.active[self.active.index(frame):]
            if self.active or not self._counts(optimizer):
                return                               # inside another step(), or not the optimizer counted
            end, end_ns = time.perf_counter_ns(), time.time_ns()
            start = self.last or self.first or end
            self.last = end
            self.n += 1
            self._emit((self.n, (end - start) / 1e9, end_ns))
        except Exception:  # noqa: BLE001, S110
            pass

    # -- the rules -----------------------------------------------------------------------

    def _inside(self, frame: FrameType) -> bool:
        """Whether ``frame`` (a step() wrapper) runs inside one of the step() calls under way."""
        f = frame.f_back
        while f is not None:
            if any(f is a for a in self.active):
                return True
            f = f.f_back
        return False

    def _counts(self, optimizer: Any) -> bool:
        pacer = self.pacer() if self.pacer is not None else None
        if pacer is not None and pacer is not optimizer:
            n = self.others[id(optimizer)] = self.others.get(id(optimizer), 0) + 1
            if n < TAKEOVER:
                return False
        self.pacer, self.others = _ref(optimizer), {}   # the first, the one it was is gone, or a takeover
        return True

    def _emit(self, step: tuple[int, float, int]) -> None:
        if self.own():
            self._stop()
            return
        if step[0] == 1:
            self.held = step
            self.start()                     # its exit handler, registered first, runs after ours
            atexit.register(self._exit)
            return
        if self.held is not None:
            held, self.held = self.held, None
            self._record(held)
        if not self._record(step):
            self._stop()

    def _record(self, step: tuple[int, float, int]) -> bool:
        """Recorded as the framework numbers it: after its resume step (``resume_at``)."""
        return self.record(step[0] + self.base, step[1], step[2])

    def _exit(self) -> None:
        if self.held is not None and not self.off and not self.own():
            held, self.held = self.held, None
            self._record(held)

    def _stop(self) -> None:
        """The program logs its own steps, or this is a forked child: nothing more. The hooks
        stay (one test each per step()): removing one while torch loops over them raises."""
        self.off, self.held = True, None


_installed: list[Steps] = []


def resume_at(step: int) -> None:
    """The framework resumed its training at ``step`` (HF Trainer's, Lightning's global
    step: ``hpcml.observe.resumes``): this process's next optimizer step is ``step + 1``, so
    the ranks' steps are the framework's and a restart's lost steps can be counted."""
    for steps in _installed:
        if steps.n == 0:
            steps.base = step


def install(steps: Steps | None = None) -> Steps:
    """Register ``steps`` (a new ``Steps``) as torch's global optimizer step hooks; a forked
    child (a DataLoader worker) removes them."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    steps = steps or Steps()
    _installed.append(steps)
    steps.handles = [register_optimizer_step_pre_hook(steps.pre), register_optimizer_step_post_hook(steps.post)]
    os.register_at_fork(after_in_child=steps._stop)
    return steps
