"""The job report: what a job did, where it was slow and what to do about it.

``build(job)`` turns a job store (``read_job``) into a ``Report``: plain data, no printing.
``Report.to_dict()`` is the stable JSON form; ``Report.plots`` holds the downsampled
arrays the HTML renderer draws (not part of the JSON).

Everything is vectorised over the store's long table: rows are put into (rank, time
bucket) cells with ``np.bincount`` and reduced across ranks per bucket, so a job of
1,024 ranks x 10,000 steps (10M rows) reports in a few seconds. Time is cut into at
most ``MAX_BUCKETS`` equal buckets over the job's span.

- Throughput: a user metric (``tokens_per_s``, ``samples_per_s``, ... or any metric
  named ``*_per_s``) as the per-bucket median across ranks of each rank's mean; without
  one, steps/s from the ``step`` section.
- Stalls: runs of buckets where the job-wide step rate (completed steps / active
  rank-seconds) falls below ``STALL_FRACTION`` of its median over the job, lasting at least
  ``Limits.min_stall_steps`` median step times and ``Limits.min_stall_s`` seconds (a short
  bucket of a fast job is noise, not a stall). A requeued job that recorded into the same
  store again was not running between its runs: from the last row before the ranks'
  recorders started again (``rank-NNNNN.json``'s ``start`` and ``earlier``) to that start,
  reported as ``restarts``, never as a stall.
- Stragglers: ``hpcml.observe.stragglers.score_groups`` on each step's compute (the ``step``
  section less the ``collective_wait`` section of the same rank and step, where the rank's
  waits in collectives were measured: ``straggler_check.measure``), with the thresholds of
  ``Limits``; a job of two speed groups is reported as bimodal and each group is scored on
  its own. Below ``Limits.min_straggler_steps`` steps or
  ``min_straggler_s`` seconds of steps there is no straggler verdict (``straggler_check``).
"""

from __future__ import annotations

import itertools
import logging
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcml.observe import iobursts
from hpcml.observe.api import WAIT
from hpcml.observe.loadercores import Short
from hpcml.observe.loadercores import short as is_short
from hpcml.observe.progress import summarise
from hpcml.observe.stragglers import CONTENDED, MIN_SECONDS, MIN_STEPS, compute_times, score_groups
from hpcml.samplers.nvml import LOST
from hpcml.schemas import tag
from hpcml.words import natural_key, node_name

log = logging.getLogger(__name__)
MAX_FR_DUMPS = 4096                  # ranks' dumps read for the arrivals, at most

MAX_BUCKETS = 1000
MAX_HEATMAP_ROWS = 256
STALL_FRACTION = 0.5
DATALOAD_SHARE = 0.30
MAX_FINDINGS = 5
THROUGHPUT_METRICS = ("tokens_per_s", "samples_per_s", "sequences_per_s", "images_per_s",
                      "throughput")
DATA_SECTIONS = ("dataload", "data", "dataloader", "data_load", "input")
READ_TOTALS = ("proc_read_bytes", "proc_read_chars")
#: host rows read per rank, not charted: running totals and the loader's counts
NOT_CHARTED = (*READ_TOTALS, "proc_workers", "proc_cores", *iobursts.RANK_ROWS.values(), *iobursts.FS_ROWS)
COLD_SHARE = 0.3              # of a job's bytes read, from the disk: the reads were cold (imports read warm)
SCHEMA = tag("observe.report", 1)


@dataclass(frozen=True)
class Limits:
    """The report's thresholds (``hpcml observe report`` options)."""

    chronic: float = 0.10          # a rank this much slower than the step median, most steps
    stall_ratio: float = 3.0       # a single step this many times the step median: a one-off stall
    window: int = 10               # steps of a transient-straggler episode window
    min_stall_s: float = 2.0       # a job-wide stall lasts at least this long ...
    min_stall_steps: float = 5.0   # ... and this many median step times
    min_straggler_steps: int = MIN_STEPS       # no straggler verdict from fewer steps ...
    min_straggler_s: float = MIN_SECONDS       # ... or fewer seconds of them (hpcml.observe.stragglers)


@dataclass
class Finding:
    kind: str
    message: str
    advice: str


@dataclass
class Report:
    job_id: str
    path: str
    ranks_expected: int
    ranks_with_data: int
    nodes: list[str]
    start: float | None            # unix seconds
    end: float | None
    duration_s: float | None
    rows: int
    throughput: dict[str, Any] | None
    stalls: list[dict[str, Any]]
    stragglers: list[dict[str, Any]]
    bimodal: dict[str, Any] | None
    one_off_stalls: list[dict[str, Any]]
    transient_stragglers: list[dict[str, Any]]
    sections: dict[str, dict[str, float | int | None]]
    missing_ranks: list[int]
    damaged_ranks: dict[int, str]
    failed_ranks: dict[int, int]
    recorder_problems: dict[str, float]
    findings: list[Finding]
    plots: dict[str, Any] = field(default_factory=dict, repr=False)
    restarts: list[dict[str, Any]] = field(default_factory=list)   # spans between two runs (requeued)
    straggler_check: dict[str, Any] | None = None    # judged, steps, seconds and the minimums
    arrivals: dict[str, Any] | None = None   # who arrived last at each collective (hpcml.observe.arrivals)
    progress: dict[str, Any] | None = None           # what the job did: steps, samples, last metrics (observe.progress)
    loader: list[dict[str, Any]] | None = None       # per rank: worker processes, cores, their CPU use (samplers.host)
    io: dict[str, Any] | None = None                  # per rank reads and writes; the I/O in each stall (observe.iobursts)
    #: what the report could not judge, and why: no finding of these is not their absence
    unjudged: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("plots")
        d["damaged_ranks"] = {str(k): v for k, v in self.damaged_ranks.items()}
        d["failed_ranks"] = {str(k): v for k, v in self.failed_ranks.items()}
        return {"schema": SCHEMA, **d}


# ---------------------------------------------------------------------------- helpers

class _Rows:
    """One (kind, name)'s rows: rank, rank index, seconds since the job's first row, value
    (and the step of sections, the GPU's NVML index of GPU rows)."""

    def __init__(self, rank, ridx, x, value, step=None, bucket=None, gpu=None, ts=None):
        self.rank, self.ridx, self.x, self.value, self.step, self.bucket = rank, ridx, x, value, step, bucket
        self.gpu, self.ts = gpu, ts                    # ts: the rows' own µs, kept where rows are matched by time

    def take(self, sel) -> _Rows:
        return _Rows(*(None if a is None else a[sel]
                       for a in (self.rank, self.ridx, self.x, self.value, self.step, self.bucket, self.gpu, self.ts)))


