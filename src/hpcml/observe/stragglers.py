"""Straggler detection from per-rank step (or section) times.

Each step's time on each rank is divided by that step's median over the *other* ranks (a
leave-one-out baseline: in a job of two ranks, a rank twice as slow as the other reads 2x,
where the median of both would read 1.33x), so a job that slows down as a whole (a
checkpoint, a busy filesystem) moves no rank's score.

The time scored is the rank's compute: its step time less the time it waited in
collectives (``compute_times``; the waits come from ``hpcml.observe.collectives``). In a
synchronous job every rank's step takes as long as the slowest's, and only the split says
who the others wait for: the straggler computes most and waits least. Where no wait was
measured the step time is scored (ranks that do not synchronise, or NCCL). Per rank, over
the steps every rank reported:

- ``score``: the median of those ratios. A *chronic* straggler has a score above
  ``1 + chronic`` and is slower than ``1 + chronic`` in most of its steps.
- ``stalls``: single steps at least ``stall`` times the step median — one-off hiccups
  (a GC pause, a page-cache miss), not a slow node.
- ``episodes``: stretches of ``window`` steps where the rank was slow in most steps both
  against the others (ratio above ``1 + chronic``) *and* against its own usual ratio
  (above ``1 + chronic`` times its median) — a straggler that emerges and goes away, as in
  Alibaba PAI's published job 1, without flagging ranks that are always a little slower,
  nor fast ranks that merely slowed to the job's pace.
- ``trend``: the rank's own median ratio in the last quarter of the steps over the first
  quarter; above ``1 + chronic`` the rank is getting slower (a degrading node).

Chronic ranks get stalls, episodes and trends too: a slow node that later slows down much
more must still be reported.

``bimodal(scores)`` tells a job of two speed groups (different roles, mixed hardware)
from stragglers: the sorted per-rank scores have a gap of at least ``BIMODAL_GAP`` with at
least ``BIMODAL_SHARE`` of the ranks on each side. Such a job is scored within each group.
- ``confidence``: the share of the rank's steps that were slow, scaled down when there
  are fewer than ``MIN_STEPS`` steps to judge.

This follows the relative scoring of NVIDIA's nvidia-resiliency-ext straggler detector
(section time / median section time across ranks), computed offline from the store.

No verdict from too little evidence: below ``MIN_STEPS`` steps every rank reported or
``MIN_SECONDS`` of step time (the median rank's sum), ranks are still scored but none is
chronic, episodic, degrading or bimodal (``judged`` is False). A few seconds of a job are
start-up: caches warm, the first collectives connect, one rank's import takes longer; a
rank 1.2x slower there says nothing about its node. NVRx likewise scores over a report
interval (60 s by default in its ``Detector``, 300 s in Megatron Bridge), never less.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# the thresholds, defined where the watch reads them without numpy; the model's names too
from hpcml.observe.straggler_limits import (  # noqa: F401 - re-exported
    BIMODAL_GAP,
    BIMODAL_SHARE,
    CHRONIC,
    CONTENDED,
    MIN_SECONDS,
    MIN_STEPS,
)


@dataclass
class RankScore:
    rank: int
    node: str | None
    gpus: list[str]
    steps: int
    score: float
    slow_fraction: float
    trend: float
    confidence: float
    chronic: bool
    judged: bool = True                  # enough steps and seconds for a verdict
    level: float = 0.0                   # the rank's median time per step (what two speed groups compare)
    seconds: float = 0.0                 # of the steps judged, on the median rank
    stalls: list[tuple[int, float]] = field(default_factory=list)   # (step, ratio)
    episodes: list[tuple[int, int, float]] = field(default_factory=list)  # (first, last step, median ratio)


def _episodes(slow_own: np.ndarray, bad: np.ndarray, ratio: np.ndarray, step_ids: np.ndarray,
              window: int) -> list[tuple[int, int, float]]:
    """One rank's merged runs of bad windows, trimmed to their slow steps, each with its
    median ratio to the other ranks."""
    out: list[list[int]] = []
    for start in np.nonzero(bad)[0]:
        slow = start + np.nonzero(slow_own[start:start + window])[0]
        first, last = int(slow[0]), int(slow[-1])
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return [(int(step_ids[a]), int(step_ids[b]), float(np.median(ratio[a:b + 1]))) for a, b in out]


def _dense_ids(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, index of each element): O(n) for small non-negative ints."""
    x = x.astype(np.int64, copy=False)
    lo, hi = int(x.min()), int(x.max())
    if hi - lo > 4 * len(x) + 1_000_000:        # sparse ids: sort instead
        ids, idx = np.unique(x, return_inverse=True)
        return ids, idx
    present = np.bincount(x - lo, minlength=hi - lo + 1) > 0
    ids = np.flatnonzero(present) + lo
    lookup = np.cumsum(present) - 1
    return ids, lookup[x - lo]


