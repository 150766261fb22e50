"""A GPU recording as the scorer reads it: per GPU, a time axis and field series."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GpuSeries:
    node: str
    index: str
    model: str | None = None
    t: list[float] = field(default_factory=list)              # seconds (absolute or from start)
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, t: float, name: str, value: float) -> None:
        """Append a value at time ``t`` (a new sample if ``t`` is new)."""
        if not self.t or self.t[-1] != t:
            self.t.append(t)
            for v in self.values.values():
                v.append(np.nan)
        column = self.values.setdefault(name, [np.nan] * len(self.t))
        column[-1] = value


@dataclass
class Recording:
    source: str
    gpus: dict[tuple[str, str], GpuSeries] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def gpu(self, node: str, index: str, model: str | None = None) -> GpuSeries:
        key = (node, index)
        if key not in self.gpus:
            self.gpus[key] = GpuSeries(node, index, model)
        elif model and not self.gpus[key].model:
            self.gpus[key].model = model
        return self.gpus[key]

    def aligned(self) -> tuple[np.ndarray, dict[tuple[str, str], dict[str, np.ndarray]]]:
        """All GPUs on one time axis (the union of sample times); NaN where a GPU has none."""
        times = np.unique(np.concatenate([np.asarray(g.t, float) for g in self.gpus.values()])) \
            if self.gpus else np.array([])
        out = {}
        for key, g in self.gpus.items():
            idx = np.searchsorted(times, np.asarray(g.t, float))
            cols = {}
            for name, v in g.values.items():
                col = np.full(len(times), np.nan)
                col[idx] = np.asarray(v, float)
                cols[name] = col
            out[key] = cols
        return times, out