def _rank_extent(ridx: np.ndarray, start: np.ndarray, end: np.ndarray, nr: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the earliest ``start`` and the latest ``end`` (inf / -inf without rows).
    Arrow's hash aggregation, multi-threaded: ``np.minimum.at`` took a second on 10M rows."""
    import pyarrow as pa
    first = np.full(nr, np.inf)
    last = np.full(nr, -np.inf)
    if len(ridx):
        g = pa.table({"r": ridx, "a": start, "b": end}).group_by("r").aggregate([("a", "min"), ("b", "max")])
        r = g["r"].to_numpy()
        first[r] = g["a_min"].to_numpy()
        last[r] = g["b_max"].to_numpy()
    return first, last


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore", RuntimeWarning)
    return ctx


def _cells(idx_row: np.ndarray, bucket: np.ndarray, values: np.ndarray, n_rows: int, nb: int):
    """Mean of ``values`` per (row, bucket) cell, NaN where a cell has no rows."""
    flat = idx_row.astype(np.int64) * nb + bucket
    size = n_rows * nb
    s = np.bincount(flat, weights=values, minlength=size)
    c = np.bincount(flat, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s / c
    return m.reshape(n_rows, nb), c.reshape(n_rows, nb)


def _band(m: np.ndarray) -> dict[str, list]:
    """p10 / median / p90 across rows, per bucket."""
    ctx = _quiet()
    try:
        if m.shape[0] == 1:
            p10 = p50 = p90 = m[0]
        else:
            p10, p50, p90 = np.nanpercentile(m, [10, 50, 90], axis=0)
    finally:
        ctx.__exit__(None, None, None)
    return {"p10": p10, "median": p50, "p90": p90}


def _r(x: float | None, nd: int = 3):
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


# ---------------------------------------------------------------------------- build

def _job_span(meta: dict, meta_ranks: dict[str, dict], series: dict) -> tuple[int | None, Any, Any, float]:
    """(first row in µs, start, end, span in s): the job spans from its first rank's start
    to its last rank's end (job.json is rank 0's), and at least its rows."""
    t0_us = min(int(s.ts_us.min()) for s in series.values()) if series else None
    t1_us = max(int(s.ts_us.max()) for s in series.values()) if series else None
    starts = [v for r in meta_ranks.values() if isinstance(v := (r or {}).get("start"), (int, float))]
    ends = [v for r in meta_ranks.values() if isinstance(v := (r or {}).get("end"), (int, float))]
    starts += [meta["start"]] if isinstance(meta.get("start"), (int, float)) else []
    ends += [meta["end"]] if isinstance(meta.get("end"), (int, float)) else []
    if t1_us is not None:
        ends.append(t1_us / 1e6)
    start = min(starts) if starts else (t0_us / 1e6 if t0_us else None)
    end = max(ends) if ends else None
    span = max((t1_us - t0_us) / 1e6, 1e-6) if t0_us is not None and t1_us is not None else 1.0
    return t0_us, start, end, span


def _stalls(rate, edges, med: float, min_stall: float) -> list[dict[str, Any]]:
    """Runs of buckets whose step rate is below STALL_FRACTION of the median, merged, that
    last at least ``min_stall`` seconds. Each has a ``kind``: ``hang`` when it runs to the
    end of the job's data (its steps stopped and never came back), ``pause`` when most of it
    had no step at all but steps came again (an evaluation, a checkpoint), else ``slowdown``."""
    stalls: list[dict[str, Any]] = []
    nb = len(rate)
    low = np.nan_to_num(rate, nan=np.inf) < STALL_FRACTION * med
    i = 0
    while i < nb:                                           # merge runs of low buckets
        if not low[i]:
            i += 1
            continue
        j = i
        while j + 1 < nb and low[j + 1]:
            j += 1
        if edges[j + 1] - edges[i] >= min_stall:
            low_rate = float(np.nanmin(np.where(np.isfinite(rate[i:j + 1]), rate[i:j + 1], 0.0)))
            zero = ~(np.nan_to_num(rate[i:j + 1]) > 0)      # no step completed in the bucket
            runs = np.diff(np.flatnonzero(np.concatenate([[True], ~zero, [True]]))) - 1
            stopped = runs.max(initial=0) * 2 >= len(zero)   # most of it without a step (edges are partial)
            kind = "hang" if j == nb - 1 and zero[-1] and stopped else "pause" if stopped else "slowdown"
            stalls.append({"kind": kind, "start_s": _r(edges[i], 2), "end_s": _r(edges[j + 1], 2),
                           "duration_s": _r(edges[j + 1] - edges[i], 2),
                           "step_rate": _r(low_rate, 4), "median_step_rate": _r(med, 4),
                           "ratio": _r(low_rate / med, 3)})
        i = j + 1
    return stalls


def _cpu_waits(stragglers: list[dict[str, Any]], g: Any, rank_ids: Any) -> None:
    """Each straggler's seconds of waiting for a CPU per second of the job (``cpu_wait``:
    its last ``proc_cpu_wait_s`` less its first over the time between), and ``contended``
    when that exceeds the other ranks' median by ``CONTENDED``: its node's CPUs were
    oversubscribed, the rank not slow. (Ranks that all wait alike, a job with more threads
    than its nodes' cores, excuse none of them: that wait is not what sets one apart.)"""
    if g is None or not stragglers or not len(g.value):
        return
    ranks = np.asarray(rank_ids)[g.ridx]
    order = np.lexsort((g.x, ranks))
    r, x, v = ranks[order], np.asarray(g.x, np.float64)[order], np.asarray(g.value, np.float64)[order]
    ids, first = np.unique(r, return_index=True)
    last = np.r_[first[1:], len(r)] - 1
    span = x[last] - x[first]
    ok = span > 0
    rate = {int(i): max(0.0, float(w)) for i, w, good in zip(ids, (v[last] - v[first]) / np.where(ok, span, 1), ok)
            if good and np.isfinite(w)}
    for s in stragglers:
        mine = rate.get(s["rank"])
        if mine is None:
            continue
        others = [w for i, w in rate.items() if i != s["rank"]]
        typical = float(np.median(others)) if others else None       # no other rank measured: unknown
        s["cpu_wait"] = _r(mine)
        s["cpu_wait_others"] = _r(typical) if typical is not None else None
        # no other rank's wait measured: whether this one's sets it apart is unknown (None),
        # and the rank stays a straggler, not excused as contention against an assumed 0
        s["contended"] = None if typical is None else mine - typical >= CONTENDED


def _contended_spans(transient: list[dict[str, Any]], degrading: list[dict[str, Any]], sg: Any, gw: Any,
                     rank_ids: Any) -> None:
    """Marks ``contended`` the transient episodes (over their own steps' time) and the
    degrading ranks (over the job) whose rank waited for a CPU ``CONTENDED`` s per second
    or more beyond the other ranks' median then (``cpu_wait``, ``cpu_wait_others``): a
    slowdown that came with a crowded CPU is contention, not the rank's. Every rank's
    cumulative ``proc_cpu_wait_s`` is interpolated at a span's ends (one pass over the ranks
    per span: at most 30 spans)."""
    if gw is None or sg is None or not len(gw.value):
        return
    nr = len(rank_ids)
    order = np.lexsort((np.asarray(gw.x, np.float64), gw.ridx))
    ridx = np.asarray(gw.ridx)[order]
    x, v = np.asarray(gw.x, np.float64)[order], np.asarray(gw.value, np.float64)[order]
    first = np.searchsorted(ridx, np.arange(nr), side="left")       # each rank's samples: first..last
    last = np.searchsorted(ridx, np.arange(nr), side="right") - 1
    have = last > first                                             # two samples at least
    row = {int(r): i for i, r in enumerate(rank_ids)}

    def rates(t0: float, t1: float) -> np.ndarray:
        """Each rank's waiting seconds per second over [t0, t1], clamped to its own samples
        (a rank's last sample may come before the job's last step ends); NaN where its
        samples cover less than half of the span."""
        out = np.full(nr, np.nan)
        for i in np.flatnonzero(have):
            xs, vs = x[first[i]:last[i] + 1], v[first[i]:last[i] + 1]
            a, b = max(t0, xs[0]), min(t1, xs[-1])
            if b > a and b - a >= (t1 - t0) / 2:
                out[i] = (np.interp(b, xs, vs) - np.interp(a, xs, vs)) / (b - a)
        return out

    def judge(d: dict[str, Any], t0: float, t1: float) -> None:
        i = row.get(int(d["rank"]))
        if i is None or t1 <= t0:
            return
        r = rates(t0, t1)
        others = np.delete(r, i)
        others = others[np.isfinite(others)]
        if not np.isfinite(r[i]) or not len(others):
            return
        typical = float(np.median(others))
        d.update(cpu_wait=_r(float(r[i])), cpu_wait_others=_r(typical),
                 contended=bool(r[i] - typical >= CONTENDED))
    for e in transient[:20]:
        sel = (sg.rank == e["rank"]) & (sg.step >= e["first_step"]) & (sg.step <= e["last_step"])
        if sel.any():
            judge(e, float((sg.x[sel] - sg.value[sel]).min()), float(sg.x[sel].max()))
    for d in degrading[:10]:
        judge(d, float(sg.x.min()), float(sg.x.max()))


def _others(s: dict[str, Any]) -> str:
    """The other ranks' median CPU wait, as said in a finding: unknown where none was measured."""
    v = s.get("cpu_wait_others")
    return "unknown" if v is None else f"{v:.2f}"


def _gpu_throttles(stragglers: list[dict[str, Any]], g: Any, rank_ids: Any, meta_ranks: dict[str, dict],
                   lost: Any = None, complete: bool = False) -> list[str]:
    """Each straggler's share of its GPU samples whose clocks were held back for heat or power
    delivery (a slowdown reason in ``clocks_event_reasons``; the software power cap is load, not
    a cause: ``hpcml.samplers.clockreasons``), beyond the other ranks' median share
    (``gpu_throttled``), the reasons seen (``gpu_throttle``), and ``contended`` when that
    reaches ``CONTENDED``: the GPU's cooling slowed the rank, not the rank itself.

    A rank's GPU samples are those of the GPUs it is proven to have used, whichever rank's
    recorder recorded them (``hpcml.observe.gpuowners``), and its ``gpus`` are those NVML saw
    it on. Where no GPU is proven its, or one of its GPUs was lost (``lost``: ``gpu_lost``
    rows, fallen off the bus), its share is unknown (None, not 0, nor the recorder's): said in
    what this returns, the report's ``unjudged``."""
    if g is None or not stragglers or not len(g.value):
        return []
    from hpcml.observe.gpuowners import owners
    from hpcml.samplers.clockreasons import SLOWDOWN, reason_names
    pairs, inv = _gpu_pairs(g, rank_ids)
    vals = np.asarray(g.value, np.float64)
    ok = np.isfinite(vals) & (vals >= 0) & (vals < 2.0 ** 63) & (vals == np.floor(vals))
    masks = np.where(ok, vals, 0).astype(np.uint64) & np.uint64(SLOWDOWN)
    n = np.bincount(inv[ok], minlength=len(pairs))
    k = np.bincount(inv[ok], weights=(masks[ok] != 0).astype(np.float64), minlength=len(pairs))
    order = np.argsort(inv, kind="stable")
    seen = np.bitwise_or.reduceat(masks[order], np.searchsorted(inv[order], np.arange(len(pairs))))
    gone = set(_gpu_pairs(lost, rank_ids)[0]) if lost is not None and len(lost.value) else set()
    own = owners(meta_ranks, [*pairs, *(gone - set(pairs))], complete)
    total: dict[int, list[float]] = {}                     # rank -> [samples, held samples]
    reasons: dict[int, int] = {}
    lost_ranks = {u for pair in gone for u in own.by_pair.get(pair, ())}
    uuids: dict[int, list[str]] = {}                      # rank -> the UUIDs of the GPUs credited to it
    indices: dict[int, list[str]] = {}                    # rank -> their NVML indices, as the rows have them
    for pair in [*pairs, *sorted(gone - set(pairs))]:     # a lost GPU is the one most worth naming
        known = (meta_ranks.get(str(pair[0])) or {}).get("gpu_uuids")
        uuid = known.get(str(pair[1])) if isinstance(known, dict) else None
        for u in own.by_pair.get(pair, ()):
            if isinstance(uuid, str) and uuid and uuid not in uuids.setdefault(u, []):
                uuids[u].append(uuid)
            if pair[1] >= 0 and str(pair[1]) not in indices.setdefault(u, []):
                indices[u].append(str(pair[1]))
    for p, pair in enumerate(pairs):
        for u in own.by_pair.get(pair, ()):
            t = total.setdefault(u, [0.0, 0.0])
            t[0], t[1] = t[0] + float(n[p]), t[1] + float(k[p])
            reasons[u] = reasons.get(u, 0) | int(seen[p])
    share = {u: held / count for u, (count, held) in total.items() if count and u not in lost_ranks}
    unproven: list[int] = []
    went: list[int] = []
    for s in stragglers:
        rank = s["rank"]
        if rank in own.named:
            s["gpus"] = own.named[rank]
        elif indices.get(rank):          # the rows' numbering, not the binding's (Slurm's, CUDA's)
            s["gpus"] = indices[rank]
        s["gpu_uuids"] = uuids.get(rank) or None       # the GPU as it names itself: one name on every node
        mine = share.get(rank)
        s["gpu_throttle"] = reason_names(reasons.get(rank, 0)) or None
        if mine is None:            # its GPU unknown, or lost: unknown, not 0
            s["gpu_throttled"] = None
            (went if rank in lost_ranks else unproven).append(rank)
            continue
        others = [v for r, v in share.items() if r != rank]
        if not others:          # no other rank's GPU measured: beyond what they had is unknown, not 0
            s["gpu_throttled"] = None
            continue
        s["gpu_throttled"] = _r(max(0.0, mine - float(np.median(others))), 3)
        if (s["gpu_throttled"] or 0.0) >= CONTENDED:
            s["contended"] = True
    notes = []
    if unproven:
        notes.append(f"GPU throttling of {_ranks(unproven)} (no recorded GPU is proven {_its(unproven)}: NVML did "
                     f"not show {_its(unproven)} processes on one)")
    if went:
        notes.append(f"GPU throttling of {_ranks(went)} (a GPU {'it' if len(went) == 1 else 'they'} used was lost: "
                     "NVML said GPU_IS_LOST)")
    return notes


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _its(ranks: list[int]) -> str:
    return "its" if len(ranks) == 1 else "their"


def _gpu_pairs(g: Any, rank_ids: Any) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The GPUs of some GPU rows, each as (recording rank, NVML index; -1: none named), and
    each row's GPU as an index into them."""
    rec = np.asarray(rank_ids, np.int64)[g.ridx]
    # a row's GPU as written (a file: the job's own program may write there): -1 (none) to 65534
    gpu = np.full(len(rec), -1, np.int64) if g.gpu is None else np.clip(np.asarray(g.gpu, np.int64), -1, 65534)
    keys, inv = np.unique(rec * 65536 + (gpu + 1), return_inverse=True)
    return [(int(key // 65536), int(key % 65536) - 1) for key in keys], inv.reshape(-1)


def _unfinished_until(last: np.ndarray, groups: dict, meta_ranks: dict[str, dict], rank_ids) -> np.ndarray:
    """Each rank's active span ends with its last step, unless it did not finish (no exit
    code, or not 0: stopped in a hang, killed): then with its last row of any kind, its
    recorder's samples through a hang, so that the time with no step is a stall, not an end.
    A rank that exited 0 ended with its last step (what follows is its teardown)."""
    unfinished = np.array([(meta_ranks.get(str(int(r))) or {}).get("exit_code") != 0 for r in rank_ids], bool)
    if not unfinished.any():
        return last
    out = last.copy()
    for g in groups.values():
        if len(g.x):
            np.maximum.at(out, g.ridx, np.where(unfinished[g.ridx], g.x, -np.inf))
    return out


def _stragglers(scoring, limits: Limits, plots: dict[str, Any]) -> tuple[list, list, list, Any, Any]:
    """(chronic stragglers, one-off stalls, transient episodes, bimodal speeds, the check's
    verdict) from the scores computed in the background; the degrading ranks go to plots."""
    stragglers: list[dict[str, Any]] = []
    one_off: list[dict[str, Any]] = []
    transient: list[dict[str, Any]] = []
    bimodal: dict[str, Any] | None = None
    check: dict[str, Any] | None = None
    if scoring is None:
        return stragglers, one_off, transient, bimodal, check
    scores, speeds = scoring.result()
    if scores:
        check = {"judged": scores[0].judged, "steps": scores[0].steps, "seconds": _r(scores[0].seconds, 2),
                 "min_steps": limits.min_straggler_steps, "min_seconds": limits.min_straggler_s}
    if speeds is not None:
        bimodal = {"fast_ranks": speeds[0], "slow_ranks": speeds[1], "ratio": _r(speeds[2])}
    for s in scores:
        for a, b, ratio in getattr(s, "episodes", []):
            transient.append({"rank": s.rank, "node": s.node, "first_step": a, "last_step": b,
                              "ratio": _r(ratio)})
        if s.chronic:
            stragglers.append({"rank": s.rank, "node": s.node, "gpus": s.gpus, "gpu_uuids": None, "score": _r(s.score),
                               "slow_fraction": _r(s.slow_fraction), "trend": _r(s.trend),
                               "confidence": _r(s.confidence), "steps": s.steps})
        for st, ratio in s.stalls:
            one_off.append({"rank": s.rank, "node": s.node, "step": st, "ratio": _r(ratio)})
    one_off.sort(key=lambda d: -d["ratio"])
    transient.sort(key=lambda d: -(d["last_step"] - d["first_step"]))
    degrading = [s for s in scores if s.trend > 1 + max(limits.chronic, 0.15) and s.judged]
    plots["degrading"] = [{"rank": s.rank, "node": s.node, "trend": _r(s.trend)} for s in degrading]
    return stragglers, one_off, transient, bimodal, check


#: what a job says of how its ranks share the work (``--parallelism``, or the job's meta)
PARALLELISM = ("data", "roles")


def _split_cost(bimodal: dict[str, Any] | None, sg, rank_ids, meta_ranks: dict[str, dict],
                start: float | None, end: float | None, parallelism: str | None) -> None:
    """What a speed split costs, added to ``bimodal``: each group's median step time, the
    slow group's nodes, and, since a synchronous job runs at its slowest ranks' pace, the
    share of the job's time and the GPU-hours (rank-hours where the GPUs are not known)
    the split took."""
    if bimodal is None or sg is None:
        return
    per_rank = np.asarray(rank_ids)[sg.ridx]
    med = {}
    for side in ("fast", "slow"):
        keep = np.isin(per_rank, bimodal[f"{side}_ranks"])
        med[side] = float(np.median(sg.value[keep])) if keep.any() else None
    nodes = sorted({n for r in bimodal["slow_ranks"] if (n := (meta_ranks.get(str(r)) or {}).get("node"))},
                   key=natural_key)
    fast, slow = med["fast"], med["slow"]
    lost = 1 - fast / slow if fast and slow and slow > fast else None
    ranks = len(bimodal["fast_ranks"]) + len(bimodal["slow_ranks"])
    gpus = _distinct_gpus(meta_ranks, [*bimodal["fast_ranks"], *bimodal["slow_ranks"]])
    wall = (end - start) if start is not None and end is not None else None
    hours = wall * lost * (gpus or ranks) / 3600 if wall and lost is not None else None
    bimodal.update({"fast_step_s": _r(fast, 6), "slow_step_s": _r(slow, 6), "slow_nodes": nodes,
                    "time_lost_share": _r(lost, 4), "lost_hours": _r(hours, 3),
                    "lost_hours_unit": "GPU-hours" if gpus else "rank-hours",
                    "parallelism": parallelism if parallelism in PARALLELISM else None})


def _distinct_gpus(meta_ranks: dict[str, dict], rank_list: list[int]) -> int | None:
    """The GPUs ``rank_list`` held, each (node, GPU) once: ranks of one node may each list
    all of its GPUs (``SLURM_STEP_GPUS`` names the step's, not the task's), so a sum over
    ranks would count them once per rank. None where a rank's GPUs or node are not known."""
    held: set[tuple[str, str]] = set()
    for r in rank_list:
        m = meta_ranks.get(str(r)) or {}
        ids, node = m.get("gpus"), m.get("node") or m.get("host")
        if not isinstance(ids, list) or not ids or not node:
            return None
        held |= {(str(node), str(g)) for g in ids}
    return len(held) or None


def _split_finding(b: dict[str, Any]) -> Finding:
    slow, fast = b["slow_ranks"], b["fast_ranks"]
    nodes = b.get("slow_nodes") or []
    where = f" on {', '.join(nodes[:6])}{' ...' if len(nodes) > 6 else ''}" if nodes else ""
    cost = ""
    if b.get("fast_step_s") and b.get("slow_step_s") and b.get("time_lost_share") is not None:
        cost = (f": at the fast group's pace a step would take {b['fast_step_s']:.3g} s instead of "
                f"{b['slow_step_s']:.3g} s, {b['time_lost_share'] * 100:.0f}% of the job's time")
        if b.get("lost_hours") is not None:
            cost += f" (~{b['lost_hours']:.3g} {b['lost_hours_unit']})"
    message = (f"two speed groups: {len(slow)} ranks ({_ranks_text(slow)}){where} take "
               f"{b['ratio']:.2f}x the step time of the other {len(fast)}{cost}")
    exclude = f"srun --exclude={','.join(nodes)}" if nodes else "srun --exclude=NODES"
    same = (f"every rank does the same work, so the slow group sets the job's pace: check its "
            f"nodes with hpcml vet, or exclude them ({exclude})")
    roles = "the ranks have different roles: rebalance the work (layers per pipeline stage, shards per server)"
    if b.get("parallelism") == "data":
        advice = same[0].upper() + same[1:]
    elif b.get("parallelism") == "roles":
        advice = roles[0].upper() + roles[1:]
    else:
        dp = same.replace("every rank does", "every rank does (data parallelism)", 1)
        pp = roles.replace("the ranks have", "ranks have", 1).replace(
            "roles:", "roles (pipeline stages, parameter servers):", 1)
        advice = (f"If {dp}; if {pp}. Say which with --parallelism data|roles. Each group was "
                  "checked for stragglers on its own")
    return Finding("bimodal", message, advice)


def _problems(job, meta_ranks: dict[str, dict], groups: dict) -> tuple[dict, dict, dict[str, float]]:
    """(damaged rank files, ranks that exited non-zero, the recorder's own problem counters)."""
    damaged = {int(r): why for r, why in sorted(job.problems.items())}
    failed = {}
    for r, info in meta_ranks.items():
        ec = (info or {}).get("exit_code")
        if ec not in (None, 0):
            failed[int(r)] = int(ec)
    rec_problems: dict[str, float] = {}
    for (k, nm), g in groups.items():
        if k == "problem" and len(g.value) and np.nanmax(g.value) > 0:
            rec_problems[nm] = float(np.nanmax(g.value))
    return damaged, failed, rec_problems


#: a rank whose heartbeat is this recent is still recording, whatever its metadata says yet
ALIVE_S = 30.0


def _unended(meta_ranks: dict[str, dict], store: Path, interval: float) -> list[int]:
    """Ranks whose recorder wrote no end (no end time, no exit code) where another rank's did,
    and that stopped beating: their last heartbeat (written every ``interval`` while the
    recorder lives) is older than the last rank's end by several intervals, or than now by
    ``ALIVE_S``. Their recorder stopped before them (killed, its node lost); whether they
    finished is unknown. While every rank still records (a running job's report), none is."""
    ends = [float(m["end"]) for m in meta_ranks.values() if isinstance(m, dict) and isinstance(m.get("end"), (int, float))]
    open_ = [int(r) for r, m in meta_ranks.items() if str(r).isdigit() and isinstance(m, dict)
             and m.get("end") is None and m.get("exit_code") is None]
    if not ends or not open_:           # the heartbeats are read only when a rank is in question
        return []
    from hpcml.observe.beat import read_beats
    beats = {b.rank: b.beat for b in read_beats(store).values() if b.beat is not None}
    last_end, now, gap = max(ends), time.time(), max(2.0, 5 * interval)
    return sorted(r for r in open_ if (beat := beats.get(r)) is None or last_end - beat > gap or now - beat > ALIVE_S)


def _throughput(groups: dict, cells: dict, rate, width: float, plots: dict[str, Any]) -> dict[str, Any] | None:
    """Throughput: a user metric if logged (median over ranks per bucket), else steps/s."""
    throughput: dict[str, Any] | None = None
    metric_names = [nm for (k, nm) in groups if k == "metric"]
    chosen = next((nm for nm in THROUGHPUT_METRICS if nm in metric_names), None) or \
        next((nm for nm in sorted(metric_names) if nm.endswith(("_per_s", "_per_sec", "_per_second"))), None)
    if chosen:
        ctx = _quiet()
        try:
            series = np.nanmedian(cells[("metric", chosen)], axis=0)
        finally:
            ctx.__exit__(None, None, None)
        throughput = {"source": "metric", "name": chosen, "unit": chosen}
    elif rate is not None:
        series = rate
        throughput = {"source": "section", "name": "step", "unit": "steps/s per rank"}
    if throughput is not None:
        fin = series[np.isfinite(series)]
        throughput.update(bucket_s=_r(width, 3), median=_r(np.median(fin)) if len(fin) else None,
                          min=_r(fin.min()) if len(fin) else None, max=_r(fin.max()) if len(fin) else None,
                          series=[_r(v, 4) for v in _downsample(series, 60)])
        plots["throughput"] = {"name": throughput["unit"], "values": series}
    return throughput


def build(job, *, max_buckets: int = MAX_BUCKETS, max_rows: int = MAX_HEATMAP_ROWS,
          limits: Limits = Limits(), parallelism: str | None = None) -> Report:
    """The report for one job store: ``hpcml.observe.series.read_series`` (what the CLI
    reads: a thousand ranks in a fraction of the memory) or ``hpcml.observe.store.read_job``."""
    meta = job.meta
    meta_ranks: dict[str, dict] = meta.get("ranks") or {}
    expected = int(meta.get("ntasks") or 0) or (max(job.ranks) + 1 if job.ranks else 0)

    # One series per (kind, name): read so by ``read_series``, or split from a read_job table.
    if hasattr(job, "series"):
        series, n = job.series, job.rows
    else:
        from hpcml.observe.series import from_table
        series, n = from_table(job.table), job.table.num_rows
    t0_us, start, end, span = _job_span(meta, meta_ranks, series)

    # Ranks and nodes.
    top = max((int(s.rank.max()) for s in series.values()), default=-1) + 1
    seen = np.zeros(max(top, 1), bool)
    for s in series.values():
        seen[s.rank] = True
    rank_ids = np.flatnonzero(seen)
    ridx = np.zeros(max(top, 1), np.int32)
    ridx[rank_ids] = np.arange(len(rank_ids))
    nr = len(rank_ids)

    def node_of(r) -> str:
        return (meta_ranks.get(str(int(r))) or {}).get("node") or f"rank{int(r)}"
    rank_nodes = [node_of(r) for r in rank_ids]
    nodes = sorted({node for v in meta_ranks.values() if (node := (v or {}).get("node"))},
                   key=natural_key)
    if not nodes and isinstance(meta.get("nodes"), list):
        nodes = list(meta["nodes"])

    # Seconds since the job's first row. float32 (10 ms resolution over a day) because memory
    # traffic, not arithmetic, bounds this on a thousand ranks.
    identity = nr == 0 or (rank_ids[0] == 0 and rank_ids[-1] == nr - 1)
    groups: dict[tuple[str, str], _Rows] = {}
    for (kind, name), s in sorted(series.items()):
        x = np.subtract(s.ts_us, t0_us or 0).astype(np.float32)
        x *= np.float32(1e-6)
        g = _Rows(rank=None, ridx=s.rank if identity else ridx[s.rank], x=x, value=s.value, gpu=s.gpu,
                  ts=s.ts_us if (kind, name) in BY_TIME else None)
        if kind == "section" and name in ("step", WAIT):
            g.rank, g.step = s.rank, s.step
            ok = g.step >= 0
            if not ok.all():
                g = g.take(ok)
        groups[(kind, name)] = g

    sg = groups.get(("section", "step"))
    if sg is not None and not len(sg.x):
        sg = None
    scoring, wg = None, groups.get(("section", WAIT))
    if sg is not None:      # numpy's partitions release the GIL: score while the rest is built
        from concurrent.futures import ThreadPoolExecutor
        busy = sg.value if wg is None else compute_times(sg.rank, sg.step, sg.value, wg.rank, wg.step, wg.value)
        pool = ThreadPoolExecutor(1)
        scoring = pool.submit(score_groups, sg.rank, sg.step, busy, elapsed=sg.value, meta_ranks=meta_ranks,
                              chronic=limits.chronic, stall=limits.stall_ratio, window=limits.window,
                              min_steps=limits.min_straggler_steps, min_seconds=limits.min_straggler_s)
        pool.shutdown(wait=False)
    n_steps = int(np.median(np.bincount(sg.ridx, minlength=nr))) if sg is not None else 0
    interval = float(meta.get("interval") or 1.0)
    nb = n_steps // 5 if n_steps else int(span / interval)
    nb = int(min(max_buckets, max(10, nb)))
    width = span / nb
    for g in groups.values():
        g.bucket = np.minimum((g.x / width).astype(np.int32), nb - 1)
    centers = (np.arange(nb) + 0.5) * width
    plots: dict[str, Any] = {"t": centers, "bucket_s": width, "t0": t0_us / 1e6 if t0_us else None,
                             "series": [], "gpu": [], "host": [], "heatmap": None, "throughput": None}
    # before the first step began: start-up, shaded on the charts
    plots["startup_s"] = _r(max(0.0, float(np.min(sg.x - sg.value))), 3) if sg is not None else None

    restarts = _restarts(meta_ranks, groups, t0_us, max(limits.min_stall_s, 3 * interval))

    # Step rate per bucket: completed steps per active rank-second.
    rate = None
    stalls: list[dict[str, Any]] = []
    stalls_judged = False
    if sg is not None:
        first, last = _rank_extent(sg.ridx, sg.x - np.fmax(sg.value, 0), sg.x, nr)
        last = _unfinished_until(last, groups, meta_ranks, rank_ids)
        edges = np.arange(nb + 1) * width
        lo = np.maximum(first[:, None], edges[None, :-1])
        hi = np.minimum(last[:, None], edges[None, 1:])
        active = np.clip(hi - lo, 0, None).sum(axis=0)              # rank-seconds per bucket
        done = np.bincount(sg.bucket, minlength=nb).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(active > 0.5 * width, done / active, np.nan)
        for gap in restarts:                                        # not running: no rate, no stall
            rate[(edges[:-1] >= gap["start_s"] - width) & (edges[1:] <= gap["end_s"] + width)] = np.nan
        # the rate while steps came: a job that spent most of its time hung has a median of 0
        running = rate[np.isfinite(rate) & (rate > 0)]
        med = float(np.median(running)) if len(running) else float("nan")
        step_s = float(np.nanmedian(sg.value)) if len(sg.value) else 0.0
        min_stall = max(limits.min_stall_s, limits.min_stall_steps * (step_s if np.isfinite(step_s) else 0.0))
        if np.isfinite(med) and med > 0:
            stalls = _stalls(rate, edges, med, min_stall)
            stalls_judged = True
        plots["step_rate"] = rate

    # Per-rank means per bucket for every user metric and section (reused below).
    cells = {key_: _cells(g.ridx, g.bucket, g.value, nr, nb)[0]
             for key_, g in groups.items() if key_[0] in ("metric", "section")}

    throughput = _throughput(groups, cells, rate, width, plots)

    # Stragglers.
    stragglers, one_off, transient, bimodal, check = _stragglers(scoring, limits, plots)
    _cpu_waits(stragglers, groups.get(("host", "proc_cpu_wait_s")), rank_ids)
    gpu_unknown = _gpu_throttles(stragglers, groups.get(("gpu", "clocks_event_reasons")), rank_ids, meta_ranks,
                                 groups.get(("gpu", LOST)), complete=not job.missing)
    _contended_spans(transient, plots.get("degrading", []), sg, groups.get(("host", "proc_cpu_wait_s")), rank_ids)
    if check is not None:
        check["measure"] = "compute" if wg is not None and len(wg.value) else "step"
    _split_cost(bimodal, sg, rank_ids, meta_ranks, start, end, parallelism or meta.get("parallelism"))

    sections = _sections(groups, sg, nr)

    # Plot data: per-metric bands across ranks, the heatmap, node-level GPU/host series.
    for (k, nm), m in sorted(cells.items()):
        plots["series"].append({"kind": k, "name": nm, **_band(m)})
    if sg is not None:
        plots["heatmap"] = _heatmap(cells[("section", "step")], rank_ids, max_rows)
    node_names = sorted(set(rank_nodes), key=natural_key)
    nidx_of_rank = np.array([node_names.index(nd) for nd in rank_nodes], np.int64) if rank_nodes else None
    for kind in ("gpu", "host"):
        for (k, nm), g in sorted(groups.items()):
            if k == kind and nm not in NOT_CHARTED:          # running totals and counts: read, not charted
                assert nidx_of_rank is not None  # these rows have ranks, so rank_nodes is not empty
                # mean per node and bucket: over the node's GPUs, or its ranks' host samples
                m, _ = _cells(nidx_of_rank[g.ridx], g.bucket, g.value, len(node_names), nb)
                plots[kind].append({"name": nm, "nodes": node_names, "values": m})

    damaged, failed, rec_problems = _problems(job, meta_ranks, groups)

    findings = _findings(missing=list(job.missing), damaged=damaged, failed=failed, restarts=restarts,
                         reads=_reads(groups, nr),
                         stragglers=stragglers, stalls=stalls, one_off=one_off, sections=sections,
                         transient=transient, bimodal=bimodal,
                         rec_problems=rec_problems, degrading=plots.get("degrading", []),
                         meta_ranks=meta_ranks,
                         unended=[r for r in _unended(meta_ranks, Path(job.path), interval) if r not in job.missing])
    arrived, more, fr_unjudged = _arrivals(Path(job.path), meta_ranks, stragglers, step_time(throughput),
                                           waits_measured=check is not None and check.get("measure") == "compute")
    findings += _held_back_arrival(arrived, more, meta_ranks, groups, rank_ids, complete=not job.missing)
    loader = _loader(groups, rank_ids)
    findings += _loader_findings(loader, meta_ranks)
    io = iobursts.summarise(groups, rank_ids, span, stalls)
    findings += iobursts.findings(io, Finding)
    progress = summarise(series)
    findings += _diverged(progress)
    return Report(job_id=str(meta.get("job_id", job.path.name)), path=str(job.path),
                  ranks_expected=expected, ranks_with_data=len(rank_ids), nodes=nodes,
                  start=_r(start, 3), end=_r(end, 3),
                  duration_s=_r(end - start, 3) if start is not None and end is not None else None,
                  rows=int(n), throughput=throughput, stalls=stalls,
                  stragglers=stragglers, bimodal=bimodal, one_off_stalls=one_off[:50],
                  transient_stragglers=transient[:50], sections=sections,
                  missing_ranks=list(job.missing), damaged_ranks=damaged, failed_ranks=failed,
                  recorder_problems=rec_problems, findings=findings, plots=plots, restarts=restarts,
                  straggler_check=check, progress=progress, arrivals=arrived, loader=loader, io=io,
                  unjudged=_unjudged(check, stalls_judged, stragglers) + gpu_unknown + fr_unjudged)


def _diverged(progress: dict[str, Any] | None) -> list[Finding]:
    """A metric whose last logged value was NaN or infinite: the run diverged (or a metric
    broke) there; said, with the value before, never passed over for it."""
    odd = [(k, m) for k, m in ((progress or {}).get("metrics") or {}).items() if m.get("non_finite")]
    if not odd:
        return []
    k, m = odd[0]
    was = f" (its last finite value: {m['last_finite']:.4g})" if m.get("last_finite") is not None else ""
    more = f"; {len(odd) - 1} more metric(s) too" if len(odd) > 1 else ""
    return [Finding("non_finite_metric", f"the last {k} rank {m['rank']} logged was {m['non_finite']}{was}{more}",
                    "the run diverged there or the metric broke: lower the learning rate, clip gradients, or "
                    "resume from a checkpoint before it")]


def _unjudged(check: dict[str, Any] | None, stalls_judged: bool, stragglers: list) -> list[str]:
    """What no finding says nothing of: stragglers without a verdict (too few steps, or none
    recorded), stalls without a step rate (no step recorded)."""
    out = []
    if not stragglers and (check is None or not check.get("judged")):
        out.append("stragglers (no step was recorded)" if check is None else
                   f"stragglers ({check['steps']} steps, {check['seconds']:g} s: a verdict needs "
                   f"{check['min_steps']} steps and {check['min_seconds']:g} s)")
    if not stalls_judged:
        out.append("stalls (no step rate: no step was recorded)")
    return out


def step_time(throughput: dict[str, Any] | None) -> float | None:
    """The median seconds of a step, where the throughput is in steps."""
    tp = throughput or {}
    return 1.0 / tp["median"] if str(tp.get("unit", "")).startswith("steps/s") and tp.get("median") else None


def _arrivals(observe: Path, meta_ranks: dict[str, dict], stragglers: list[dict[str, Any]],
              step_s: float | None = None, waits_measured: bool = False
              ) -> tuple[dict[str, Any] | None, list[Finding], list[str]]:
    """Who arrived last at each collective, from each rank's latest periodic Flight Recorder
    dump (``flight-recorder-live``: ``hpcml run``'s ranks write one every 30 s): the five
    latest ranks, and a ``collective_straggler`` finding when the arrivals name one that the
    step times did not (``hpcml.observe.arrivals``; on GPUs the only measure NCCL leaves).
    Where each rank's waits were measured (``waits_measured``: hooks timed every blocking
    collective and receive, the better measure on CPU) and named stragglers, an arrivals
    verdict that differs is not a finding: lateness at a collective can be passed on (a
    pipeline stage waiting for its neighbour), a measured wait is the rank's own. Third: what
    was not judged (NCCL's entries without kernel timing), for the report's ``unjudged``."""
    from hpcml.observe.arrivals import LIVE, LIVE_DUMP_MAX, UNTIMED, arrivals, reduce, straggler, untimed_nccl
    from hpcml.observe.hang import load_dump
    live = observe / LIVE
    if not live.is_dir():
        return None, [], []
    dumps: dict[int, dict] = {}
    for f in sorted(live.glob("rank-*"))[:MAX_FR_DUMPS]:
        if not f.name.removeprefix("rank-").isdigit():
            continue
        try:
            dumps[int(f.name.removeprefix("rank-"))] = reduce(load_dump(f, LIVE_DUMP_MAX))
        except Exception as exc:  # noqa: BLE001 - a file the job's own program may have written: not read
            log.debug("hpcml: flight recorder dump %s not read: %s", f, exc)
    try:
        scores = arrivals(dumps)
    except Exception as exc:  # noqa: BLE001 - hostile dumps: no arrivals, the report still comes
        log.debug("hpcml: the arrivals were not judged: %s", exc)
        return None, [], []
    if not scores:
        return None, [], [UNTIMED] if untimed_nccl(dumps) else []
    top = straggler(scores, step_s=step_s)
    out: dict[str, Any] = {"measure": scores[0].measure, "ranks": [a.to_json() for a in scores[:5]],
                           "straggler": top.rank if top is not None else None}
    more: list[Finding] = []
    if top is not None and not (waits_measured and stragglers) and top.rank not in {s["rank"] for s in stragglers}:
        node = (meta_ranks.get(str(top.rank)) or {}).get("node") or "its node"
        more.append(Finding(
            "collective_straggler",
            f"rank {top.rank} on {node} arrived last at {top.last_share * 100:.0f}% of {top.collectives} collectives, "
            f"{top.late_s * 1000:.1f} ms after the others (median; the Flight Recorder's {top.measure} times), "
            f"the last most often in {top.stability * 3:.0f} of the job's thirds: the rank the others wait for",
            f"vet {node} (hpcml vet) or exclude it (srun --exclude={node})"))
    return out, more, []


def _held_back_arrival(arrived: dict[str, Any] | None, more: list[Finding], meta_ranks: dict[str, dict],
                       groups: dict, rank_ids: Any, complete: bool = False) -> list[Finding]:
    """The arrivals' findings, told as contention where the rank they name was held back by
    its node's CPUs or its GPU's power or heat (as the straggler model's ranks are)."""
    if not more or arrived is None or arrived.get("straggler") is None:
        return more
    rank = arrived["straggler"]
    probe = [{"rank": rank, "node": (meta_ranks.get(str(rank)) or {}).get("node"), "score": 1.0}]
    _cpu_waits(probe, groups.get(("host", "proc_cpu_wait_s")), rank_ids)
    _gpu_throttles(probe, groups.get(("gpu", "clocks_event_reasons")), rank_ids, meta_ranks, groups.get(("gpu", LOST)),
                   complete)
    if not probe[0].get("contended"):
        return more
    arrived["contended"] = True
    return [_arrival_contention(probe[0], f) for f in more]


def _arrival_contention(s: dict[str, Any], f: Finding) -> Finding:
    """A ``collective_straggler`` finding whose rank was held back from outside, told as
    contention: its GPU's power or heat, or its node's CPUs."""
    if f.kind != "collective_straggler":
        return f
    node = s.get("node") or "its node"
    if (s.get("gpu_throttled") or 0.0) >= CONTENDED:
        why = f" ({', '.join(s['gpu_throttle'])})" if s.get("gpu_throttle") else ""
        return Finding("contention", f"rank {s['rank']} on {node} arrived last at most collectives while its GPU's "
                       f"clocks were held back{why} in {s['gpu_throttled'] * 100:.0f}% more of its samples than the "
                       "other ranks' GPUs: its GPU's power or cooling slowed it, not the rank",
                       f"check that GPU's cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER on {node}) "
                       "and vet the node (hpcml vet)")
    return Finding("contention", f"rank {s['rank']} on {node} arrived last at most collectives while its threads "
                   f"waited for a CPU {s.get('cpu_wait') or 0.0:.2f} s per second (the other ranks' "
                   f"{_others(s)}): its node's CPUs were oversubscribed, not the rank slow",
                   "look for processes outside the job on that node (another job, a daemon), or give each rank "
                   "fewer threads (OMP_NUM_THREADS, DataLoader workers) than its cores")


def _restarts(meta_ranks: dict[str, dict], groups: dict, t0_us: int | None, min_gap: float) -> list[dict[str, Any]]:
    """When a requeued job's ranks recorded into this store again: the k-th restart is the
    earliest k-th run start of any rank; the job was not running from the last row any rank
    recorded before it. Shorter than ``min_gap``: a recorder restarted at once, nothing to say."""
    if t0_us is None:
        return []
    runs = [[*(m.get("earlier") or []), m] for m in meta_ranks.values() if isinstance(m, dict) and m.get("earlier")]
    out: list[dict[str, Any]] = []
    for k in range(1, max((len(r) for r in runs), default=0)):
        starts = [r[k].get("start") for r in runs if len(r) > k and isinstance(r[k].get("start"), (int, float))]
        if not starts:
            continue
        back = min(starts) - t0_us / 1e6
        last = max((float(g.x[g.x < back].max()) for g in groups.values() if (g.x < back).any()), default=None)
        if last is not None and back - last >= min_gap:
            out.append({"start_s": _r(last, 2), "end_s": _r(back, 2), "duration_s": _r(back - last, 2)})
    return out


def _ranks_text(ranks: list[int], shown: int = 6) -> str:
    head = ", ".join(map(str, ranks[:shown]))
    return head + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")


def _downsample(a: np.ndarray, n: int) -> np.ndarray:
    """At most ``n`` points: means of equal chunks (NaN-aware)."""
    if len(a) <= n:
        return a
    idx = np.linspace(0, len(a), n + 1).astype(int)
    ctx = _quiet()
    try:
        return np.array([np.nanmean(a[i:j]) for i, j in itertools.pairwise(idx)])
    finally:
        ctx.__exit__(None, None, None)


def group_rows(m: np.ndarray, labels: list[str], max_rows: int, reduce=np.nanmax,
               sep: str = "-") -> dict[str, Any]:
    """A heatmap's rows, consecutive rows grouped above ``max_rows`` (``reduce`` over each
    group: the worst one stays visible), labelled ``first<sep>last``."""
    n = m.shape[0]
    if n <= max_rows:
        return {"values": m, "labels": list(labels), "group": 1}
    g = -(-n // max_rows)
    pad = g * (-(-n // g)) - n
    mm = np.vstack([m, np.full((pad, m.shape[1]), np.nan)]) if pad else m
    ctx = _quiet()
    try:
        grouped = reduce(mm.reshape(-1, g, m.shape[1]), axis=1)
    finally:
        ctx.__exit__(None, None, None)
    return {"values": grouped, "labels": [f"{labels[i]}{sep}{labels[min(i + g, n) - 1]}" for i in range(0, n, g)],
            "group": g}


def _heatmap(m: np.ndarray, rank_ids: np.ndarray, max_rows: int) -> dict[str, Any]:
    """Rank x bucket mean step time; ranks grouped (max over the group) above ``max_rows``."""
    return group_rows(m, [str(int(r)) for r in rank_ids], max_rows)


def failed_finding(failed: dict[int, int]) -> Finding:
    """The finding for the ranks that exited non-zero (rank -> exit code; not empty).
    ``hpcml report`` of an ``hpcml run`` job makes it again over the ranks that failed,
    without those the run stopped (``hpcml.run.ending.failed_ranks``)."""
    r, ec = next(iter(sorted(failed.items())))
    return Finding("failed_rank", f"{len(failed)} rank(s) exited non-zero (rank {r}: {ec})",
                   f"read rank {r}'s stderr first; exit {ec} "
                   + ("is a signal (OOM kill or timeout?)" if ec > 128 else "came from the program"))


def _sections(groups: dict, sg: _Rows | None, nr: int) -> dict[str, dict[str, float | int | None]]:
    """Each section's total time, mean, the ranks that recorded it, and its share of the step
    time of those same ranks: a rank that recorded no rows of a section spent an unknown time
    in it, not 0 (rank 0 alone timing its data loading is rank 0's share, not a quarter of it)."""
    step_of = np.zeros(nr)
    stepped = np.zeros(nr, dtype=bool)
    if sg is not None and len(sg.value):
        np.add.at(step_of, sg.ridx, np.nan_to_num(sg.value.astype(np.float64), nan=0.0))
        stepped[sg.ridx] = True
    out: dict[str, dict[str, float | int | None]] = {}
    for (k, nm), g in groups.items():
        if k != "section":
            continue
        tot = float(np.nansum(g.value))
        had = np.zeros(nr, dtype=bool)
        had[g.ridx[np.isfinite(g.value)]] = True        # a rank whose rows measured nothing did not record it
        both = had & stepped
        of_step = float(step_of[both].sum())
        # the ranks that timed steps but not this section: their time in it is unknown
        tot_both = float(np.nansum(g.value[both[g.ridx]])) if both.any() else 0.0
        out[nm] = {"total_s": _r(tot, 3), "mean_s": _r(tot / max(1, len(g.value)), 6), "ranks": int(had.sum()),
                   "share_of_step": _r(tot_both / of_step, 4) if of_step > 0 and nm != "step" else None}
    return out


#: the groups whose rows are matched by their sample's time (``_at``): their own µs are kept
BY_TIME = (("host", "proc_workers"), ("host", "proc_workers_cpu_percent"))


def _at(g: _Rows) -> np.ndarray:
    """Each row's (rank index, sample µs): rows one sample wrote share it."""
    return np.rec.fromarrays([np.asarray(g.ridx, np.int64), np.asarray(g.ts, np.int64)])


def _loader(groups: dict, rank_ids: np.ndarray) -> list[dict[str, Any]] | None:
    """Per rank: the most worker processes it had at once, the fewest cores it could use,
    and its workers' mean CPU use while they ran (percent of one core); None where not recorded."""
    workers, cores, busy = (groups.get(("host", n)) for n in ("proc_workers", "proc_cores", "proc_workers_cpu_percent"))
    if workers is None or not len(workers.value):
        return None
    nr = len(rank_ids)
    most = np.full(nr, -1.0)
    np.maximum.at(most, workers.ridx, workers.value)
    fewest = np.full(nr, np.inf)
    if cores is not None and len(cores.value):
        np.minimum.at(fewest, cores.ridx, cores.value)
    used, n = np.zeros(nr), np.zeros(nr)
    if busy is not None and len(busy.value):
        # while there were workers, idle ones' 0 included: the samples whose proc_workers was > 0
        # (a sample at the same time of the same rank; a worker's first reading is not written)
        had = workers.value > 0
        on = np.isfinite(busy.value) & np.isin(_at(busy), _at(workers)[had])
        np.add.at(used, busy.ridx[on], busy.value[on])
        np.add.at(n, busy.ridx[on], 1)
    return [{"rank": int(rank_ids[i]), "workers": int(most[i]), "cores": None if not np.isfinite(fewest[i]) else
             _r(float(fewest[i]), 2), "workers_cpu_percent": _r(float(used[i] / n[i]), 1) if n[i] else None}
            for i in range(nr) if most[i] >= 0]


def _loader_findings(loader: list[dict[str, Any]] | None, meta_ranks: dict) -> list[Finding]:
    """Ranks whose worker processes and the rank itself had fewer cores than processes, the
    workers busy (``hpcml.observe.loadercores``: the live watch's rule too)."""
    short = [Short(r["rank"], (meta_ranks.get(str(r["rank"])) or {}).get("node") or "its node", r["workers"],
                   r["cores"], r["workers_cpu_percent"] or 0.0)
             for r in loader or [] if is_short(r["workers"], r["cores"], r["workers_cpu_percent"])]
    if not short:
        return []
    worst = max(short, key=Short.ratio)
    return [Finding("loader_cores", worst.what(len(short) - 1), worst.fix())]


def _reads(groups: dict, nr: int) -> tuple[float, float] | None:
    """(bytes read from storage, bytes read in all) by every rank's processes: each rank's
    last total (``hpcml.samplers.host``), summed; None when not recorded."""
    got = []
    for name in READ_TOTALS:
        g = groups.get(("host", name))
        if g is None or not len(g.value):
            return None
        per = np.zeros(max(nr, 1))
        np.maximum.at(per, g.ridx, g.value)
        got.append(float(per.sum()))
    return got[0], got[1]


def cold_or_warm(reads: tuple[float, float] | None) -> str:
    """Whether the job's reads came from the disk (cold: a first run) or the page cache."""
    if reads is None:
        return "whether its reads were cold or warm is unknown (no /proc/PID/io counts)"
    disk, total = reads
    if total <= 0 and disk <= 0:
        return "its processes read nothing through read calls (memory-mapped reads are not counted)"
    share = min(1.0, disk / total) if total > 0 else 1.0
    mb = f"{max(disk, total) / 2**20:,.0f} MB"
    if share >= COLD_SHARE:
        return (f"its reads were cold: {share * 100:.0f}% of the {mb} read came from the disk, not the page "
                "cache (a first run; a second one may not be data-bound: judge it warm)")
    return f"its reads were warm: {100 - share * 100:.0f}% of the {mb} read came from the page cache"


def _slow_nodes(stragglers: list[dict], meta_ranks: dict, out: list[Finding]) -> list[dict]:
    """A ``slow_node`` finding for each node whose every rank (two or more, from the ranks'
    own records) is a straggler: the node is slow, not a rank; the stragglers left."""
    held: dict[str, list[int]] = {}
    for r, m in meta_ranks.items():
        if isinstance(m, dict) and isinstance(m.get("node"), str):
            held.setdefault(m["node"], []).append(int(r))
    for node, ranks in sorted(held.items()):
        mine = [s for s in stragglers if s["node"] == node]
        if len(ranks) >= 2 and len({s["rank"] for s in mine}) == len(ranks):
            lo, hi = min(s["score"] for s in mine), max(s["score"] for s in mine)
            out.append(Finding("slow_node", f"node {node}: all {len(ranks)} of its ranks are "
                               + (f"{lo:.2f}x" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}x")
                               + " the step median: the node is slow, not a rank",
                               f"exclude it (srun --exclude={node}) and vet it (hpcml vet run --nodes {node})"))
            stragglers = [s for s in stragglers if s["node"] != node]
    return stragglers


def _findings(*, missing, damaged, failed, stragglers, stalls, one_off, transient, sections, rec_problems,
              degrading, meta_ranks, bimodal=None, restarts=(), reads=None, unended=()) -> list[Finding]:
    out: list[Finding] = []
    if restarts:
        total = sum(r["duration_s"] for r in restarts)
        out.append(Finding("restart_gap", f"the job ran {len(restarts) + 1} times into this store; it was not running "
                           f"for {total:.0f} s in between (from +{restarts[0]['start_s']:.0f} s): a requeue or "
                           "restart, not a stall", "hpcml run keeps each attempt of a requeued job in its own "
                           "store (attempts/N/observe) and reports them together"))
    # a rank that failed for real in an earlier run (not the requeue's TERM or SIGKILL): the
    # last run's exit alone would hide it
    before = sorted((i + 1, int(r), e["exit_code"]) for r, m in meta_ranks.items() if isinstance(m, dict)
                    for i, e in enumerate(m.get("earlier") or []) if isinstance(e, dict)
                    and isinstance(e.get("exit_code"), int) and e["exit_code"] not in (0, 128 + 15, 128 + 9))
    if before:
        run, r, ec = before[0]
        out.append(Finding("earlier_failure", f"{len(before)} rank run(s) exited non-zero before a restart "
                           f"(run {run}, rank {r}: {ec})", f"read rank {r}'s stderr of run {run}: the job was "
                           "restarted after a failure, not only requeued"))
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        nodes = sorted({node for r in missing
                        if (node := (meta_ranks.get(str(r)) or {}).get("node")) is not None})
        where = f"{', '.join(nodes[:4])}'s logs" if nodes else "its node's logs (sacct -j JOB -o NodeList)"
        out.append(Finding("missing_rank", f"rank{'s' if len(missing) > 1 else ''} {shown} left no data",
                           f"check {where}: the task was killed or never started recording"))
    if failed:
        out.append(failed_finding(failed))
    if unended:
        shown = ", ".join(map(str, unended[:8])) + (" ..." if len(unended) > 8 else "")
        nodes = sorted({node for r in unended if (node := (meta_ranks.get(str(r)) or {}).get("node")) is not None})
        out.append(Finding("unended_rank", f"rank{'s' if len(unended) > 1 else ''} {shown}: the recording stopped "
                           "before the rank ended (no end, no exit code): whether it finished is unknown",
                           f"check {', '.join(nodes[:4]) if nodes else 'its node'}: the recorder was killed or the "
                           "node lost; its data up to then is used"))
    if bimodal:
        out.append(_split_finding(bimodal))
    for s in [s for s in stragglers if s.get("contended")][:2]:
        node = s["node"] or "its node"
        if (s.get("gpu_throttled") or 0.0) >= CONTENDED and \
                (s.get("cpu_wait") or 0.0) - (s.get("cpu_wait_others") or 0.0) < CONTENDED:
            why = f" ({', '.join(s['gpu_throttle'])})" if s.get("gpu_throttle") else ""
            out.append(Finding("contention",
                               f"rank {s['rank']} on {node} is {s['score']:.2f}x the step median while its GPU's clocks "
                               f"were held back{why} in {s['gpu_throttled'] * 100:.0f}% more of its samples than the "
                               "other ranks' GPUs: its GPU's power or cooling slowed it, not the rank",
                               f"check that GPU's cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER "
                               f"on {node}) and vet the node (hpcml vet)"))
            continue
        out.append(Finding("contention",
                           f"rank {s['rank']} on {node} is {s['score']:.2f}x the step median while its threads "
                           f"waited for a CPU {s['cpu_wait']:.2f} s per second (the other ranks' "
                           f"{_others(s)}): its node's CPUs were oversubscribed, not the rank slow",
                           "look for processes outside the job on that node (another job, a daemon), or give each "
                           "rank fewer threads (OMP_NUM_THREADS, DataLoader workers) than its cores"))
    stragglers = _slow_nodes([s for s in stragglers if not s.get("contended")], meta_ranks, out)
    for s in stragglers[:2]:
        node = s["node"] or "its node"
        gpu = f" GPU {','.join(s['gpus'])}" if s["gpus"] else ""
        gpu += f" ({', '.join(s['gpu_uuids'])})" if s.get("gpu_uuids") else ""
        out.append(Finding("chronic_straggler",
                           f"rank {s['rank']} on {node}{gpu} is {s['score']:.2f}x the step median "
                           f"(confidence {s['confidence']:.2f})",
                           f"exclude {node} with srun --exclude={node} or run hpcml vet on it"))
    if len(stragglers) > 2:
        out.append(Finding("chronic_straggler", f"{len(stragglers) - 2} more chronic stragglers",
                           "see the straggler table; several on one node point at the node"))
    hung = [s for s in stalls if s.get("kind") == "hang"]
    if hung:
        h = hung[0]
        out.append(Finding("job_hang", f"the steps stopped at +{h['start_s']:.0f} s and never came back: the last "
                           f"{h['duration_s']:.0f} s of the job made no progress",
                           "a hang: hpcml run --hang-timeout stops it and names the culprit ranks and lines "
                           "(hpcml observe hang on Flight Recorder dumps does too)"))
        stalls = [s for s in stalls if s.get("kind") != "hang"]
    if stalls:
        total = sum(s["duration_s"] or 0 for s in stalls)
        worst = min(stalls, key=lambda s: s["ratio"] if s["ratio"] is not None else 0)
        pauses = sum(s.get("kind") == "pause" for s in stalls)
        out.append(Finding("job_stall", f"{len(stalls)} job-wide stall(s)"
                           + (f" ({pauses} with no step at all: a pause)" if pauses else "")
                           + f", {total:.0f} s in all; worst at "
                           f"+{worst['start_s']:.0f} s ({(worst['ratio'] or 0) * 100:.0f}% of median step rate)",
                           "every rank slowed at once: look at checkpoints, the filesystem or the "
                           "network at those times"))
    for name in DATA_SECTIONS:
        sh = (sections.get(name) or {}).get("share_of_step")
        if sh is not None and sh > DATALOAD_SHARE:
            out.append(Finding("data_bound", f"section '{name}' is {sh * 100:.0f}% of the step time; "
                               + cold_or_warm(reads),
                               "data loading bounds the step: more workers, pack the dataset (hpcml data)"
                               if reads is None or reads[1] <= 0 or reads[0] / reads[1] < COLD_SHARE else
                               "read cold: run again before packing (the page cache now holds the data), or stage "
                               "it to node-local storage (hpcml data stage) if every run reads it cold"))
            break
    if damaged:
        r, why = next(iter(damaged.items()))
        out.append(Finding("damaged_file", f"{len(damaged)} rank file(s) damaged (rank {r}: {why.split(' (')[0]})",
                           "the task was killed mid-write; its data up to the cut is used"))
    if rec_problems:
        out.append(Finding("recorder_problem", "the recorder reported " + ", ".join(
            f"{k}={v:g}" for k, v in sorted(rec_problems.items())),
            "rows were lost: check disk space and HPCML_OBSERVE_FLUSH"))
    crowded = [d for d in transient + degrading if d.get("contended")]
    if crowded:
        d = crowded[0]
        span = (f"from step {d['first_step']} to {d['last_step']}" if "first_step" in d else
                "as it got slower over the job")
        out.append(Finding("contention", f"rank {d['rank']} on {node_name(d['node'])} slowed {span} while its threads "
                           f"waited for a CPU {d['cpu_wait']:.2f} s per second (the other ranks' "
                           f"{d['cpu_wait_others']:.2f})" + (f" (+{len(crowded) - 1} more)" if len(crowded) > 1 else "")
                           + ": its node's CPUs were crowded then, not the rank slow",
                           "look for processes outside the job on that node at those times"))
    transient = [e for e in transient if not e.get("contended")]
    degrading = [d for d in degrading if not d.get("contended")]
    if transient:
        e = transient[0]
        out.append(Finding("transient_straggler", f"rank {e['rank']} on {node_name(e['node'])} was {e['ratio']:.2f}x the "
                           f"others from step {e['first_step']} to {e['last_step']}"
                           + (f" (+{len(transient) - 1} more episodes)" if len(transient) > 1 else ""),
                           "a slowdown that came and went: look at that node's host/GPU charts then "
                           "(thermal throttling, a noisy neighbour)"))
    if degrading:
        d = degrading[0]
        out.append(Finding("degrading_rank", f"rank {d['rank']} on {node_name(d['node'])} got {d['trend']:.2f}x slower "
                           "over the job", "watch the node's temperature and clocks; vet it before reuse"))
    if one_off:
        o = one_off[0]
        out.append(Finding("one_off_stall", f"{len(one_off)} one-off stall(s); worst rank {o['rank']} step "
                           f"{o['step']} at {o['ratio']:.1f}x", "single hiccups (GC, page cache); act only "
                           "if they repeat on one node"))
    return out[:MAX_FINDINGS]
