"""The score report: the job's score and its evidence, as one JSON-ready dict.

Time series are reduced while GPUs are scored (``score_columns``'s ``observe`` hook), so
memory stays at one GPU's columns plus (metrics x buckets) accumulators however long the
run: per bucket, each GPU's mean, then the mean, min and max of those across GPUs (the
band). The heatmap holds each GPU's bucket means of the score; above ``max_rows`` GPUs,
consecutive GPUs are grouped and the group's *lowest* value is shown, so a lagging GPU
stays visible.

MIG instances are scored apart: a parent GPU's fields already hold its instances' work,
so the job's figures are the whole GPUs' (the instances' when only they were recorded),
and ``instances`` holds the instances' own score, parts and per-instance rows. Temporal
recordings (NVML, nvidia-smi dmon) get ``utilisation``: the median share of time a kernel
ran and the memory controller was busy, the only figures they allow. Compute from only some
of the four pipes is a lower bound, and a note names the pipes that were not recorded.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import numpy as np

from hpcml.observe.report import group_rows
from hpcml.schemas import tag
from hpcml.score.model import PIPES, JobScore, score_columns
from hpcml.score.recording import Recording
from hpcml.words import natural_key

MAX_BUCKETS = 600
MAX_HEATMAP_ROWS = 256
PARTS = ("score", "compute", "memory", "interconnect")
PLOTTED_FIELDS = ("sm_active", "sm_occupancy") + PIPES + (
    "dram_active", "pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes",
    "gpu_util", "mem_util", "power_usage", "sm_clock", "fb_used")
SCHEMA = tag("score.report", 1)   # was the integer "version": 1 before tags


class _Series:
    """Across-GPU mean/min/max of per-GPU bucket means, built one GPU at a time."""

    def __init__(self, n: int, buckets: int) -> None:
        self.nb = max(1, min(buckets, n)) if n else 0
        self.starts = (np.arange(self.nb) * n) // self.nb if n else np.array([], int)
        self.acc: dict[str, list[np.ndarray]] = {}
        self.rows: list[np.ndarray] = []

    def bucket_means(self, v: np.ndarray) -> np.ndarray:
        ok = np.isfinite(v)
        s = np.add.reduceat(np.where(ok, v, 0.0), self.starts)
        c = np.add.reduceat(ok.astype(np.int32), self.starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(c > 0, s / np.maximum(c, 1), np.nan)

    def add(self, name: str, v: np.ndarray) -> np.ndarray:
        b = self.bucket_means(v)
        ok = np.isfinite(b)
        if name not in self.acc:
            self.acc[name] = [np.zeros(self.nb), np.zeros(self.nb), np.full(self.nb, np.nan),
                              np.full(self.nb, np.nan)]
        total, count, lo, hi = self.acc[name]
        total[ok] += b[ok]
        count += ok
        self.acc[name][2] = np.fmin(lo, b)
        self.acc[name][3] = np.fmax(hi, b)
        return b

    def result(self) -> dict[str, dict[str, list]]:
        out = {}
        for name, (total, count, lo, hi) in self.acc.items():
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
            out[name] = {"mean": _list(mean), "min": _list(lo), "max": _list(hi)}
        return out


def _list(a: np.ndarray, nd: int = 4) -> list:
    return [None if not math.isfinite(x) else round(float(x), nd) for x in a]


def _r(x: float | None, nd: int = 4):
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def _heatmap(rows: list[np.ndarray], labels: list[str], max_rows: int) -> dict[str, Any]:
    if not rows:
        return {"values": [], "labels": [], "group": 1}
    hm = group_rows(np.vstack(rows), labels, max_rows, np.nanmin, " … ")
    return {**hm, "values": [_list(r, 3) for r in hm["values"]]}


def _split(rec: Recording) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(what the job's figures are over, the MIG instances scored apart from it)."""
    keys = sorted(rec.gpus, key=lambda k: (natural_key(k[0]), natural_key(k[1])))
    whole = [k for k in keys if not rec.gpus[k].mig]
    inst = [k for k in keys if rec.gpus[k].mig]
    return (whole, inst) if whole else (inst, [])


