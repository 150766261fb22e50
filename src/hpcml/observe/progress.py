"""What a job did: its steps, its samples and the last value of each metric it logged.

Ranks log the same metric with different values (each its own shard's loss), so "the last
loss" needs a rule, said next to every value: rank 0's last value, the one a training
script prints; another rank's only where rank 0 logged none (rank 0 died, or only some
ranks log it). The observe report and ``hpcml farm results`` both use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcml.words import printable

#: the rule, for a reader of the values
RULE = "rank 0's last logged value (another rank's only where rank 0 logged none)"
#: cumulative counters of the work done, as training frameworks name them (Megatron's
#: consumed_samples, HF's num_input_tokens_seen, ...): their last value is the job's count
COUNTERS = ("samples", "consumed_samples", "num_samples", "samples_seen", "tokens", "consumed_tokens",
            "num_tokens", "tokens_seen", "num_input_tokens_seen")
#: rates of work, per rank and second (``observe.log(samples_per_s=...)``)
RATES = ("samples_per_s", "samples_per_sec", "samples_per_second", "tokens_per_s", "tokens_per_sec",
         "tokens_per_second")


@dataclass(frozen=True)
class Last:
    """A metric's last logged value. Where that was NaN or infinite (a loss that diverged),
    ``value`` is None and ``non_finite`` says which, with ``last_finite``, the rank's last
    finite value before it: the last value is what was logged, never an older one in its place."""

    value: float | None
    rank: int
    non_finite: str | None = None          # "nan", "inf" or "-inf"
    last_finite: float | None = None

    def to_json(self) -> dict[str, Any]:
        extra = {"non_finite": self.non_finite, "last_finite": self.last_finite} if self.non_finite else {}
        return {"value": self.value, "rank": self.rank, **extra}


def _latest(ts_us: np.ndarray, idx: np.ndarray) -> int:
    """The latest of the rows ``idx``; the last written on a tie."""
    return int(idx[len(idx) - 1 - int(np.argmax(ts_us[idx][::-1]))])


def last_values(series: Mapping[tuple[str, str], Any], prefer: int = 0) -> dict[str, Last]:
    """name -> the last (by time) value of each user metric, from rank ``prefer``, else from
    the lowest rank that logged it. ``series``: ``hpcml.observe.series`` arrays by (kind, name)."""
    out: dict[str, Last] = {}
    for (kind, name), s in sorted(series.items()):
        if kind != "metric" or not len(s.value):
            continue
        mine = s.rank == prefer
        pick = mine if mine.any() else s.rank == s.rank.min()
        i = _latest(s.ts_us, np.flatnonzero(pick))
        v = float(s.value[i])
        if np.isfinite(v):
            out[name] = Last(v, int(s.rank[i]))
            continue
        finite = np.flatnonzero(pick & np.isfinite(s.value) & (s.ts_us <= s.ts_us[i]))
        out[name] = Last(None, int(s.rank[i]), "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf"),
                         float(s.value[_latest(s.ts_us, finite)]) if len(finite) else None)
    return out


def summarise(series: Mapping[tuple[str, str], Any], prefer: int = 0) -> dict[str, Any] | None:
    """Steps, samples and the last metric values of a job store (``None``: nothing logged).

    ``steps`` is rank ``prefer``'s count of completed steps (the step section's rows), with
    the fewest and most of any rank; ``samples`` is a counter metric's last value, or else
    a rate's mean over the rank's steps times their total time, said to be an estimate."""
    metrics = last_values(series, prefer)
    steps = series.get(("section", "step"))
    out: dict[str, Any] = {"rule": RULE, "metrics": {k: v.to_json() for k, v in metrics.items()},
                           "steps": None, "samples": None}
    step_rank = None
    if steps is not None and len(steps.value):
        ok = np.ones(len(steps.value), bool)   # each step section is a completed step, numbered or not yet
        ranks, counts = np.unique(steps.rank[ok], return_counts=True)
        if len(ranks):
            step_rank = prefer if prefer in ranks else int(ranks[0])
            mine = ok & (steps.rank == step_rank)
            out["steps"] = {"rank": step_rank, "count": int(counts[list(ranks).index(step_rank)]),
                            "fewest": int(counts.min()), "most": int(counts.max()), "ranks": len(ranks),
                            "seconds": float(np.nansum(steps.value[mine]))}
    if out["steps"] is None:
        out["steps"] = _logged_steps(series, prefer)
    counter = next((name for name in COUNTERS if name in metrics and metrics[name].value is not None), None)
    if counter is not None:
        last = metrics[counter]
        out["samples"] = {"value": last.value, "unit": counter, "rank": last.rank, "estimate": False,
                          "how": f"the last {counter} logged by rank {last.rank}"}
    elif out["steps"] is not None:
        rate = next((name for name in RATES if ("metric", name) in series), None)
        total = _integrate(series[("metric", rate)], steps, step_rank) \
            if rate and steps is not None and step_rank is not None else None
        if rate is not None and total is not None:
            out["samples"] = {"value": total, "unit": rate.split("_per_")[0], "rank": step_rank, "estimate": True,
                              "how": f"about: each {rate} rank {step_rank} logged times the steps since the one before"}
    if out["steps"] is None and not metrics:
        return None
    return out


def _logged_steps(series: Mapping[tuple[str, str], Any], prefer: int) -> dict[str, Any] | None:
    """Steps from the step numbers a script gave ``observe.log`` (no step section: it timed
    none, and no optimizer hook ran): the distinct numbers each rank logged."""
    pairs = [np.unique(np.stack([s.rank[s.step >= 0].astype(np.int64), s.step[s.step >= 0].astype(np.int64)]), axis=1)
             for (kind, _), s in series.items() if kind == "metric" and getattr(s, "step", None) is not None]
    pairs = [p for p in pairs if p.size]
    if not pairs:
        return None
    both = np.unique(np.concatenate(pairs, axis=1), axis=1)
    ranks, counts = np.unique(both[0], return_counts=True)
    rank = prefer if prefer in ranks else int(ranks[0])
    return {"rank": rank, "count": int(counts[list(ranks).index(rank)]), "fewest": int(counts.min()),
            "most": int(counts.max()), "ranks": len(ranks), "seconds": None}


def _integrate(rate: Any, steps: Any, rank: int) -> float | None:
    """The work of one rank's steps: each rate row times the duration of the steps it
    follows, since the rate row before (its own step, where the script logs after every step;
    the ten before it, where it logs every ten), each step counted once; the steps after the
    last rate row at that rate. Not a mean rate times the total: the mean of per-step rates
    overstates the work."""
    r = (rate.rank == rank) & np.isfinite(rate.value)
    ok = steps.rank == rank
    if steps.step is not None:
        ok &= steps.step >= 0
    if not r.any() or not ok.any():
        return None
    order = np.argsort(steps.ts_us[ok], kind="stable")
    ends, took = steps.ts_us[ok][order], steps.value[ok][order]
    idx = np.searchsorted(ends, rate.ts_us[r], side="right") - 1
    keep = idx >= 0
    if not keep.any():
        return None
    per_step: dict[int, float] = {}
    for i, v in zip(idx[keep].tolist(), rate.value[r][keep].tolist()):
        per_step[i] = v                                  # the last rate logged after a step is its own
    done = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(took), took, 0.0))])   # seconds through step i
    total, since = 0.0, 0
    for i in sorted(per_step):
        total += per_step[i] * float(done[i + 1] - done[since])
        since = i + 1
    if since < len(took):                               # the steps after the last rate row
        total += per_step[max(per_step)] * float(done[-1] - done[since])
    return float(total)


def line(progress: dict[str, Any] | None) -> str:
    """One sentence for people: "45 steps (rank 0), about 9,216 samples, loss 2.417, ..."."""
    if not progress:
        return "no steps and no metric logged"
    parts = []
    st = progress.get("steps")
    if st:
        spread = (f"; ranks did {st['fewest']:,}-{st['most']:,}" if st["fewest"] != st["most"] else "")
        parts.append(f"{st['count']:,} steps (rank {st['rank']}{spread})")
    sm = progress.get("samples")
    if sm:
        parts.append(f"{'about ' if sm['estimate'] else ''}{_num(sm['value'], 0 if sm['estimate'] else None)} "
                     f"{printable(str(sm['unit']))}" + (f" on rank {sm['rank']}" if sm["estimate"] else ""))
    shown = list(progress.get("metrics", {}).items())[:8]
    if shown:
        ranks = {m["rank"] for _, m in shown}
        vals = ", ".join(f"{printable(k)} {_shown(m)}" + (f" (rank {m['rank']})" if len(ranks) > 1 else "")
                         for k, m in shown)
        parts.append(f"last {vals}" + (f" (rank {ranks.pop()})" if len(ranks) == 1 else ""))
    return "; ".join(parts) or "no steps and no metric logged"


def _shown(m: dict[str, Any]) -> str:
    """A last value as logged: "2.417", or "nan (last finite 2.417)" for one that diverged."""
    if m.get("value") is not None:
        return _num(m["value"])
    was = m.get("last_finite")
    return f"{m.get('non_finite') or 'unknown'}" + (f" (last finite {_num(was)})" if was is not None else "")


def _num(v: float, digits: int | None = None) -> str:
    if digits == 0 or (float(v).is_integer() and abs(v) < 1e15):
        return f"{round(v):,}"
    return f"{v:.4g}"
