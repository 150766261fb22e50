"""Checkpointing that survives the cluster: async with a bytes/s cap, atomic across ranks,
tiered local -> shared, and aware of Slurm's time limit (``hpcml.ckpt.Checkpointer``).

The names are imported on first use: ``hpcml scan`` reaches ``hpcml.ckpt.scanformat``
through its format registry and must not pay for the checkpointer's imports."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcml.ckpt.checkpointer import Checkpointer
    from hpcml.ckpt.flatten import PerRank
    from hpcml.ckpt.layout import CheckpointError
    from hpcml.ckpt.offline import load
    from hpcml.ckpt.prune import Pruned, prune

_WHERE = {"Checkpointer": "checkpointer", "CheckpointError": "layout", "load": "offline",
          "PerRank": "flatten", "Pruned": "prune", "prune": "prune"}

__all__ = ["CheckpointError", "Checkpointer", "PerRank", "Pruned", "load", "prune"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hpcml.ckpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hpcml.ckpt.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
