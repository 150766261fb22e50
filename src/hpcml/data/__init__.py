"""Datasets on HPC storage: doctor, pack into shards, read, stage, benchmark.

``ShardDataset`` is the reader; ``hpcml.data.torchloader.ShardLoader`` is its torch
DataLoader (torch is optional and only imported there).
"""

from hpcml.data.reader import CorruptShardError, ResumeStateError, ShardDataset

__all__ = ["ShardDataset", "CorruptShardError", "ResumeStateError"]
