"""A GPU recording as the scorer reads it: per GPU, a time axis and field series.

Importers either ``add`` values one at a time (small text formats) or hand over whole
columns with ``set_columns`` (large formats). Values are kept as float32 once frozen:
1,024 GPUs x 1 h at 1 s x 16 fields is 236 MB instead of 472 MB, and float32's seven
digits are more than DCGM's ratios and byte rates carry.

Alignment: GPUs on different nodes are sampled at slightly different instants, so a
union of their timestamps would multiply the samples. ``Recording.grid`` puts every GPU
on one grid of the recording's median sampling interval instead, from DCGM's own
timestamps (a GPU missing part of the run has NaN there, never 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_ID

VALUE_DTYPE = np.float32
# Grid points per series: 10 days at 1 s (1 day at 0.1 s). A span beyond it is a stray
# timestamp (a ms stamp beside seconds, a sample a year later), never a recording: a grid
# that long would take GiBs per field before anything is scored.
GRID_MAX_SAMPLES = 864_000
# The longest span a recording may cover (30 days, past any batch job's time limit): with
# few samples the median interval is the stray gap itself, so the grid bound alone would
# let a sample in the year 5138 through as a "3,000-year" report.
SPAN_MAX_S = 30 * 86_400.0
# The longest interval a user may give for rows without timestamps (a day): beyond it,
# tick x interval leaves the range where float seconds are exact.
INTERVAL_MAX_S = 86_400.0
# Values DCGM can report for each share: PROF_* ratios 0..1, GPU_UTIL/MEM_UTIL percent.
# Outside (beyond RANGE_TOLERANCE of the span, for rounding) a value is impossible, kept
# as unknown, never scored; inside the tolerance it is clipped to the range.
RANGES: dict[str, tuple[float, float]] = {
    **{BY_ID[fid].name: (0.0, 1.0) for fid in range(1001, 1009)},
    "gpu_util": (0.0, 100.0), "mem_util": (0.0, 100.0),
}
RANGE_TOLERANCE = 0.01


# DCGM's "no value" sentinels (dcgm_structs.h): *_BLANK, then +1 NOT_FOUND, +2
# NOT_SUPPORTED, +3 NOT_PERMISSIONED. Exporters print them as numbers (dcgm-exporter's
# 9223372036854775794 is INT64 NOT_SUPPORTED); as float64 every INT64 one rounds to 2**63.
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
_BLANKS = frozenset({DCGM_INT32_BLANK + k for k in range(4)} | {DCGM_FP64_BLANK + k for k in range(4)})


def dcgm_blank(v: float) -> bool:
    """True for a DCGM sentinel printed as a number: a missing value, not data."""
    return v in _BLANKS or v >= float(DCGM_INT64_BLANK)


def check_interval(interval: float, key: str = "interval") -> float:
    """An interval a user gave (times are tick x interval): finite, above 0 and at most
    INTERVAL_MAX_S, else a UsageError naming the setting (-1 would run time backwards)."""
    try:
        v = float(interval)
    except (TypeError, ValueError):
        raise UsageError(f"the interval must be a number of seconds, not {interval!r}", key=key) from None
    if not math.isfinite(v) or v <= 0 or v > INTERVAL_MAX_S:
        raise UsageError(f"the interval must be above 0 s and at most {INTERVAL_MAX_S:g} s, not {interval}", key=key)
    return v


def _file(source: str) -> str:
    """The file named in a Recording's ``source`` (``format:path``)."""
    return source.split(":", 1)[1] if ":" in source else source


def text_value(text: str) -> float:
    """A value read from text: N/A, blanks, strings and non-finite numbers are missing (NaN),
    never 0."""
    try:
        v = float(text)
    except ValueError:
        return np.nan
    return v if np.isfinite(v) else np.nan


@dataclass
class GpuSeries:
    """One GPU, or one MIG instance of a GPU: an entity of its own (``mig`` says which: e.g.
    ``{"gpu_i_id": "13", "gpu_i_profile": "1g.5gb", "parent": "0"}``), never folded into
    its parent, whose figures already include every instance's work."""
    node: str
    index: str
    model: str | None = None
    t: list[float] | np.ndarray = field(default_factory=list)     # seconds (absolute or from start)
    values: dict[str, list[float] | np.ndarray] = field(default_factory=dict)
    mig: dict[str, str] | None = None                              # None: a whole GPU

    @property
    def key(self) -> tuple[str, str]:
        return (self.node, self.index)

    def add(self, t: float, name: str, value: float) -> None:
        """Append a value at time ``t`` (a new sample if ``t`` is new)."""
        if isinstance(self.t, np.ndarray):
            raise ValueError("series is frozen; use set_columns")
        if not self.t or self.t[-1] != t:
            self.t.append(t)
            for v in self.values.values():
                assert isinstance(v, list)  # not frozen: columns are lists, like t
                v.append(np.nan)
        column = self.values.setdefault(name, [np.nan] * len(self.t))
        column[-1] = value

    def set_columns(self, t, values: Mapping[str, ArrayLike]) -> None:
        """Whole columns at once (every column as long as ``t``)."""
        self.t = np.asarray(t, float)
        self.values = {k: np.asarray(v, VALUE_DTYPE) for k, v in values.items()}

    def freeze(self) -> GpuSeries:
        """Lists to arrays, sorted by time (idempotent)."""
        t = np.asarray(self.t, float)
        values = {k: np.asarray(v, VALUE_DTYPE) for k, v in self.values.items()}
        if len(t) > 1 and np.any(np.diff(t) < 0):
            order = np.argsort(t, kind="stable")
            t = t[order]
            values = {k: v[order] for k, v in values.items()}
        self.t, self.values = t, dict(values)
        return self

    def __len__(self) -> int:
        return len(self.t)