def _instances(rec: Recording, keys: list[tuple[str, str]], grid) -> dict[str, Any] | None:
    if not keys:
        return None
    job = score_columns(keys, lambda k, names=None: rec.on_grid(rec.gpus[k], grid, names), grid.n,
                        {k: g.model for k, g in rec.gpus.items() if g.model})
    rows = [dict(_gpu_dict(g), mig=rec.gpus[k].mig) for k, g in zip(keys, job.gpus)]
    return {"count": len(keys), "score": _r(job.score), "bound": job.bound,
            "breakdown": {k: _r(v) for k, v in job.breakdown.items()}, "per_instance": rows}


def _utilisation(per_gpu: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over GPUs of NVML's temporal figures, as shares 0-1 (None: not recorded)."""
    out: dict[str, Any] = {}
    for key, name in (("gpu", "gpu_util"), ("memory", "mem_util")):
        v = np.array([g["medians"].get(name) for g in per_gpu if g["medians"].get(name) is not None], float)
        out[key] = _r(float(np.median(v)) / 100.0) if len(v) else None
    return out


def build(rec: Recording, *, buckets: int = MAX_BUCKETS, max_rows: int = MAX_HEATMAP_ROWS) -> dict[str, Any]:
    """Score ``rec`` and gather the evidence the terminal, JSON and HTML reports show."""
    grid = rec.grid()
    keys, apart = _split(rec)
    series = _Series(grid.n, buckets)
    present = _Series(grid.n, buckets)          # 1 where a GPU has any value: the gaps
    heat: list[np.ndarray] = []

    energy_mj = [0.0, 0]                          # total, GPUs that report it
    pipes = dict.fromkeys(PIPES, 0)               # GPUs with any value of each pipe

    def observe(key, cols, parts) -> None:
        for pipe in PIPES:
            if pipe in cols and np.isfinite(cols[pipe]).any():
                pipes[pipe] += 1
        used = energy_used_mj(cols)
        if used is not None:
            energy_mj[0] += used
            energy_mj[1] += 1
        have = np.zeros(grid.n, bool)
        for v in cols.values():
            have |= np.isfinite(v)
        present.add("present", np.where(have, 1.0, np.nan))
        for name in PARTS:
            b = series.add(name, parts[name])
            if name == "score":
                heat.append(b)
        for name in PLOTTED_FIELDS:
            if name in cols:
                series.add(name, cols[name])

    job = score_columns(keys, lambda k, names=None: rec.on_grid(rec.gpus[k], grid, names), grid.n,
                        {k: g.model for k, g in rec.gpus.items() if g.model}, observe)
    dt = grid.dt
    span_s = [job.span[0] * dt, max(job.span[1] - 1, job.span[0]) * dt] if job.span[1] > job.span[0] else None
    notes = list(rec.notes)
    if keys and rec.gpus[keys[0]].mig:
        notes.append("only MIG instances were recorded: the figures are the instances', not whole GPUs'")
    missing = _gaps(present, span=job.span, n=grid.n)
    if missing:
        notes.append(missing)
    unpiped = _unrecorded_pipes(pipes, len(keys))
    if unpiped and not rec.temporal_only:
        notes.append(unpiped)
    findings = list(job.findings)
    if rec.temporal_only:
        findings.insert(0, "temporal utilisation only, no saturation: NVML says when a kernel ran, not how much "
                           "of the GPU it used; record with DCGM (a host engine on the node) or, on Hopper and "
                           "newer GPUs, NVML GPM (--gpu-metrics auto) for a score.")
    nodes = sorted({k[0] for k in keys}, key=natural_key)
    per_gpu = [dict(_gpu_dict(g), mig=rec.gpus[k].mig) for k, g in zip(keys, job.gpus)]
    return {
        "schema": SCHEMA,
        "source": rec.source,
        "temporal_only": rec.temporal_only,
        "notes": notes,
        "gpus": len(keys),
        "nodes": len(nodes),
        "interval_s": _r(dt),
        "duration_s": _r((grid.n - 1) * dt) if grid.n else 0.0,
        "start": _r(grid.t0, 3),
        "span_s": span_s,
        "score": _r(job.score),
        "bound": job.bound,
        "breakdown": {k: _r(v) for k, v in job.breakdown.items()},
        "gssr": _r(job.gssr),
        "energy_wh": _r(energy_mj[0] / 3.6e6, 2) if energy_mj[1] else None,
        "energy_gpus": energy_mj[1],
        "imbalance": {"gpus": _r(job.imbalance_gpus), "nodes": _r(job.imbalance_nodes)},
        "findings": findings,
        "per_gpu": per_gpu,
        "instances": _instances(rec, apart, grid),
        "utilisation": _utilisation(per_gpu),
        "per_node": _per_node(job),
        "series": {"t": _list(series.starts * dt, 3), "metrics": series.result()},
        "heatmap": _heatmap(heat, [g.gpu for g in job.gpus], max_rows),
        "meta": rec.meta,
    }


def energy_used_mj(cols: dict[str, np.ndarray]) -> float | None:
    """Energy one GPU used over the recording: the sum of the counter's increments (a reset
    or a gap adds nothing, never a negative), or of per-window amounts (gssr-record)."""
    if "total_energy_consumption" in cols:
        v = np.asarray(cols["total_energy_consumption"], float)
        v = v[np.isfinite(v)]
        if len(v) > 1:
            d = np.diff(v)
            return float(d[d > 0].sum())
    if "energy_window_mj" in cols:
        v = np.asarray(cols["energy_window_mj"], float)
        if np.isfinite(v).any():
            return float(np.nansum(v[v > 0]))
    return None


def _gpu_dict(g) -> dict[str, Any]:
    d = asdict(g)
    for k, v in list(d.items()):
        if isinstance(v, float):
            d[k] = _r(v)
    d["medians"] = {k: _r(v) for k, v in g.medians.items()}
    return d


def _per_node(job: JobScore) -> list[dict[str, Any]]:
    by: dict[str, list[float]] = {}
    for g in job.gpus:
        by.setdefault(g.node, []).append(g.score)
    out = []
    for node in sorted(by, key=natural_key):
        v = np.array(by[node], float)
        v = v[np.isfinite(v)]
        out.append({"node": node, "gpus": len(by[node]), "score": _r(float(v.mean())) if len(v) else None,
                    "min": _r(float(v.min())) if len(v) else None})
    return out


def _unrecorded_pipes(pipes: dict[str, int], gpus: int) -> str | None:
    """A note when compute is the largest of only some pipes: the missing ones may be higher,
    so compute (and the score) is a lower bound, not the value of all four."""
    if not gpus or not any(pipes.values()):
        return None                   # no pipe at all: compute is "no data" already
    lacking = [f"{p.removeprefix('pipe_').removesuffix('_active')}"
               + ("" if n == 0 else f" (on {gpus - n} of {gpus} GPUs)") for p, n in pipes.items() if n < gpus]
    if not lacking:
        return None
    return (f"pipe activity not recorded: {', '.join(lacking)}; compute is the largest of the pipes that were, "
            "so compute and the score are at least the values shown")


def _gaps(series: _Series, *, span: tuple[int, int], n: int) -> str | None:
    """A note when, inside the active span, some stretch has no GPU reporting any value."""
    acc = series.acc.get("present")
    if acc is None or not series.nb or span[1] <= span[0]:
        return None
    count = acc[1]
    b0 = int(np.searchsorted(series.starts, span[0], side="right")) - 1
    b1 = int(np.searchsorted(series.starts, span[1] - 1, side="right"))
    empty = int((count[max(b0, 0):b1] == 0).sum())
    if empty:
        return f"the recording has gaps: {empty} of {b1 - max(b0, 0)} time buckets in the active span have no sample"
    return None