def step_matrix(ranks: np.ndarray, steps: np.ndarray, values: np.ndarray):
    """(rank ids, step ids, times[rank, step]) for the steps that every rank reported."""
    rank_ids, ri = _dense_ids(ranks)
    step_ids, si = _dense_ids(steps)
    # float32: ratios need no more digits, and the medians below move half the memory
    m = np.full((len(rank_ids), len(step_ids)), np.nan, np.float32)
    m[ri, si] = values
    complete = ~np.isnan(m).any(axis=0)
    return rank_ids, step_ids[complete], m[:, complete] if not complete.all() else m


def compute_times(ranks, steps, step_s, wait_ranks, wait_steps, wait_s) -> np.ndarray:
    """Each (rank, step)'s step time less the time it waited in collectives then (the
    ``collective_wait`` row of the same rank and step; none: 0, a step without one). At least
    a thousandth of the step: a wait measured across a step's edge never makes a step free.
    Where a rank that timed its steps has no wait row at all, its waits were not measured
    (not 0): every rank is then judged on its step time, like with like, never the others'
    compute against its whole step."""
    ranks, steps, step_s = np.asarray(ranks, np.int64), np.asarray(steps, np.int64), np.asarray(step_s, float)
    wait_ranks, wait_steps = np.asarray(wait_ranks, np.int64), np.asarray(wait_steps, np.int64)
    if not len(wait_ranks) or not len(ranks) or not np.isin(np.unique(ranks), wait_ranks).all():
        return step_s
    width = int(max(steps.max(), wait_steps.max())) + 1
    key, wkey = ranks * width + steps, wait_ranks * width + wait_steps
    order = np.argsort(wkey, kind="stable")
    wkey, wait = wkey[order], np.asarray(wait_s, float)[order]
    # a (rank, step) logged twice (steps numbered per epoch): the last row, as step_matrix keeps
    at = np.maximum(np.searchsorted(wkey, key, side="right") - 1, 0)
    waited = np.where(wkey[at] == key, wait[at], 0.0)
    return less_wait(step_s, waited)


def less_wait(step_s: np.ndarray, wait_s: np.ndarray) -> np.ndarray:
    """Step times less their waits (a wait that is not a positive number: none), at least a
    thousandth of the step: the one rule the report and the live watch share."""
    wait_s = np.where(np.isfinite(wait_s) & (wait_s > 0), wait_s, 0)
    return np.maximum(step_s - wait_s, step_s.dtype.type(1e-3) * step_s)


def others_median(m: np.ndarray) -> np.ndarray:
    """For each cell of a ranks x steps matrix, the median of the step's other ranks: from
    the column's two or three middle values (``np.partition``, as a median costs), not a
    sort per rank."""
    n = m.shape[0]
    if n < 2:
        return m
    if n % 2 == 0:                       # n-1 others, odd: one middle value
        lo, hi = n // 2 - 1, n // 2
        part = np.partition(m, (lo, hi), axis=0)
        a, b = part[lo], part[hi]
        return np.where(m <= a, b, a)    # a rank in the lower half leaves the upper middle
    mid = (n - 1) // 2                   # n-1 others, even: the mean of two middle values
    part = np.partition(m, (mid - 1, mid, mid + 1), axis=0)
    a, b, c = part[mid - 1], part[mid], part[mid + 1]
    return np.where(m > b, (a + b) / 2, np.where(m < b, (b + c) / 2, (a + c) / 2))


