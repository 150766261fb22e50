"""A gssr 0.4.0 profile directory as ``gssr profile`` writes it, for benchmarks and tests.

    python benchmarks/gssr_fixture.py OUT_DIR [--gpus 1024] [--seconds 3600]
                                              [--interval-ms 1000] [--seed 0]

``OUT_DIR`` plays the part of ``profile_out_JobID_<id>``: it gets one step directory
``<label>/`` (label ``unlabeled_job_<id>_step_0``, gssr's default) holding one
``<label>_proc_<rank>.json`` per task. One GPU per task, four tasks per node, nodes
``nid00000``, ``nid00001``, ... (``gssr analyze -i OUT_DIR`` reads it).

Each file is byte for byte what gssr's ``JSONDataIO.dump`` writes: ``json.dump`` of
``{"metadata": ..., "data": {gpu_id: {tag: [values]}}}`` with Python's default separators
(", " and ": "), no trailing newline. The metric tags and their order are those of gssr's
``metric_ids`` as DcgmReader names them (DCGM field tags); integer fields (GPU utilisation
in %, framebuffer in MiB, PCIe/NVLink bytes per second) are ints, profiling ratios are
full-precision floats. gssr never stores N/A: DcgmReader skips blank values and gssr
truncates every series to the shortest, so every list has ``n_samples`` numbers.

The workload looks like data-parallel training: a data-loading warm-up with PCIe traffic,
then steps that alternate a compute-bound phase (tensor pipes busy) and a memory-bound
phase (DRAM busy) with an NVLink all-reduce between them, a checkpoint pause in the
middle and an idle tail; a few GPUs are slow (lower activity all run long). Generation
is vectorised per GPU and serialised with orjson: 1,024 GPUs x 3,600 s take ~5 s and
~0.73 GB on disk (idle pipes are a short 0.0, as DCGM reports them).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import orjson

JOB_ID = 4242
STEP_ID = 0
GPUS_PER_NODE = 4
FB_TOTAL = 81559            # MiB, H100 80GB HBM3
FB_RESERVED = 587
# gssr's metric_ids order, as DCGM field tags (what GetLatestGpuValuesAsFieldNameDict returns)
TAGS = ("gpu_utilization", "fb_total", "fb_free", "fb_used", "fb_resv", "sm_active", "sm_occupancy",
        "tensor_active", "fp64_active", "fp32_active", "fp16_active", "dram_active",
        "pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes")
INT_TAGS = {"gpu_utilization", "fb_total", "fb_free", "fb_used", "fb_resv",
            "pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes"}


def label(job_id: int = JOB_ID, step_id: int = STEP_ID) -> str:
    return f"unlabeled_job_{job_id}_step_{step_id}"


def _job_shape(n: int, dt: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per-sample shares common to all GPUs (synchronous training): 0-1 envelopes."""
    t = np.arange(n) * dt
    warm = min(120.0, 0.05 * n * dt)               # data loading, compilation
    tail = min(60.0, 0.03 * n * dt)                # final checkpoint, teardown
    busy = (t >= warm) & (t < n * dt - tail)
    ckpt = busy & (np.abs(t - 0.5 * n * dt) < min(30.0, 0.02 * n * dt))
    busy &= ~ckpt
    step = 6.0 + rng.random()                      # seconds per training step
    phase = (t % step) / step
    compute = busy & (phase < 0.55)
    memory = busy & (phase >= 0.55) & (phase < 0.85)
    allreduce = busy & (phase >= 0.85)
    ramp = np.clip((t - warm) / 60.0, 0.0, 1.0)    # memory fills during the first minute
    return {"busy": busy, "compute": compute, "memory": memory, "allreduce": allreduce,
            "warm": t < warm, "ckpt": ckpt, "ramp": ramp}


