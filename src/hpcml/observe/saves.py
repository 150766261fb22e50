"""The script's own checkpoint saves, timed as the ``checkpoint`` section.

``hpcml run``'s sitecustomize calls ``install`` in a rank's main process with the optimizer
step hooks (``hpcml.observe.optimsteps``): ``torch.save`` and, once imported,
``torch.distributed.checkpoint``'s ``save``/``async_save``/``save_state_dict`` are wrapped
so that the seconds each call held the training loop reach the recorder
(``hpcml.observe.api.CHECKPOINT``). The time ledger (``hpcml.run.ledger``) takes them out
of the productive steps: a save is time the allocation did not train. HF Trainer and
Lightning save through ``torch.save``; hpcml's own Checkpointer records its blocking itself.
A save inside another (DCP writing with ``torch.save``) is part of the outer one.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcml.observe import api

_inside = threading.local()
DCP = "torch.distributed.checkpoint"
DCP_SAVES = ("save", "async_save", "save_state_dict")


def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` recording each outermost call's wall time as a checkpoint section."""
    if getattr(fn, "__hpcml_timed__", False):
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "on", False):
            return fn(*args, **kwargs)
        _inside.on = True
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.on = False
            api.blocked(api.CHECKPOINT, time.perf_counter() - t0)

    call.__hpcml_timed__ = True  # type: ignore[attr-defined]
    return call


def install() -> None:
    """Wrap ``torch.save`` now, and DCP's saves if DCP is imported (else ``wrap_dcp`` later)."""
    import torch
    torch.save = timed(torch.save)
    if DCP in sys.modules:
        wrap_dcp()


def wrap_dcp() -> None:
    dcp = sys.modules.get(DCP)
    for name in DCP_SAVES:
        fn = getattr(dcp, name, None)
        if callable(fn):
            setattr(dcp, name, timed(fn))