def evidence(m: np.ndarray) -> tuple[int, float]:
    """(steps every rank reported, seconds of them on the median rank) of a step matrix."""
    return m.shape[1], float(np.median(np.nansum(m, axis=1))) if m.size else 0.0


def score_ranks(ranks, steps, values, *, elapsed=None, meta_ranks: dict | None = None, chronic: float = CHRONIC,
                stall: float = 3.0, window: int = 10, min_steps: int = MIN_STEPS,
                min_seconds: float = MIN_SECONDS) -> list[RankScore]:
    """Scores for every rank, worst first. Inputs are parallel arrays of one section's rows;
    ``elapsed``: the rows' step times when ``values`` are compute times (``compute_times``),
    for the seconds of evidence.

    Whole-matrix numpy operations (ranks x steps), so 1,024 ranks x 10,000 steps take
    about a second; Python loops only over the few ranks that have episodes or stalls.
    """
    ranks, steps = np.asarray(ranks), np.asarray(steps)
    rank_ids, step_ids, m = step_matrix(ranks, steps, np.asarray(values, float))
    wall = None if elapsed is None else step_matrix(ranks, steps, np.asarray(elapsed, float))[2]
    return score_matrix(rank_ids, step_ids, m, elapsed=wall, meta_ranks=meta_ranks, chronic=chronic, stall=stall,
                        window=window, min_steps=min_steps, min_seconds=min_seconds)