def _gpu_values(shape: dict[str, np.ndarray], speed: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = len(shape["busy"])

    def noisy(level: np.ndarray, sd: float) -> np.ndarray:
        v = np.clip(level + rng.normal(0.0, sd, n), 0.0, 1.0)
        v[v < 1e-4] = 0.0                          # DCGM reports idle pipes as 0.0
        return v

    c, m, a, w, k = (shape[x].astype(float) for x in ("compute", "memory", "allreduce", "warm", "ckpt"))
    sm = noisy(speed * (0.93 * c + 0.80 * m + 0.35 * a) + 0.06 * w + 0.02 * k, 0.015)
    tensor = noisy(speed * (0.62 * c + 0.08 * m), 0.02) * (sm > 0.05)
    dram = noisy(speed * (0.28 * c + 0.78 * m + 0.22 * a) + 0.03 * w, 0.02)
    fp32 = noisy(speed * (0.06 * c + 0.11 * m) + 0.01 * w, 0.005)
    fp16 = noisy(speed * (0.015 * c + 0.02 * m), 0.003)
    fp64 = np.zeros(n)
    occ = noisy(0.42 * sm + 0.03, 0.01)
    util = np.rint(np.clip(100.0 * (sm > 0.04) * (0.97 + 0.02 * rng.random(n)) * (1.0 - 0.7 * w), 0, 100))
    used = np.rint(800 + shape["ramp"] * 61000 + rng.normal(0, 40, n) * (shape["ramp"] > 0))
    pcie_rx = np.rint(np.abs(rng.normal(6.0e9 * w + 2.5e8 * shape["busy"] + 1.2e10 * k, 5e7)))
    pcie_tx = np.rint(np.abs(rng.normal(4.0e8 * w + 6.0e7 * shape["busy"] + 3.0e8 * k, 1e7)))
    nvl = np.rint(np.abs(rng.normal(speed * (1.9e11 * a + 4.0e9 * c), 2e9)))
    return {
        "gpu_utilization": util, "fb_total": np.full(n, FB_TOTAL), "fb_free": FB_TOTAL - FB_RESERVED - used,
        "fb_used": used, "fb_resv": np.full(n, FB_RESERVED), "sm_active": sm, "sm_occupancy": occ,
        "tensor_active": tensor, "fp64_active": fp64, "fp32_active": fp32, "fp16_active": fp16,
        "dram_active": dram, "pcie_tx_bytes": pcie_tx, "pcie_rx_bytes": pcie_rx,
        "nvlink_tx_bytes": nvl, "nvlink_rx_bytes": np.rint(nvl * 0.98),
    }


def _dump(metadata: dict, gpu_id: int, values: dict[str, np.ndarray]) -> bytes:
    """Exactly ``json.dump({'metadata': metadata, 'data': {gpu_id: values}}, f)``."""
    data = {str(gpu_id): {tag: (values[tag].astype(np.int64) if tag in INT_TAGS else values[tag])
                          for tag in TAGS}}
    body = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
    # json.dump's default separators; the data holds only numbers and plain tags, and the
    # values avoid orjson's short exponent forms (ratios < 1e-4 are 0, bytes stay < 1e16).
    body = body.replace(b",", b", ").replace(b":", b": ")
    return b'{"metadata": ' + json.dumps(metadata).encode() + b', "data": ' + body + b"}"


def write_gssr_json(out_dir: str | Path, gpus: int = 1024, seconds: int = 3600, interval_ms: int = 1000,
                    seed: int = 0, *, job_id: int = JOB_ID, return_values: bool = False):
    """Write the profile directory; return its path (and, with ``return_values``, a dict
    (hostname, gpu_id) -> {tag: float64 array} of what was written)."""
    out = Path(out_dir)
    step_dir = out / label(job_id)
    step_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    dt = interval_ms / 1000.0
    n = max(1, int(round(seconds / dt)))
    shape = _job_shape(n, dt, rng)
    n_slow = max(1, gpus // 128) if gpus >= 8 else 0
    slow = set(rng.choice(gpus, size=n_slow, replace=False).tolist()) if n_slow else set()
    t0 = 1_760_000_000.0 + rng.random()
    written = {}
    cmd = f"python train.py --config configs/llm_7b.yaml --nodes {max(1, gpus // GPUS_PER_NODE)}"
    for rank in range(gpus):
        node, gpu_id = rank // GPUS_PER_NODE, rank % GPUS_PER_NODE
        hostname = f"nid{node:05d}"
        speed = 0.62 if rank in slow else 1.0 - 0.03 * rng.random()
        values = _gpu_values(shape, speed, np.random.default_rng([seed, rank]))
        start = t0 + 0.05 * node + 0.002 * gpu_id          # srun starts tasks a little apart
        # each loop turn sleeps interval_ms plus the DCGM query; one discarded first sample
        elapsed = n * (dt + 0.004) + dt + 0.3 * rng.random()
        metadata = {
            "job_id": job_id, "step_id": STEP_ID, "label": label(job_id), "hostname": hostname,
            "proc_id": rank, "n_gpus": 1, "gpu_ids": [gpu_id], "start_time": start,
            "end_time": start + elapsed, "elapsed": elapsed, "sampling_time": int(interval_ms),
            "n_samples": n, "cmd": cmd,
        }
        (step_dir / f"{label(job_id)}_proc_{rank}.json").write_bytes(_dump(metadata, gpu_id, values))
        if return_values:
            written[(hostname, str(gpu_id))] = {tag: values[tag].astype(float) for tag in TAGS}
    return (out, written) if return_values else out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t = time.perf_counter()
    out = write_gssr_json(args.out_dir, args.gpus, args.seconds, args.interval_ms, args.seed)
    size = sum(f.stat().st_size for f in out.rglob("*.json"))
    print(f"{out}: {args.gpus} GPUs x {args.seconds} s, {size / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
