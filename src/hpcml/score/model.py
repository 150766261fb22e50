"""The saturation score: how much of a GPU's compute, memory or links a job used.

Per sample and GPU, from DCGM's profiling ratios (missing values stay NaN, never 0):

- compute ``C = max(tensor, fp64, fp32, fp16 pipe activity)``. A pipe's activity is the
  share of cycles it issued work, averaged over all SMs, so it already contains SM
  activity; occupancy or SM activity without floating-point work does not raise it.
- memory ``M = min(1, DRAM active / 0.8)``: 0.8 is DRAM activity's practical peak.
- interconnect ``I = max((PCIe TX + RX) / PCIe peak, (NVLink TX + RX) / NVLink peak)``
  with the bidirectional peaks of the device's model (``devices.py``); unknown model: NaN.
- score ``S = max(C, M, I)``, and the part that attains it names the bounding resource.

The run is trimmed to its active span: from the first to the last sample at which the
mean activity over GPUs reaches half its median over the samples where it is above 0.05
(warm-up, data loading before the first step and the tail are left out). Activity is the
largest of SM activity, graphics-engine activity and NVML's utilisation (whichever were
recorded: DCGM's MIG examples carry only the engine's): a kernel that sits resident doing nothing
(a spin, a collective waiting for a peer) is still the job on the GPU, and must be
scored, low, rather than trimmed away. Summaries
are medians over the trimmed span; imbalance is the coefficient of variation of the
per-GPU median score across GPUs, and across nodes.

gssr's published formula is computed beside it for comparison:
``G = 4·[σ(αA) − ½]·[σ(βF + γ·O·e^(−λF)) − ½]`` with A = SM active, O = occupancy,
F = the sum of the four pipe activities, α = 24.0217, β = 3.0935, γ = 2.0510, λ = 11.4463.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hpcml.score.devices import lookup

DRAM_PEAK = 0.8
ACTIVE_FLOOR = 0.05
LAGGING = 0.75          # a GPU below this share of the job's median score is named
PIPES = ("pipe_tensor_active", "pipe_fp64_active", "pipe_fp32_active", "pipe_fp16_active")
GSSR = {"alpha": 24.0217, "beta": 3.0935, "gamma": 2.0510, "lambda": 11.4463}


def _nanmax(*arrays: np.ndarray) -> np.ndarray:
    stack = np.vstack(arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # all-NaN columns stay NaN
        return np.nanmax(stack, axis=0)


def _get(series: dict[str, np.ndarray], name: str, n: int) -> np.ndarray:
    v = series.get(name)
    return np.full(n, np.nan) if v is None else np.asarray(v, float)


def parts(series: dict[str, np.ndarray], model: str | None = None) -> dict[str, np.ndarray]:
    """Per-sample C, M, I and S for one GPU's series (field name -> array)."""
    n = len(next(iter(series.values()))) if series else 0
    compute = _nanmax(*(_get(series, p, n) for p in PIPES))
    memory = np.minimum(1.0, _get(series, "dram_active", n) / DRAM_PEAK)
    dev = lookup(model)
    inter = np.full(n, np.nan)
    if dev is not None:
        pcie = (_get(series, "pcie_tx_bytes", n) + _get(series, "pcie_rx_bytes", n)) / dev.pcie_bidir
        links = [pcie]
        if dev.nvlink_bidir:
            links.append((_get(series, "nvlink_tx_bytes", n) + _get(series, "nvlink_rx_bytes", n))
                         / dev.nvlink_bidir)
        inter = np.minimum(1.0, _nanmax(*links))
    score = _nanmax(compute, memory, inter)
    return {"compute": compute, "memory": memory, "interconnect": inter, "score": score}


def gssr_score(series: dict[str, np.ndarray]) -> np.ndarray:
    """gssr's documented formula, per sample (NaN where any input is missing)."""
    n = len(next(iter(series.values()))) if series else 0
    a = _get(series, "sm_active", n)
    o = _get(series, "sm_occupancy", n)
    f = sum(_get(series, p, n) for p in PIPES)
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    g = GSSR
    return 4 * (sig(g["alpha"] * a) - 0.5) * (sig(g["beta"] * f + g["gamma"] * o * np.exp(-g["lambda"] * f)) - 0.5)


