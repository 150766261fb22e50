"""Synthetic job directories with known ground truth, for the report's tests and benchmark.

The job is synchronous data parallel: every rank computes step ``s`` (the ``step``
section holds the rank's own compute time), then all ranks meet, so step ``s`` ends for
every rank at the same moment ``T[s] = T[s-1] + max over ranks + comm``. Slow ranks,
job-wide stalls, one-off per-rank hiccups, missing and damaged rank files are injected on
request. Rows are built directly as Arrow batches (no Python loop over rows) and written
with the store's own ``RankWriter``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path

import numpy as np

from hpcml.observe.schema import arrow_schema
from hpcml.observe.store import JOB_META, JOB_SCHEMA, RANK_SCHEMA, RankWriter, rank_path

T0_US = 1_767_225_600_000_000          # 2026-01-01T00:00:00Z


def _batch(pa, ts_us, rank, kind, name, value, step=None, gpu=None):
    n = len(ts_us)
    return pa.record_batch([
        pa.array(ts_us, pa.timestamp("us", tz="UTC")),
        pa.array(np.full(n, rank, np.int32)),
        pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [kind]).cast(pa.string()),
        pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [name]).cast(pa.string()),
        pa.array(value, pa.float64()),
        pa.array(step, pa.int64()) if step is not None else pa.nulls(n, pa.int64()),
        pa.array(np.full(n, gpu, np.int16)) if gpu is not None else pa.nulls(n, pa.int16()),
    ], schema=arrow_schema())


def synthetic_uuid(rank: int) -> str:
    """The UUID ``make_job`` gives rank ``rank``'s GPU (NVML's form: GPU-8-4-4-4-12 hex)."""
    return f"GPU-{rank:08x}-0000-4000-8000-00000000a100"


def make_job(path: str | os.PathLike, n_ranks: int = 64, n_steps: int = 500, *,
             ranks_per_node: int = 4, step_s: float = 0.1, comm_s: float = 0.01,
             slow_ranks: dict[int, float] | None = None,
             stalls: list[tuple[int, float]] | None = None,
             hiccups: dict[tuple[int, int], float] | None = None,
             missing: list[int] | tuple = (), truncated: list[int] | tuple = (),
             dataload_share: float | None = 0.1, throughput_metric: str | None = "tokens_per_s",
             tokens_per_step: float = 8192.0, host: bool = True, gpu: bool = True,
             sample_s: float = 1.0, seed: int = 0, job_id: str = "synthetic",
             clock_reasons: dict[int, int] | None = None, power_capped: bool = False,
             dataload_ranks: Collection[int] | None = None) -> Path:
    """Write a job directory and return its path.

    ``slow_ranks``: rank -> factor on its compute time (a chronic straggler);
    ``stalls``: (step, seconds) added to that step on every rank (a job-wide stall);
    ``hiccups``: (rank, step) -> factor on one step of one rank (a one-off stall);
    ``missing``: ranks that leave no file; ``truncated``: ranks whose file is cut mid-batch;
    ``clock_reasons``: rank -> NVML clocks event reasons its GPU reports on every sample;
    ``power_capped``: every GPU reports its power cap (0x4) on every other sample, as busy
    GPUs do (OR'ed with its ``clock_reasons``); ``dataload_ranks``: the ranks that time their
    data loading as a section (default every rank; a script may time it on rank 0 only).
    """
    import pyarrow as pa
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    compute = step_s * rng.lognormal(0.0, 0.03, (n_ranks, n_steps))
    for r, f in (slow_ranks or {}).items():
        compute[r] *= f
    for (r, s), f in (hiccups or {}).items():
        compute[r, s] *= f
    for s, secs in (stalls or []):
        compute[:, s] += secs
    dataload = compute * dataload_share if dataload_share else None
    step_time = compute.max(axis=0) + comm_s + (dataload.max(axis=0) if dataload is not None else 0)
    ends_us = T0_US + np.round(np.cumsum(step_time) * 1e6).astype(np.int64)
    start_us = T0_US - 1_000_000
    steps = np.arange(n_steps, dtype=np.int64)
    n_nodes = -(-n_ranks // ranks_per_node)
    nodes = [f"n{i + 1}" for i in range(n_nodes)]
    samples_us = np.arange(start_us, ends_us[-1] + 1, int(sample_s * 1e6), dtype=np.int64)
    meta_ranks = {}
    for r in range(n_ranks):
        node, local = nodes[r // ranks_per_node], r % ranks_per_node
        meta_ranks[r] = {"schema": RANK_SCHEMA, "rank": r, "local_rank": local, "node": node, "gpus": [str(local)],
                         "start": start_us / 1e6, "end": ends_us[-1] / 1e6 + 1, "exit_code": 0}
        if gpu:                    # as a recorder's sampler names what it sampled: NVML index -> UUID
            meta_ranks[r]["gpu_uuids"] = {str(local): synthetic_uuid(r)}
        if r in missing:
            continue
        (out / f"rank-{r:05d}.json").write_text(json.dumps(meta_ranks[r]))
        jitter = rng.integers(0, 2000, n_steps)                  # ranks leave the barrier apart
        batches = []
        if dataload is not None and (dataload_ranks is None or r in dataload_ranks):
            dl_end = ends_us - np.round((compute[r] + comm_s) * 1e6).astype(np.int64)
            batches.append(_batch(pa, dl_end + jitter, r, "section", "dataload", dataload[r], steps))
        batches.append(_batch(pa, ends_us + jitter, r, "section", "step", compute[r], steps))
        if throughput_metric:
            tput = tokens_per_step / step_time * rng.lognormal(0.0, 0.01, n_steps)
            batches.append(_batch(pa, ends_us + jitter, r, "metric", throughput_metric, tput, steps))
            loss = 3.0 * np.exp(-steps / max(1, n_steps / 3)) + 0.1 * rng.random(n_steps) + 1
            batches.append(_batch(pa, ends_us + jitter, r, "metric", "loss", loss, steps))
        m = len(samples_us)
        busy = 90.0 - 60.0 * np.isin(np.searchsorted(ends_us, samples_us),
                                     [s for s, _ in (stalls or [])])
        if gpu:
            for name, val in (("util_gpu_percent", busy + rng.normal(0, 2, m)),
                              ("power_w", 3 * busy + 100 + rng.normal(0, 5, m)),
                              ("mem_used_bytes", np.full(m, 30e9 + local * 1e9))):
                batches.append(_batch(pa, samples_us, r, "gpu", name, val, gpu=local))
            if clock_reasons is not None or power_capped:
                mask = np.full(m, (clock_reasons or {}).get(r, 0), np.int64) | np.where(
                    power_capped & (np.arange(m) % 2 == 1), 0x4, 0)
                batches.append(_batch(pa, samples_us, r, "gpu", "clocks_event_reasons", mask.astype(np.float64),
                                      gpu=local))
        if host:
            batches.append(_batch(pa, samples_us, r, "host", "proc_rss_bytes",
                                  np.linspace(4e9, 6e9, m)))
            if local == 0:
                batches.append(_batch(pa, samples_us, r, "host", "cpu_percent",
                                      np.clip(40 + rng.normal(0, 5, m), 0, 100)))
                batches.append(_batch(pa, samples_us, r, "host", "mem_used_bytes",
                                      np.linspace(100e9, 120e9, m) + 1e9 * (r // ranks_per_node)))
        p = rank_path(out, r)
        w = RankWriter(p, r)
        for b in batches:
            w.write_batch(b)
        w.close()
        if r in truncated:
            size = p.stat().st_size
            with open(p, "r+b") as fh:                           # cut the last batch in half
                fh.truncate(size - max(64, size // (2 * len(batches))))
    (out / JOB_META).write_text(json.dumps({
        "schema": JOB_SCHEMA, "job_id": job_id, "nodes": nodes, "ntasks": n_ranks, "command": ["python", "train.py"],
        "start": start_us / 1e6, "end": ends_us[-1] / 1e6 + 1, "interval": sample_s}))
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m hpcml.testing.synthetic_job DIR --ranks 1024 --steps 10000``: the benchmark job."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("dir")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--slow", type=int, action="append", default=[], help="a chronic straggler rank (x1.3)")
    ap.add_argument("--stall", type=int, action="append", default=[], help="a step stalled 30 s on every rank")
    a = ap.parse_args(argv)
    make_job(a.dir, a.ranks, a.steps, slow_ranks={r: 1.3 for r in a.slow},
             stalls=[(s, 30.0) for s in a.stall], dataload_share=None, throughput_metric=None)


if __name__ == "__main__":
    main()
