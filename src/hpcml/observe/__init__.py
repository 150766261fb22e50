"""Job observability: per-rank telemetry into an append-only columnar store.

In a training script::

    from hpcml import observe
    for step, batch in enumerate(loader):
        with observe.section("step"):
            loss = train_step(batch)
        observe.log(step=step, loss=loss, tokens_per_s=tps)

``log`` and ``section`` cost a few microseconds, never block on I/O (a background thread
writes) and never raise into the training loop (problems are counted and written as
``problems`` rows). They work with or without ``hpcml observe record`` around the process.
"""

from __future__ import annotations

from hpcml.observe.api import flush, log, problems, section

__all__ = ["log", "section", "flush", "problems"]
