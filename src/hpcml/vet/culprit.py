"""Finding the nodes that hold an allocation-wide collective back, in few rounds.

A collective is as slow as its slowest member, so one bad node fails the whole
allocation's test and says nothing about who it was. The search tests disjoint groups
*side by side*: every group of a round runs at the same time, so the cost is the number of
rounds, not of tests. Round 1 splits the nodes into pairs; a slow group's members are
suspects, a passing group's members are known good. Each later round bisects the slow
groups: a half of two or more nodes is tested alone, a single suspect together with a
known-good node, so whatever is slow is the suspect's fault. When no group passes there
is no reference: the search tries each node alone (if the measurement can run a
collective within one node), and if that fails too it calls the problem fabric-wide and
blames nobody.

The search is pure: ``measure(groups)`` runs the collectives and returns each group's
bandwidth (``None``: the group did not complete, e.g. a node failed to join), so tests
drive it with a simulated fabric and the launcher with srun steps.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Measure = Callable[[list[list[str]]], dict[int, "float | None"]]


@dataclass
class Round:
    groups: list[list[str]]
    bandwidths: list[float | None]
    slow: list[bool]
    seconds: float

    def to_dict(self) -> dict:
        return {"groups": self.groups, "bandwidths": self.bandwidths, "slow": self.slow,
                "seconds": round(self.seconds, 3)}


@dataclass
class Search:
    nodes: list[str]
    culprits: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    #: how many slow group tests each culprit was in
    slow_tests: dict[str, int] = field(default_factory=dict)
    log: list[Round] = field(default_factory=list)
    seconds: float = 0.0
    fabric_wide: bool = False
    conclusion: str = ""

    @property
    def rounds(self) -> int:
        return len(self.log)

    @property
    def tests(self) -> int:
        return sum(len(r.groups) for r in self.log)

    def to_dict(self) -> dict:
        return {"culprits": self.culprits, "cleared": self.cleared,
                "unresolved": self.unresolved, "rounds": self.rounds, "tests": self.tests,
                "seconds": round(self.seconds, 3), "fabric_wide": self.fabric_wide,
                "conclusion": self.conclusion, "log": [r.to_dict() for r in self.log]}


def max_rounds(n: int) -> int:
    """The default cap: round 1, a fallback round, and one bisection round per halving."""
    return 2 + math.ceil(math.log2(max(2, n)))


def first_groups(nodes: Sequence[str], group_size: int = 2,
                 singletons: bool = True) -> list[list[str]]:
    """Disjoint groups of ``group_size``; a short remainder joins the last group. Fewer than
    two groups would repeat the allocation-wide test, so small sets go one node each."""
    nodes = list(nodes)
    if len(nodes) < 2 * group_size:
        return [[n] for n in nodes] if singletons else []
    groups = [nodes[i:i + group_size] for i in range(0, len(nodes), group_size)]
    if len(groups[-1]) < group_size:
        last = groups.pop()
        groups[-1] = groups[-1] + last
    return groups


class _Judge:
    """Slow: no result, below the absolute threshold, or below ``min_relative`` times the
    reference (the median of the passing groups so far; in round 1, of the other groups)."""

    def __init__(self, threshold: float | None, min_relative: float | None) -> None:
        self.threshold, self.min_relative = threshold, min_relative
        self.passing: list[float] = []

    def __call__(self, bandwidths: list[float | None]) -> list[bool]:
        out = []
        for i, bw in enumerate(bandwidths):
            slow = bw is None or (self.threshold is not None and bw < self.threshold)
            if not slow and bw is not None and self.min_relative is not None:
                ref = self.passing or [b for j, b in enumerate(bandwidths)
                                       if j != i and b is not None]
                slow = bool(ref) and bw < self.min_relative * statistics.median(ref)
            out.append(slow)
        self.passing += [b for b, s in zip(bandwidths, out) if not s and b is not None]
        return out


class _State:
    def __init__(self, nodes: list[str], measure: Measure, judge: _Judge, clock) -> None:
        self.res = Search(nodes=nodes)
        self.measure, self.judge, self.clock = measure, judge, clock
        self.good: list[str] = []
        self.pending: list[list[str]] = []  # slow sets, each holding a culprit
        self.count = dict.fromkeys(nodes, 0)

    def run(self, groups: list[list[str]]) -> list[bool]:
        t0 = self.clock()
        got = self.measure([list(g) for g in groups])
        bws = [got.get(i) for i in range(len(groups))]
        slow = self.judge(bws)
        self.res.log.append(Round(groups, bws, slow, self.clock() - t0))
        for g, s in zip(groups, slow):
            for n in g if s else ():
                self.count[n] += 1
        return slow

    def sort(self, groups: list[list[str]], slow: list[bool], alone: bool) -> None:
        """A slow node tested alone is a culprit; other slow sets wait to be split."""
        for g, s in zip(groups, slow):
            if not s:
                self.good += [n for n in g if n not in self.good]
            elif alone and len(g) == 1:
                self.res.culprits.append(g[0])
            else:
                self.pending.append(g)

    def bisect_round(self) -> bool:
        """Halves of two or more alone, a single suspect with a known-good partner."""
        tests, spare, later = [], list(self.good), []
        for g in self.pending:
            halves = [g] if len(g) == 1 else [g[:len(g) // 2], g[len(g) // 2:]]
            for half in halves:
                if len(half) > 1:
                    tests.append((half, half))
                elif spare:
                    tests.append((half + [spare.pop()], half))
                else:
                    later.append(half)
        if not tests:
            return False
        self.pending = later
        slow = self.run([t for t, _ in tests])
        self.sort([owner for _, owner in tests], slow, alone=True)
        return True


def search(nodes: Sequence[str], measure: Measure, *, threshold: float | None = None,
           min_relative: float | None = None, rounds: int | None = None,
           deadline_at: float | None = None, group_size: int = 2, singletons: bool = True,
           clock: Callable[[], float] = time.monotonic) -> Search:
    """Find the culprits among ``nodes``. ``singletons``: ``measure`` can test one node
    alone (several ranks on it); without it a lone suspect needs a known-good partner.
    ``deadline_at`` is on ``clock``'s scale; no round starts after it."""
    nodes = list(dict.fromkeys(nodes))
    cap = rounds if rounds is not None else max_rounds(len(nodes))
    st = _State(nodes, measure, _Judge(threshold, min_relative), clock)
    res, start, stopped = st.res, clock(), ""

    def may_run() -> bool:
        nonlocal stopped
        if len(res.log) >= cap:
            stopped = f"stopped at the cap of {cap} rounds"
        elif deadline_at is not None and clock() >= deadline_at:
            stopped = "stopped at the deadline"
        return not stopped

    groups = first_groups(nodes, group_size, singletons)
    if len(nodes) < 2:
        stopped = "fewer than two nodes"
    elif not groups:
        stopped = "too few nodes to split without testing one node alone"
    elif may_run():
        st.sort(groups, st.run(groups), alone=True)
        if st.pending and not st.good and singletons and may_run():
            alone = [[n] for g in st.pending for n in g]
            st.pending = []
            st.sort(alone, st.run(alone), alone=True)
    if res.log and not st.good:  # nothing passed: no reference, so blame nobody
        res.fabric_wide = True
        st.pending, res.culprits = [list(nodes)], []
    while st.pending and st.good and may_run():
        if not st.bisect_round():
            stopped = "no known-good node free to pair with"
            break
    unresolved = {n for g in st.pending for n in g}
    res.culprits = [n for n in nodes if n in res.culprits]
    res.unresolved = [n for n in nodes if n in unresolved]
    res.cleared = [n for n in nodes if n in st.good and n not in res.culprits]
    res.slow_tests = {n: st.count[n] for n in res.culprits}
    res.seconds = clock() - start
    res.conclusion = _conclude(res, stopped)
    return res


def _conclude(res: Search, stopped: str) -> str:
    from hpcml.cluster.hostlist import fold
    took = f"{res.rounds} rounds, {res.tests} tests, {res.seconds:.1f} s"
    if res.fabric_wide:
        return (f"every group of {fold(res.unresolved, sort=True)} was slow: a fabric-wide problem or "
                f"too many bad nodes; no known-good node to compare with, nobody blamed ({took})")
    if not res.log:
        return f"no search: {stopped or 'fewer than two nodes'}"
    parts = []
    if res.culprits:
        parts.append(f"culprit{'s' if len(res.culprits) > 1 else ''} {fold(res.culprits, sort=True)}")
    else:
        parts.append("no group below the threshold: the slowdown is not explained by "
                     "single nodes" if not res.unresolved else "no culprit confirmed")
    if res.unresolved:
        parts.append(f"unresolved {fold(res.unresolved, sort=True)} ({stopped or 'not isolated'})")
    return "; ".join(parts) + f" ({took})"
