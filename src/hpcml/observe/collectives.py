"""Time a rank waits in collectives, for an unchanged script: what finds the straggler of a
synchronous job.

In data-parallel training every rank waits for the slowest inside the gradient all-reduce,
so every rank's step takes as long as the slowest's and step times name no one. What
differs is where the time goes: the slow rank computes longer and waits least; the others
wait for it. So each rank's step is split into time waiting in collectives and time
outside them ("compute": forward, backward, data, the optimizer), and the straggler model
(``hpcml.observe.stragglers``) scores the compute. Every time is a duration on the rank's
own clock (``perf_counter``): no clock is compared across nodes.

What is timed (``install``, from ``hpcml run``'s sitecustomize in the rank's main process):

* DDP's bucketed all-reduce: a communication hook (``register_comm_hook``, DDP's public
  API) registered when a ``DistributedDataParallel`` is built. It runs the all-reduce as
  DDP's default does (``default_hooks.allreduce_hook``: average over the group) or the hook
  the script registers later (which then runs inside ours: DDP takes one hook, and the
  script's call must not fail). Per backward, the wait is from the moment this rank's last
  bucket was ready (its backward computed) to the moment the all-reduces of every bucket
  completed: the time it waited for the others (plus the transfer itself).
* A blocking call of a ``torch.distributed`` collective or point-to-point receive made
  through the ``torch.distributed`` namespace (``dist.all_reduce(t)``, ``dist.barrier()``,
  ``dist.recv``...): its duration. One launched with ``async_op=True`` is not timed (its
  wait is wherever the script waits on the work).

Not measured, so the step time is scored as it was: collectives on a GPU (NCCL's work is
queued on a stream; the CPU does not wait inside the call), compiled autograd, and DDP's
own collectives outside the hook (the bucket rebuild's broadcast in the second iteration's
forward, the buffers' broadcast with ``broadcast_buffers``). Each wait
is kept as (end, seconds) on the epoch clock, so a step takes only the part of a wait that
falls inside it (a barrier at start-up is no step's). ``HPCML_RUN_COLLECTIVE_WAIT=0`` turns
it off.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections import deque
from typing import Any

from hpcml.observe import api

#: the torch.distributed functions that block until the others took part (async_op aside)
BLOCKING = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
            "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "barrier",
            "monitored_barrier", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter",
            "scatter_object_list", "recv")
KEPT = 10_000            # waits kept while no step takes them (a script that never steps)
_NS = time.time_ns
_PERF = time.perf_counter_ns


class Waits:
    """The waits not yet taken by a step: (end epoch ns, seconds), appended from any thread
    (gloo's completes the all-reduce's futures on its own)."""

    def __init__(self) -> None:
        self.q: deque[tuple[int, int]] = deque(maxlen=KEPT)

    def add(self, end_ns: int, wait_ns: int) -> None:
        if wait_ns > 0:
            self.q.append((end_ns, wait_ns))

    def take(self, since_ns: int, until_ns: int) -> float:
        """Seconds of waiting between ``since_ns`` and ``until_ns`` (epoch ns): what was
        waited before then is dropped, what ends later stays for the next step."""
        total, later = 0, []
        while self.q:
            end, wait = self.q.popleft()
            if end > until_ns:
                later.append((end, wait))
            elif end > since_ns:
                total += min(wait, end - since_ns)
        self.q.extendleft(reversed(later))
        return total / 1e9


WAITS = Waits()
_inside = threading.local()          # a timed call inside another (all_gather_object's all_gather)


def timed(fn: Any, waits: Waits = WAITS) -> Any:
    """``fn`` (a torch.distributed function), its blocking calls timed into ``waits``."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    at = names.index("async_op") if "async_op" in names else None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("async_op") or (at is not None and len(args) > at and args[at]) \
                or getattr(_inside, "on", False):
            return fn(*args, **kwargs)
        _inside.on = True
        t0 = _PERF()
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.on = False
            waits.add(_NS(), _PERF() - t0)
    call.__hpcml_timed__ = True           # type: ignore[attr-defined]
    return call


class Hook:
    """DDP's communication hook, timing each backward's wait (see the module's docstring).
    ``user``: the (hook, state) the script registered, run in place of the default."""

    def __init__(self, process_group: Any, waits: Waits = WAITS) -> None:
        self.process_group, self.waits = process_group, waits
        self.user: tuple[Any, Any] | None = None
        self.lock = threading.Lock()
        self.pending = 0                 # buckets launched whose all-reduce has not completed
        self.ready = 0                   # perf ns: when this backward's last bucket was ready
        self.done = 0                    # perf ns: the latest completion of this backward's buckets

    def __call__(self, state: Any, bucket: Any) -> Any:
        now = _PERF()
        if self.user is not None:
            fut = self.user[0](self.user[1], bucket)
        else:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            fut = allreduce_hook(self.process_group, bucket)
        with self.lock:
            self.pending += 1
            if bucket.is_last():
                self.ready = now
        return fut.then(self._completed)

    def _completed(self, fut: Any) -> Any:
        value = fut.value()              # an all-reduce that failed raises here, as DDP's own would
        now = _PERF()
        with self.lock:
            self.pending -= 1
            self.done = max(self.done, now)
            if self.pending == 0 and self.ready:
                self.waits.add(_NS(), self.done - self.ready)
                self.ready = self.done = 0
        return value


def _ddp(cls: Any, waits: Waits) -> None:
    """Our hook into every DDP built from now on; the script's own hook runs inside it."""
    init, register, builtin = cls.__init__, cls.register_comm_hook, cls._register_builtin_comm_hook

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            hook = Hook(self.process_group, waits)
            # a lambda: DDP checks a hook's annotations, and this module's are strings
            register(self, None, lambda state, bucket: hook(state, bucket))
            self._hpcml_hook = hook
        except Exception:  # noqa: BLE001, S110 - a DDP we cannot hook trains as without us
            pass

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        ours = getattr(self, "_hpcml_hook", None)
        if ours is None or ours.user is not None:
            return register(self, state, hook)               # DDP's own answer (one hook only)
        self._check_comm_hook(hook)
        ours.user = (hook, state)
        return None

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        ours = getattr(self, "_hpcml_hook", None)
        if ours is None or ours.user is not None:
            return builtin(self, comm_hook_type)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hooks = {"ALLREDUCE": default_hooks.allreduce_hook, "FP16_COMPRESS": default_hooks.fp16_compress_hook}
        name = getattr(comm_hook_type, "name", str(comm_hook_type)).rsplit(".", 1)[-1]
        if name not in hooks:
            return builtin(self, comm_hook_type)
        ours.user = (hooks[name], self.process_group)
        return None

    __init__.__hpcml_timed__ = True       # type: ignore[attr-defined]
    cls.__init__, cls.register_comm_hook = __init__, register_comm_hook
    cls._register_builtin_comm_hook = _register_builtin_comm_hook


def install(waits: Waits = WAITS) -> bool:
    """Time the collectives of this process from now on, and give each step its waits
    (``api.waits_from``). False where torch.distributed is not available."""
    import torch.distributed as dist
    if not dist.is_available():
        return False
    for name in BLOCKING:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__hpcml_timed__", False):
            setattr(dist, name, timed(fn, waits))
    from torch.nn.parallel import DistributedDataParallel
    if not getattr(DistributedDataParallel.__init__, "__hpcml_timed__", False):
        _ddp(DistributedDataParallel, waits)
    api.waits_from(waits.take)
    return True