@dataclass
class Grid:
    t0: float
    dt: float
    n: int

    @property
    def seconds(self) -> np.ndarray:
        """Seconds since the first sample, per grid point."""
        return np.arange(self.n) * self.dt


@dataclass
class Recording:
    source: str
    gpus: dict[tuple[str, str], GpuSeries] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    temporal_only: bool = False       # NVML fallback: utilisation, no saturation fields
    meta: dict = field(default_factory=dict)

    def gpu(self, node: str, index: str, model: str | None = None) -> GpuSeries:
        key = (node, index)
        if key not in self.gpus:
            self.gpus[key] = GpuSeries(node, index, model)
        elif model and not self.gpus[key].model:
            self.gpus[key].model = model
        return self.gpus[key]

    def instance(self, node: str, index: str, mig: Mapping[str, str | None], model: str | None = None) -> GpuSeries:
        """A MIG instance's series (``index`` names it apart from its parent's); ids that the
        source does not give (None) are left out."""
        g = self.gpu(node, index, model)
        g.mig = {k: v for k, v in mig.items() if v is not None}
        return g

    def freeze(self) -> Recording:
        """Every series frozen, timestamps checked finite, and impossible shares (outside
        ``RANGES``) made unknown, with a note counting them: they are never scored."""
        dropped: dict[str, int] = {}
        for g in self.gpus.values():
            g.freeze()
            assert isinstance(g.t, np.ndarray)
            if not np.isfinite(g.t).all():
                raise UsageError(f"GPU {g.node}:{g.index} has a timestamp that is not a finite number",
                                 file=_file(self.source))
            for name, (lo, hi) in RANGES.items():
                v = g.values.get(name)
                if v is None or not len(v):
                    continue
                assert isinstance(v, np.ndarray)  # frozen
                tol = RANGE_TOLERANCE * (hi - lo)
                with np.errstate(invalid="ignore"):
                    bad = (v < lo - tol) | (v > hi + tol)
                if bad.any():
                    dropped[name] = dropped.get(name, 0) + int(bad.sum())
                    v = np.where(bad, np.nan, v).astype(VALUE_DTYPE)
                g.values[name] = np.clip(v, lo, hi).astype(VALUE_DTYPE)   # NaN stays NaN
        if dropped:
            self.notes.append("values outside their possible range kept as unknown, not scored: "
                              + ", ".join(f"{n} {k} ({RANGES[k][0]:g}..{RANGES[k][1]:g})"
                                          for k, n in sorted(dropped.items())))
        return self

    def grid(self) -> Grid:
        """One time grid for all GPUs: from the earliest sample, at the median interval."""
        self.freeze()
        series = [g.t for g in self.gpus.values() if len(g.t)]
        if not series:
            return Grid(0.0, 1.0, 0)
        t0 = min(float(t[0]) for t in series)
        t1 = max(float(t[-1]) for t in series)
        steps = np.concatenate([np.diff(t) for t in series if len(t) > 1] or [np.array([1.0])])
        steps = steps[steps > 0]
        dt = float(np.median(steps)) if len(steps) else 1.0
        n = (t1 - t0) / dt + 1
        if not t1 - t0 <= SPAN_MAX_S:
            raise UsageError(f"samples span {t1 - t0:.6g} s, over {SPAN_MAX_S:g} s (30 days): a stray timestamp, "
                             "not one job's recording; refused", file=_file(self.source))
        if not math.isfinite(n) or n > GRID_MAX_SAMPLES:
            raise UsageError(f"samples span {t1 - t0:.6g} s at a {dt:.6g} s interval: over {GRID_MAX_SAMPLES} "
                             "grid points per series (a stray timestamp?); refused", file=_file(self.source))
        return Grid(t0, dt, int(round(n - 1)) + 1)

    def on_grid(self, g: GpuSeries, grid: Grid, names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """One GPU's columns (or only ``names``) on ``grid``, which ``grid()`` made after
        freezing every series; the last sample wins where two fall in one slot."""
        assert isinstance(g.t, np.ndarray)  # frozen
        idx = np.clip(np.rint((g.t - grid.t0) / grid.dt).astype(np.int64), 0, max(grid.n - 1, 0))
        out = {}
        for name, v in g.values.items():
            if names is not None and name not in names:
                continue
            col = np.full(grid.n, np.nan, VALUE_DTYPE)
            col[idx] = v
            out[name] = col
        return out

    def aligned(self) -> tuple[np.ndarray, dict[tuple[str, str], dict[str, np.ndarray]]]:
        """All GPUs on the common grid (seconds since the first sample)."""
        grid = self.grid()
        return grid.seconds, {k: self.on_grid(g, grid) for k, g in self.gpus.items()}