def score_matrix(rank_ids, step_ids, m, *, elapsed=None, meta_ranks: dict | None = None, chronic: float = CHRONIC,
                 stall: float = 3.0, window: int = 10, min_steps: int = MIN_STEPS,
                 min_seconds: float = MIN_SECONDS) -> list[RankScore]:
    """``score_ranks`` on a ready ranks x steps matrix of times (every cell present): what
    the live watch holds already, without flattening it to rows and back. ``elapsed``: the
    step times of the same cells when ``m`` holds compute times."""
    if m.shape[1] == 0 or len(rank_ids) < 2:
        return []
    limit = 1 + chronic
    ratio = m / others_median(m)
    n = m.shape[1]
    q = max(1, n // 4)
    score = np.median(ratio, axis=1)
    level = np.median(m, axis=1)
    slow = np.mean(ratio > limit, axis=1)
    trend = np.median(ratio[:, -q:], axis=1) / np.median(ratio[:, :q], axis=1)
    n_judged, seconds = evidence(m if elapsed is None else elapsed)
    judged = n_judged >= min_steps and seconds >= min_seconds
    chronic_rank = (score > limit) & (slow >= 0.5) & judged
    # episodes: windows where more than half the steps are slow against the others and
    # against the rank's own median
    slow_own = (ratio > limit * score[:, None]) & (ratio > limit)
    bad = np.zeros((len(rank_ids), 0), bool)
    if n >= window and judged:
        c = np.concatenate([np.zeros((len(rank_ids), 1), np.int64), np.cumsum(slow_own, axis=1)], axis=1)
        bad = (c[:, window:] - c[:, :-window]) * 2 > window
    stall_at = ratio >= stall
    out = []
    for i, rank in enumerate(rank_ids):
        is_chronic = bool(chronic_rank[i])
        stalls = [(int(step_ids[j]), float(ratio[i, j])) for j in np.nonzero(stall_at[i])[0]]
        episodes = [] if not bad[i].any() else _episodes(slow_own[i], bad[i], ratio[i], step_ids, window)
        info = (meta_ranks or {}).get(str(int(rank)), {})
        out.append(RankScore(rank=int(rank), node=info.get("node"), gpus=list(info.get("gpus", [])),
                             steps=n, score=float(score[i]), slow_fraction=float(slow[i]),
                             trend=float(trend[i]),
                             confidence=round(float(slow[i]) * min(1.0, n / MIN_STEPS), 3),
                             chronic=is_chronic, judged=judged, seconds=seconds, stalls=stalls, episodes=episodes,
                             level=float(level[i])))
    return sorted(out, key=lambda s: -s.score)


ONSET_FIT = 0.5     # a two-level fit must leave at most this share of a one-level fit's squared error


def onset(ratio: np.ndarray, limit: float = 1 + CHRONIC) -> int | None:
    """The index where one rank's slowness began in its row of ratios to the other ranks:
    the split of the row's log-ratios into a before and an after that two levels fit best
    (least squares: a change point, not the first slow step, which noise puts anywhere),
    where the after is slow (median above ``limit``), the before is not, and the split
    explains the row (``ONSET_FIT``). None: no such split, the rank was slow from the row's
    first step (its slowness began there or earlier)."""
    got = int(onsets(np.asarray(ratio, float)[None, :], limit)[0])
    return None if got < 0 else got


def onsets(ratio: np.ndarray, limit: float = 1 + CHRONIC) -> np.ndarray:
    """``onset`` of each row of a ranks x steps matrix of ratios (-1: none): the fits in one
    pass, the medians only for rows whose two-level fit explains them."""
    r, n = ratio.shape
    out = np.full(r, -1, np.int64)
    if n < 4 or r == 0:
        return out
    x = np.log(np.maximum(ratio.astype(float), 1e-6))
    c, c2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    k = np.arange(1, n)
    left = c2[:, :-1] - c[:, :-1] ** 2 / k
    rs, rq = c[:, -1:] - c[:, :-1], c2[:, -1:] - c2[:, :-1]
    sse = left + rq - rs ** 2 / (n - k)
    whole = c2[:, -1] - c[:, -1] ** 2 / n
    best = np.argmin(sse, axis=1)
    fits = (whole > 0) & (sse[np.arange(r), best] <= ONSET_FIT * whole)
    for i in np.flatnonzero(fits):
        b = int(best[i]) + 1
        if np.median(ratio[i, b:]) > limit and np.median(ratio[i, :b]) <= limit:
            out[i] = b
    return out


def bimodal(scores: list[RankScore]) -> tuple[list[int], list[int], float] | None:
    """``(fast ranks, slow ranks, slow/fast median time per step)`` when the job runs as two
    speed groups, else None. The ratio is of the ranks' own times, not of their scores: a
    score is against the other ranks' median, which for half the ranks is the other group."""
    ranked = sorted(scores, key=lambda s: s.score)
    n = len(ranked)
    if n < 4:
        return None
    v = np.array([max(s.score, 1e-12) for s in ranked])
    lo = max(2, int(np.ceil(BIMODAL_SHARE * n)))
    best, cut = 0.0, None
    for k in range(lo, n - lo + 1):                      # the cut leaves >= lo ranks each side
        gap = v[k] / v[k - 1]
        if gap > best:
            best, cut = gap, k
    if cut is None:
        return None
    levels = np.array([s.level for s in ranked])
    ratio = float(np.median(levels[cut:]) / np.median(levels[:cut])) if levels.min() > 0 else \
        float(np.median(v[cut:]) / np.median(v[:cut]))
    if best < 1.05 or ratio < BIMODAL_GAP:
        return None
    return sorted(s.rank for s in ranked[:cut]), sorted(s.rank for s in ranked[cut:]), ratio


def score_groups(ranks, steps, values, **kw) -> tuple[list[RankScore], tuple[list[int], list[int], float] | None]:
    """``score_ranks``, and for a bimodal job each group scored on its own (a straggler of
    the slow group is then still found); returns the scores and the groups (or None)."""
    ranks, steps, values = np.asarray(ranks), np.asarray(steps), np.asarray(values, float)
    elapsed = kw.pop("elapsed", None)
    scores = score_ranks(ranks, steps, values, elapsed=elapsed, **kw)
    groups = bimodal(scores) if scores and scores[0].judged else None
    if groups is None:
        return scores, None
    out: list[RankScore] = []
    for members in groups[:2]:
        keep = np.isin(ranks, members)
        out += score_ranks(ranks[keep], steps[keep], values[keep],
                           elapsed=None if elapsed is None else np.asarray(elapsed, float)[keep], **kw)
    return sorted(out, key=lambda s: -s.score), groups
