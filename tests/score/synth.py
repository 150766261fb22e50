"""A small synthetic recording for report and CLI tests: two nodes, compute-bound GPUs,
one lagging GPU, warm-up and tail, and one GPU that drops out half way."""

from __future__ import annotations

import numpy as np

from hpcml.score.model import JobScore, score_columns
from hpcml.score.recording import Recording


def recording(nodes: int = 2, gpus_per_node: int = 4, seconds: int = 120, seed: int = 0) -> Recording:
    rng = np.random.default_rng(seed)
    rec = Recording(source="synthetic")
    t = 1_700_000_000 + np.arange(seconds, dtype=float)
    on = (np.arange(seconds) >= 10) & (np.arange(seconds) < seconds - 5)
    for n in range(nodes):
        for i in range(gpus_per_node):
            slow = (n, i) == (nodes - 1, gpus_per_node - 1)
            level = 0.25 if slow else 0.7
            noise = lambda: rng.normal(0, 0.02, seconds)  # noqa: E731
            cols = {
                "sm_active": np.where(on, 0.92 + noise(), 0.01),
                "sm_occupancy": np.where(on, 0.5 + noise(), 0.0),
                "pipe_tensor_active": np.where(on, level + noise(), 0.0),
                "pipe_fp32_active": np.where(on, 0.1 + noise(), 0.0),
                "pipe_fp16_active": np.where(on, 0.02, 0.0),
                "pipe_fp64_active": np.zeros(seconds),
                "dram_active": np.where(on, 0.3 + noise(), 0.0),
                "pcie_tx_bytes": np.where(on, 2e9, 1e6),
                "pcie_rx_bytes": np.where(on, 3e9, 1e6),
                "nvlink_tx_bytes": np.where(on, 100e9, 0.0),
                "nvlink_rx_bytes": np.where(on, 100e9, 0.0),
                "gpu_util": np.where(on, 100.0, 0.0),
                "power_usage": np.where(on, 600.0, 90.0),
            }
            g = rec.gpu(f"nid{n:05d}", str(i), "NVIDIA H100 80GB HBM3")
            tt = t + rng.uniform(0, 0.05)              # nodes sample at slightly different instants
            if (n, i) == (0, 1):                       # this GPU drops out half way
                keep = np.arange(seconds) < seconds // 2
                tt = tt[keep]
                cols = {k: v[keep] for k, v in cols.items()}
            g.set_columns(tt, cols)
    return rec


def score_job(gpus: dict[tuple[str, str], dict[str, np.ndarray]],
              models: dict[tuple[str, str], str] | None = None) -> JobScore:
    """Score GPUs given as (node, index) -> field -> array on one time axis, through the
    same ``score_columns`` the store and importers use."""
    keys = sorted(gpus)
    n = max((len(v) for k in keys for v in gpus[k].values()), default=0)
    return score_columns(keys, lambda k, names=None: gpus[k], n, models)