def active_span(sm_active_by_gpu: np.ndarray) -> slice:
    """The trimmed span (see the module docstring) of a (gpus, samples) SM-activity array."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(sm_active_by_gpu, axis=0)
    busy = mean[mean > ACTIVE_FLOOR]
    if not len(busy):
        return slice(0, 0)
    on = np.nonzero(mean >= 0.5 * np.median(busy))[0]
    return slice(int(on[0]), int(on[-1]) + 1)


@dataclass
class GpuScore:
    gpu: str                 # "node:index"
    node: str
    samples: int
    coverage: float          # share of the trimmed span with a value (absent part of the run < 1; NaN: no span)
    score: float
    compute: float
    memory: float
    interconnect: float
    bound: str | None        # the part with the highest median (None: every part below 0.05)
    gssr: float
    medians: dict[str, float] = field(default_factory=dict)
    model: str | None = None


@dataclass
class JobScore:
    gpus: list[GpuScore]
    score: float
    bound: str | None
    breakdown: dict[str, float]
    gssr: float
    imbalance_gpus: float
    imbalance_nodes: float
    span: tuple[int, int]
    findings: list[str]
    activity: bool = True    # any activity sample (sm_active, gr_engine_active, gpu_util): False, no span can be known


def _median(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else float("nan")


ACTIVITY = ("sm_active", "gr_engine_active", "gpu_util")
BUSY_UTIL = 0.8          # NVML utilisation at which a GPU counts as "busy" to the user
IDLE_SM = 0.1            # SM activity below which the SMs did almost nothing


def _activity(cols: dict[str, np.ndarray], n: int) -> np.ndarray:
    """What the trimming rule watches: the largest of SM activity, graphics-engine activity
    and NVML's utilisation (those recorded)."""
    found = [np.asarray(cols[k], float) for k in ("sm_active", "gr_engine_active") if k in cols]
    if "gpu_util" in cols:
        found.append(np.asarray(cols["gpu_util"], float) / 100.0)
    return _nanmax(*found) if found else np.full(n, np.nan)


def score_columns(keys: list[tuple[str, str]], columns: Callable[..., dict[str, np.ndarray]],
                  n: int, models: dict[tuple[str, str], str] | None = None,
                  observe: Callable[[tuple[str, str], dict[str, np.ndarray], dict[str, np.ndarray]], None]
                  | None = None) -> JobScore:
    """Score GPUs one at a time (so a 1,024-GPU job never sits in memory twice).

    ``columns(key, names=None)`` gives a GPU's field arrays (or only ``names``) on a common
    grid of ``n`` samples (NaN where it has none); ``observe(key, columns, parts)`` sees
    each GPU's full-length columns and parts, for the report's time series."""
    models = models or {}
    total, count = np.zeros(n), np.zeros(n)
    for k in keys:                               # pass 1: the active span from mean activity
        a = _activity(columns(k, ACTIVITY), n)
        ok = np.isfinite(a)
        total[ok] += a[ok]
        count += ok
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    span = active_span(mean[None, :]) if n else slice(0, 0)
    activity = bool(count.any())
    out = []
    for k in keys:                               # pass 2: per-GPU parts over the span
        full = {name: np.asarray(v, float) for name, v in columns(k).items()}
        whole = parts(full, models.get(k))
        if observe is not None:
            observe(k, full, whole)
        s = {name: v[span] for name, v in full.items()}
        p = {name: v[span] for name, v in whole.items()}
        m = len(p["score"])
        med = {name: _median(v) for name, v in p.items()}
        ranked = [(med[x], x) for x in ("compute", "memory", "interconnect")
                  if np.isfinite(med[x]) and med[x] >= ACTIVE_FLOOR]
        present = np.zeros(m, bool)
        for v in s.values():
            present |= np.isfinite(v)
        out.append(GpuScore(gpu=f"{k[0]}:{k[1]}", node=k[0], samples=int(present.sum()),
                            coverage=float(present.mean()) if m else float("nan"),
                            score=med["score"], compute=med["compute"], memory=med["memory"],
                            interconnect=med["interconnect"], bound=max(ranked)[1] if ranked else None,
                            gssr=_median(gssr_score(s)) if s else float("nan"),
                            medians={name: _median(v) for name, v in s.items()}, model=models.get(k)))
    return _job(out, span, activity)


def _job(out: list[GpuScore], span: slice, activity: bool = True) -> JobScore:
    scores = np.array([g.score for g in out])
    breakdown = {x: _median(np.array([getattr(g, x) for g in out])) for x in ("compute", "memory", "interconnect")}
    ranked = [(v, x) for x, v in breakdown.items() if np.isfinite(v) and v >= ACTIVE_FLOOR]
    by_node: dict[str, list[float]] = {}
    for g in out:
        by_node.setdefault(g.node, []).append(g.score)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        node_means = np.array([np.nanmean(v) for v in by_node.values()])
    job = JobScore(gpus=out, score=_median(scores), bound=max(ranked)[1] if ranked else None,
                   breakdown=breakdown, gssr=_median(np.array([g.gssr for g in out])),
                   imbalance_gpus=_cov(scores), imbalance_nodes=_cov(node_means),
                   span=(span.start, span.stop), findings=[], activity=activity)
    job.findings = findings(job)
    return job


