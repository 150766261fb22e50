"""How often each check's and each rule's "this node is bad" was right: precision, recall
and time to catch, from what the collector holds (vetting results, proven job outcomes) and
what the node handler did (its audit log).

Why: no tool of the field publishes how often its verdicts are right, and a rule nobody
measured drains nodes on faith. The collector holds both sides, so the centre measures its
own, with the evidence each figure rests on.

A flag is a check's ``fail`` or ``error`` on a node (a drain, for a rule). It is:

- **confirmed** when something independent of it saw the node fail within ``HORIZON`` of it
  (before or after): a proven job that named the node (hang culprit, lost, straggler:
  ``HARM_ROLES``; a crashed rank is the code's), or a check of another type failing there (a lying check does not confirm
  itself, nor do its siblings of the same type);
- **refuted** when ``HORIZON`` has passed and nothing independent saw the node fail;
- **pending** while the horizon is still open and nothing confirmed it (not counted).

Precision is confirmed / (confirmed + refuted), with a Wilson 95% interval. A node is
**bad** when a proven job named it in the window; a check **caught** it when it flagged it
within ``HORIZON`` before the first job it hurt (recall: caught / bad), and its **lead** is
how long before. The figures are only as good as that proxy: a node drained at once, before
any job or other check could see it, is refuted though it was bad (the simulated fleet,
``hpcml.testing.fleet``, measures that bias against the truth).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

HORIZON = 7 * 86400.0
# what a proven job names for its node's sake; a crashed rank is its code's (any user's bug
# crashes one, on whatever node it ran), as in the centre report and the plan
HARM_ROLES = ("culprit", "lost", "straggler")
FLAGS = ("fail", "error")
MIN_DECIDED = 5            # a floor is judged from at least this many decided flags
WITNESS = 2                # failures of another check that confirm a flag (one is noise)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float | None, float | None]:
    """The Wilson score interval of ``k`` successes in ``n`` (None, None without any)."""
    if n <= 0:
        return None, None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)


def _count(times: Sequence[float], lo: float, hi: float) -> int:
    """How many of the sorted ``times`` fall in [lo, hi]."""
    return bisect_right(times, hi) - bisect_left(times, lo)


def _within(times: Sequence[float], lo: float, hi: float) -> bool:
    return _count(times, lo, hi) > 0


class Evidence:
    """Per node, when proven jobs named it and when each type of check failed there."""

    def __init__(self, results: Iterable[Mapping[str, Any]], harms: Iterable[Mapping[str, Any]]) -> None:
        self.harm: dict[str, list[float]] = defaultdict(list)
        for h in harms:
            if h.get("role") in HARM_ROLES and isinstance(h.get("time"), (int, float)):
                self.harm[str(h["node"])].append(float(h["time"]))
        self.fails: dict[tuple[str, str, str], list[float]] = defaultdict(list)   # (node, type, check) -> times
        self.results: list[Mapping[str, Any]] = []
        for r in results:
            if not isinstance(r.get("time"), (int, float)) or r.get("evidence") == "none":
                continue                    # a report nothing proved counts nowhere, as in the handler
            self.results.append(r)
            if r.get("outcome") in FLAGS:
                self.fails[(str(r["node"]), str(r.get("type") or ""), str(r.get("name") or "?"))].append(float(r["time"]))
        for v in (*self.harm.values(), *self.fails.values()):
            v.sort()
        self.kinds_of: dict[str, set[tuple[str, str]]] = defaultdict(set)       # node -> (type, check) failing there
        for node, typ, check in self.fails:
            self.kinds_of[node].add((typ, check))

    def seen_bad(self, node: str, t: float, horizon: float, own: Callable[[str, str], bool] | None = None,
                 jobs: bool = True) -> bool:
        """Whether a proven job (``jobs``), or a check that is not ``own`` (type, check ->
        whether it is the flag's own kind of evidence) failing there ``WITNESS`` times, saw
        ``node`` fail within ``horizon`` of ``t``. One failure of another check is no witness:
        on a large fleet every node has some check's one-off failure within days (the
        simulated fleet's 0.2% noise confirmed a third of all flags so)."""
        if jobs and _within(self.harm.get(node, ()), t - horizon, t + horizon):
            return True
        return any(_count(self.fails[(node, typ, check)], t - horizon, t + horizon) >= WITNESS
                   for typ, check in self.kinds_of.get(node, ()) if own is None or not own(typ, check))

    def flagged_within(self, node: str, own: Callable[[str, str], bool], lo: float, hi: float) -> float | None:
        """The earliest time in [lo, hi] a failing check of kind ``own`` flagged ``node``."""
        times = sorted(t for typ, check in self.kinds_of.get(node, ()) if own(typ, check)
                       for t in self.fails[(node, typ, check)] if lo <= t <= hi)
        return times[0] if times else None

    def bad_nodes(self, since: float) -> dict[str, float]:
        """Node -> the first time a proven job named it, since ``since``."""
        out = {}
        for node, times in self.harm.items():
            i = bisect_left(times, since)
            if i < len(times):
                out[node] = times[i]
        return out


def drained_spans(drains: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Node -> the spans it was held drained by hpcml (a drain's ``time`` to its ``until``,
    the resume; open while it is still drained)."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for d in drains:
        if isinstance(d.get("time"), (int, float)):
            until = d.get("until")
            out[str(d["node"])].append((float(d["time"]), float(until) if isinstance(until, (int, float)) else math.inf))
    return out


def _drained_for(spans: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] the node was held drained (spans do not overlap: one drain at a time)."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)


def _figures(decided: dict[str, int], pending: int, caught: list[float], bad: int, drained: int = 0) -> dict[str, Any]:
    n = decided["confirmed"] + decided["refuted"]
    lo, hi = wilson(decided["confirmed"], n)
    rlo, rhi = wilson(len(caught), bad)
    lead = sorted(caught)
    return {"flags": n + pending + drained, "confirmed": decided["confirmed"], "refuted": decided["refuted"],
            "pending": pending, "drained": drained,
            "precision": round(decided["confirmed"] / n, 4) if n else None, "precision_ci": [lo, hi],
            "bad_nodes": bad, "caught": len(caught), "recall": round(len(caught) / bad, 4) if bad else None,
            "recall_ci": [rlo, rhi], "lead_s_median": lead[len(lead) // 2] if lead else None}


def checks(ev: Evidence, since: float, now: float, horizon: float = HORIZON,
           drains: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Precision, recall and lead of every check (by name) that ran since ``since``. A flag
    not confirmed, on a node hpcml held drained for most of the horizon after it (``drains``:
    the handler's, with ``until``), is neither confirmed nor refuted: no job could run there
    to confirm it, so it is counted apart (``drained``); else a check that led to a drain
    (rightly: the node is taken out before jobs could name it) looks wrong. A node drained
    briefly and resumed took jobs for the rest: its flag is judged (a noise drain the
    handler resumed is refuted, not hidden)."""
    spans = drained_spans(drains)
    by_check: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in ev.results:
        if r["time"] >= since:
            by_check[str(r.get("name") or "?")].append(r)
    bad = ev.bad_nodes(since)
    out = []
    for name, rs in sorted(by_check.items()):
        decided = {"confirmed": 0, "refuted": 0}
        pending = held = 0
        typ = str(rs[0].get("type") or "")

        def same(t_: str, _c: str, typ: str = typ) -> bool:
            return t_ == typ                   # a check of its own type is no independent witness
        for r in rs:
            if r.get("outcome") not in FLAGS or r.get("evidence") == "none":
                continue
            node, t = str(r["node"]), float(r["time"])
            if ev.seen_bad(node, t, horizon, own=same):
                decided["confirmed"] += 1
            elif _drained_for(spans.get(node, ()), t, t + horizon) > horizon / 2:
                held += 1
            elif t + horizon <= now:
                decided["refuted"] += 1
            else:
                pending += 1

        def this(_t: str, c: str, name: str = name) -> bool:
            return c == name
        caught = [h - f for n, h in bad.items() if (f := ev.flagged_within(n, this, h - horizon, h)) is not None]
        out.append({"check": name, "type": typ, "results": len(rs),
                    **_figures(decided, pending, caught, len(bad), held)})
    return out


def rules(ev: Evidence, drains: Iterable[Mapping[str, Any]], since: float, now: float,
          declared: Mapping[str, Mapping[str, Any]] | None = None, horizon: float = HORIZON) -> list[dict[str, Any]]:
    """Precision, recall and lead of every rule that drained a node since ``since`` (the
    handler's applied drains: node, rule, time), each against its declared floor.
    ``declared``: rule -> {"matches": (type, check) -> whether the rule counts such results
    (its own evidence confirms nothing), "jobs": whether it counts jobs (then only checks
    confirm it), "floor": its min_precision} (``Rule.evidence``)."""
    by_rule: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for d in drains:
        if d.get("time") is not None and d["time"] >= since:
            by_rule[str(d.get("rule") or "?")].append((str(d["node"]), float(d["time"])))
    bad = ev.bad_nodes(since)
    out = []
    for rule, hits in sorted(by_rule.items()):
        decided = {"confirmed": 0, "refuted": 0}
        pending = 0
        info = (declared or {}).get(rule) or {}
        own = info.get("matches")
        drained: dict[str, list[float]] = defaultdict(list)
        for node, t in hits:
            drained[node].append(t)
            if ev.seen_bad(node, t, horizon, own=own, jobs=not info.get("jobs")):
                decided["confirmed"] += 1
            elif t + horizon <= now:
                decided["refuted"] += 1
            else:
                pending += 1
        caught = [h - min(ts) for n, h in bad.items()
                  if (ts := [t for t in drained.get(n, ()) if h - horizon <= t <= h])]
        row = {"rule": rule, "drains": len(hits), **_figures(decided, pending, caught, len(bad))}
        floor = info.get("floor")
        row["floor"] = floor
        n = decided["confirmed"] + decided["refuted"]
        row["below_floor"] = bool(floor is not None and n >= MIN_DECIDED and row["precision"] is not None
                                  and row["precision"] < floor)
        out.append(row)
    return out


def drains_from_audit(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The drains the handler really applied (``hpcml centre handle``'s audit log), each
    with ``until``: when it resumed the node (None while it is still drained)."""
    from hpcml.centre.handler import _applied
    out: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for node, rec in sorted(_applied(lines), key=lambda nr: nr[1].time):
        if rec.action == "drain":
            if node in open_:           # drained again: someone resumed it by hand in between
                open_[node]["until"] = rec.time.timestamp()
            open_[node] = {"node": node, "rule": rec.rule, "time": rec.time.timestamp(), "until": None}
            out.append(open_[node])
        elif node in open_:
            open_.pop(node)["until"] = rec.time.timestamp()
    return out
