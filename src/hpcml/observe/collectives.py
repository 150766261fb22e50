"""Time a rank waits in collectives, for an unchanged script: what finds the straggler of a
synchronous job.

In data-parallel training every rank waits for the slowest inside the gradient all-reduce,
so every rank's step takes as long as the slowest's and step times name no one. What
differs is where the time goes: the slow rank computes longer and waits least; the others
wait for it. So each rank's step is split into time waiting in collectives and time
outside them ("compute": forward, backward, data, the optimizer), and the straggler model
(``hpcml.observe.stragglers``) scores the compute. Every time is a duration on the rank's
own clock (``perf_counter``): no clock is compared across nodes.

What is timed (``install``, from ``hpcml run``'s sitecustomize in the rank's main process),
always in the main thread (a background thread's receive is not the step's wait), and
never changing what DDP computes (no communication hook: DDP's own all-reduce, its
division, Join, its pickling and ``torch.compile`` stay as they are):

* DDP's bucketed all-reduce: DDP launches each bucket's all-reduce as its gradients are
  accumulated and, at the end of ``backward()``, waits for them all. So for a backward of
  a DDP model's parameters (each gets a post-accumulate-grad hook, torch's public API, that
  notes the time), the wait runs from the last gradient accumulated to ``backward()``'s
  return: the time the rank waited for the others (plus the last buckets' transfer).
* A blocking call of a ``torch.distributed`` collective or point-to-point receive made
  through the ``torch.distributed`` namespace (``dist.all_reduce(t)``, ``dist.barrier()``,
  ``dist.recv``...): its duration. One launched with ``async_op=True`` is not timed (its
  wait is wherever the script waits on the work), nor one inside ``torch.compile``'s trace.

Waits are kept as intervals, so one inside another (a blocking call in a script's own
communication hook, inside backward's wait) counts once.

Not measured, so the step time is scored as it was: collectives on a GPU (NCCL's work is
queued on a stream; the CPU does not wait inside the call, and what a timer would read there
is the launch, a fraction of a millisecond, which would stop the watch from asking the Flight
Recorder's kernel times who arrived last): a call on GPU tensors, and a DDP of a model on a
GPU, are not timed. Calls whose CPU does wait are timed on any backend: ``barrier`` (it
synchronises the stream), the ``*_object`` calls (they copy to the host), and CPU tensors on a
group of several backends (``cpu:gloo,cuda:nccl`` runs them on gloo). Nor are DDP's own collectives
outside backward (the bucket rebuild's broadcast in the second iteration's forward, the
buffers' broadcast with ``broadcast_buffers``). Each wait is kept as epoch times, so a step
takes only the part of a wait that falls inside it (a barrier at start-up is no step's).
``HPCML_RUN_COLLECTIVE_WAIT=0`` turns it off.
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
    """The waits not yet taken by a step: (start, end) epoch ns."""

    def __init__(self) -> None:
        self.q: deque[tuple[int, int]] = deque(maxlen=KEPT)

    def add(self, end_ns: int, wait_ns: int) -> None:
        if wait_ns > 0:
            self.q.append((end_ns - wait_ns, end_ns))

    def take(self, since_ns: int, until_ns: int) -> float:
        """Seconds of waiting between ``since_ns`` and ``until_ns`` (epoch ns), overlaps
        counted once: what was waited before then is dropped, what ends later stays for the
        next step."""
        spans, later = [], []
        while self.q:
            start, end = self.q.popleft()
            if end > until_ns:
                later.append((start, end))
            elif end > since_ns:
                spans.append((max(start, since_ns), end))
        self.q.extendleft(reversed(later))
        total, reach = 0, since_ns
        for start, end in sorted(spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total / 1e9


WAITS = Waits()
_inside = threading.local()          # a timed call inside another (all_gather_object's all_gather)
_MAIN = threading.main_thread().ident    # the thread whose waits are the steps'
_is_compiling: Any = None                # torch.compiler.is_compiling, from the first timed call on


#: the keywords under which a torch.distributed call takes the tensors it moves
TENSOR_KEYS = ("tensor", "tensor_list", "output", "output_tensor", "output_tensor_list", "input_tensor")


def on_gpu(args: tuple, kwargs: dict) -> bool:
    """Whether a call moves GPU tensors: its first argument (or the first of its list), where
    NCCL queues the work on a stream and the CPU waits in none of it. The backend's name does
    not tell (``init_process_group()`` with none given is "undefined", and a group of several
    backends runs CPU tensors on gloo); a call that moves no tensor (``barrier``, the
    ``*_object`` calls) blocks the CPU on any backend."""
    first = args[0] if args else next((kwargs[k] for k in TENSOR_KEYS if k in kwargs), None)
    if isinstance(first, (list, tuple)):
        first = first[0] if first else None
    return getattr(first, "is_cuda", False) is True


def timed(fn: Any, waits: Waits = WAITS) -> Any:
    """``fn`` (a torch.distributed function), its blocking calls timed into ``waits``."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    at = names.index("async_op") if "async_op" in names else None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _compiling():                 # first: torch.compile traces nothing else of ours
            return fn(*args, **kwargs)
        if kwargs.get("async_op") or (at is not None and len(args) > at and args[at]) \
                or getattr(_inside, "on", False) or threading.get_ident() != _MAIN or on_gpu(args, kwargs):
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


def _compiling() -> bool:
    """Inside torch.compile's trace: the call is traced as it is, untimed. torch.compiler is
    looked up at the first call: ``install`` runs while torch is still being imported."""
    global _is_compiling
    if _is_compiling is None:
        import torch.compiler
        _is_compiling = torch.compiler.is_compiling
    return bool(_is_compiling())


class Backward:
    """DDP's wait at the end of backward (see the module's docstring): ``ready`` is each DDP
    parameter's post-accumulate-grad hook, ``timed`` wraps ``torch.autograd.backward``."""

    def __init__(self, waits: Waits = WAITS) -> None:
        self.waits = waits
        self.last = 0                        # perf ns: the last DDP gradient accumulated

    def ready(self, param: Any) -> None:
        self.last = _PERF()

    def timed(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != _MAIN:
                return fn(*args, **kwargs)
            t0 = _PERF()
            self.last = 0
            try:
                return fn(*args, **kwargs)
            finally:
                if self.last >= t0:          # a DDP model's gradients came in this backward
                    self.waits.add(_NS(), _PERF() - self.last)
        backward.__hpcml_timed__ = True      # type: ignore[attr-defined]
        return backward


def _ddp(cls: Any, clock: Backward) -> None:
    """Every DDP built from now on notes when each of its gradients is accumulated."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            if on_gpu((next(iter(self.module.parameters()), None),), {}):
                return                       # on a GPU: backward's end waits for no all-reduce on the CPU
            for param in self.module.parameters():
                if param.requires_grad:
                    param.register_post_accumulate_grad_hook(clock.ready)
        except Exception:  # noqa: BLE001, S110 - a DDP we cannot time trains as without us
            pass

    __init__.__hpcml_timed__ = True       # type: ignore[attr-defined]
    cls.__init__ = __init__


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
    import torch.autograd
    from torch.nn.parallel import DistributedDataParallel
    if not getattr(DistributedDataParallel.__init__, "__hpcml_timed__", False):
        clock = Backward(waits)
        torch.autograd.backward = clock.timed(torch.autograd.backward)
        _ddp(DistributedDataParallel, clock)
    api.waits_from(waits.take)
    return True