def _cov(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    if len(x) < 2 or np.mean(x) == 0:
        return float("nan") if len(x) < 2 else 0.0
    return float(np.std(x) / np.mean(x))


def _idle_sms(sm: float, util: float) -> str | None:
    """What NVML's utilisation hides: kernels were running, but on almost none of the SMs."""
    if not (np.isfinite(sm) and np.isfinite(util)) or sm >= IDLE_SM:
        return None
    if util >= BUSY_UTIL:
        return (f"busy but not computing: NVML says the GPUs are {util:.0%} busy, but SM activity is "
                f"{sm:.1%}: a kernel stays resident doing almost no work (a spin or sleep kernel, a "
                "collective waiting for a peer, a kernel with a few blocks); nvidia-smi's utilisation "
                "only says that some kernel ran.")
    if util >= ACTIVE_FLOOR and sm < 0.25 * util:
        return (f"launch-bound: kernels ran {util:.0%} of the time but kept {sm:.1%} of the SMs busy: "
                "many tiny kernels, and the GPU waits for the CPU to launch the next; use CUDA graphs "
                "(torch.compile mode='reduce-overhead'), larger batches or fused kernels.")
    return None


def findings(job: JobScore) -> list[str]:
    """One sentence each, most useful first."""
    out = []
    if not job.gpus:
        return ["no GPU samples"]
    if not job.activity:        # not measured is not idle: nothing says whether the job used the GPUs
        return [f"no activity recorded ({', '.join(ACTIVITY)}): the active span, and so the score, cannot be "
                "found; record SM activity (DCGM field 1002) or NVML utilisation with the other fields."]
    if job.span[1] <= job.span[0]:
        return [f"idle GPUs: no sample with activity above {ACTIVE_FLOOR:.0%} in the recording, so no score; "
                "did the job use these GPUs (CUDA_VISIBLE_DEVICES, the device in the code)?"]
    sm = _median(np.array([g.medians.get("sm_active", np.nan) for g in job.gpus]))
    tensor = _median(np.array([g.medians.get("pipe_tensor_active", np.nan) for g in job.gpus]))
    util = _median(np.array([g.medians.get("gpu_util", np.nan) for g in job.gpus])) / 100.0
    idle_sms = _idle_sms(sm, util)
    if idle_sms:
        out.append(idle_sms)
    if np.isfinite(sm) and np.isfinite(tensor) and sm >= 0.7 and tensor < 0.1 and job.bound == "compute":
        out.append(f"SM active {sm:.2f} but tensor pipe {tensor:.2f}: the matrix multiplies are not on "
                   "tensor cores; use bf16 autocast, or allow TF32 for fp32 matmuls "
                   "(torch.backends.cuda.matmul.allow_tf32 = True).")
    if np.isfinite(sm) and sm < 0.5 and not idle_sms:
        out.append(f"SM active {sm:.2f}: the GPUs wait most of the time; look at data loading and "
                   "host-side work (hpcml observe report shows the dataload section).")
    if job.bound == "memory" and job.breakdown["memory"] > 0.8:
        out.append("memory-bound: DRAM near its practical peak; larger batches or fused kernels "
                   "raise arithmetic intensity.")
    lagging = sorted((g for g in job.gpus if np.isfinite(g.score) and np.isfinite(job.score)
                      and g.score < LAGGING * job.score), key=lambda g: g.score)
    if lagging:
        names = ", ".join(f"{g.gpu} ({g.score:.2f})" for g in lagging[:5])
        more = f" and {len(lagging) - 5} more" if len(lagging) > 5 else ""
        out.append(f"GPUs well below the job's median score {job.score:.2f}: {names}{more}; a slow or "
                   "throttled GPU holds every synchronous step back (check its clocks, power and "
                   "temperature, and its node with hpcml vet).")
    elif np.isfinite(job.imbalance_gpus) and job.imbalance_gpus > 0.2:
        low = min(job.gpus, key=lambda g: g.score if np.isfinite(g.score) else np.inf)
        out.append(f"uneven GPUs (CoV {job.imbalance_gpus:.2f}); lowest is {low.gpu} at {low.score:.2f}.")
    partial = [g.gpu for g in job.gpus if g.coverage < 0.9]
    if partial:
        out.append(f"GPUs with samples for under 90 % of the run: {', '.join(partial)} (gaps or a lost GPU).")
    return out
