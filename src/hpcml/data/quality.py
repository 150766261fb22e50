"""How close an epoch's order is to a uniform global shuffle, measured on the keys it yields.

Three figures, each with the value a uniform random permutation would give beside it:

- ``adjacent_same_shard``: share of consecutive samples from the same shard (uniform:
  about 1/shards; a shard-streaming loader: near 1);
- ``batch_shards``: distinct shards in a batch of ``batch`` samples (uniform: close to
  ``batch`` when there are many shards);
- ``rank_correlation``: Spearman correlation between a sample's place in the packed order
  and in the epoch (uniform: about 0; no shuffle: 1).
"""

from __future__ import annotations

import numpy as np


def measure(packed_index: np.ndarray, shard_of: np.ndarray, batch: int = 64) -> dict:
    """``packed_index[i]``: packed position of the i-th delivered sample; ``shard_of[j]``: shard of packed j."""
    idx = np.asarray(packed_index, dtype=np.int64)
    shards = np.asarray(shard_of)[idx]
    n = len(idx)
    if n < 2:
        return {"samples": n, "adjacent_same_shard": float("nan"), "batch_shards": float("nan"),
                "rank_correlation": float("nan")}
    full = n // batch * batch
    per_batch = [len(np.unique(b)) for b in shards[:full].reshape(-1, batch)] if full else [len(np.unique(shards))]
    ranks = np.empty(n)
    ranks[np.argsort(idx, kind="stable")] = np.arange(n)
    rho = float(np.corrcoef(ranks, np.arange(n))[0, 1])
    return {"samples": n, "adjacent_same_shard": float(np.mean(shards[1:] == shards[:-1])),
            "batch_shards": float(np.mean(per_batch)), "rank_correlation": rho}


def uniform(shard_of: np.ndarray, samples: int, batch: int = 64, seed: int = 0) -> dict:
    """The same figures for a uniform random choice of ``samples`` of the packed samples."""
    perm = np.random.default_rng(seed).permutation(len(shard_of))[:samples]
    return measure(perm, shard_of, batch)
