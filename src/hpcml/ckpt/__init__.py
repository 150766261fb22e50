"""Checkpointing that survives the cluster: async with a bytes/s cap, atomic across ranks,
tiered local -> shared, and aware of Slurm's time limit (``hpcml.ckpt.Checkpointer``)."""

from hpcml.ckpt.checkpointer import Checkpointer
from hpcml.ckpt.layout import CheckpointError
from hpcml.ckpt.offline import load
from hpcml.ckpt.prune import Pruned, prune

__all__ = ["CheckpointError", "Checkpointer", "Pruned", "load", "prune"]
