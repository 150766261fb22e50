"""A simulated fleet with known truth, fed through the collector's store, to measure the
centre's own verdicts against (``hpcml.centre.precision``; issue 68).

Weeks of a cluster: every node vetted ``vettings`` times a day by a protocol of five checks
(the health check's rounds, the node's own evidence: proven ``node``), and jobs of many users
on random sets of nodes, each summarised as ``hpcml run`` does, proven by MUNGE (``Proven``
as the collector records it; the HTTP and MUNGE layers are tested elsewhere, so the store is
written directly here: thousands of days of results in seconds). The node handler's real
``plan`` runs after each round and after the day's jobs over what the collector holds,
with the default rules, and its drains are applied to the simulation (a drained node takes no jobs, is still vetted, and is resumed when
the handler says so), as ``hpcml centre handle`` would with Slurm.

A share of the nodes is bad, from a random day on, of one kind each:

- ``dead``: its GPU count and Xid checks fail at every vetting, every job on it loses it;
- ``intermittent``: GPU count fails at 30% of vettings, 30% of its jobs hang on it (culprit);
- ``slow``: the GEMM check fails at 70% of vettings, 80% of its jobs name it a straggler;
- ``liar``: a healthy node whose PCIe link check fails at half its vettings (the check is
  wrong, the node is fine: its jobs run well).

Every check also fails on a healthy node at ``NOISE`` of vettings. The jobs blame healthy
nodes too, as real ones do: ``BUGGY`` of the users run code that crashes 30% of their jobs
on a random node of theirs (a crashed rank: the code's), and the watch names a random node a
straggler in ``FALSE_STRAGGLER`` of all jobs. ``Truth`` says which node was bad from when,
so every figure the centre computes can be checked.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

DAY = 86400.0
CHECKS = (("gpu-count", "gpu"), ("xid", "xid"), ("gemm", "compute"), ("pcie-link", "gpu"), ("disk", "disk"))
KINDS = ("dead", "intermittent", "slow", "liar")
NOISE = 0.002
BUGGY = 0.1                 # share of the users whose code crashes
FALSE_STRAGGLER = 0.003     # share of the jobs that name a random node a straggler


@dataclass
class Truth:
    nodes: list[str]
    kind: dict[str, str] = field(default_factory=dict)      # bad (or lied-about) node -> its kind
    since: dict[str, float] = field(default_factory=dict)   # -> from when
    flags: list[tuple[str, str, float, bool]] = field(default_factory=list)   # (check, node, time, node truly bad)
    drains: list[dict[str, Any]] = field(default_factory=list)   # the handler's applied drains (node, rule, time)
    jobs: list[tuple[float, int, frozenset]] = field(default_factory=list)   # (start, nodes held, roles it named)
    avoids: list[tuple[str, float, bool]] = field(default_factory=list)  # (node, day's end, truly bad): the avoid list

    def bad(self, node: str, t: float) -> bool:
        """Whether ``node`` was really bad at ``t`` (a liar never is)."""
        k = self.kind.get(node)
        return k is not None and k != "liar" and t >= self.since[node]

    def precision(self, check: str) -> float | None:
        mine = [b for c, _, _, b in self.flags if c == check]
        return sum(mine) / len(mine) if mine else None

    def avoid_precision(self) -> float | None:
        """The share of the avoid list's daily entries that named a really bad node."""
        return sum(b for *_, b in self.avoids) / len(self.avoids) if self.avoids else None

    def rate(self, since: float, roles: Sequence[str] = ("lost", "culprits", "stragglers", "crashed")) -> float | None:
        """Jobs a bad node hurt (as ``roles`` named it) per node-day held, of the jobs that
        started since ``since``."""
        mine = [(n, bool(named & set(roles))) for t, n, named in self.jobs if t >= since]
        held = sum(n for n, _ in mine) / 24          # each job holds its nodes one hour
        return sum(h for _, h in mine) / held if held else None

    def rule_precision(self, rule: str) -> float | None:
        mine = [self.bad(d["node"], d["time"]) for d in self.drains if d["rule"] == rule]
        return sum(mine) / len(mine) if mine else None


def _fails(kind: str | None, bad_now: bool, check: str, rng: random.Random) -> bool:
    p = NOISE
    if bad_now and kind == "dead" and check in ("gpu-count", "xid"):
        p = 1.0
    elif bad_now and kind == "intermittent" and check == "gpu-count":
        p = 0.3
    elif bad_now and kind == "slow" and check == "gemm":
        p = 0.7
    elif kind == "liar" and check == "pcie-link":
        p = 0.5
    return rng.random() < p


def simulate(store: Any, *, nodes: int = 200, days: int = 21, bad_share: float = 0.04, jobs_per_day: int = 150,
             users: int = 20, seed: int = 0, end: float, handle: bool = True, avoid: bool = False,
             vettings: int = 4, rules: Any = None) -> Truth:
    """Write ``days`` of the fleet ending at ``end`` into ``store`` (``add``, ``add_jobs``);
    with ``handle``, the node handler's rules (``rules``, a ``Catalog``; default: the
    default rules) drain and resume nodes after each of the day's ``vettings`` rounds and
    its jobs; with ``avoid``, the centre's avoid list (``hpcml.centre.plan.avoid_list``) is
    read at each day's end and the next day's jobs keep off its nodes, as ``hpcml run`` does."""
    from hpcml.centre.collector.schema import CheckResult, NodeReport
    from hpcml.centre.summaries import Proven, Received
    rng = random.Random(seed)
    names = [f"nid{i:05d}" for i in range(nodes)]
    truth = Truth(names)
    start = end - days * DAY
    n_bad = max(len(KINDS), round(nodes * bad_share))
    for i, node in enumerate(rng.sample(names, n_bad)):
        truth.kind[node] = KINDS[i % len(KINDS)]
        truth.since[node] = start + rng.uniform(0.0, 0.6) * days * DAY
    drained: set[str] = set()
    avoided: set[str] = set()
    catalog = (rules if rules is not None else _handler()[0]) if handle else None
    history: dict = {}
    buggy = {f"u{i}" for i in range(max(1, round(users * BUGGY)))}
    job_no = 0
    for day in range(days):
        t0 = start + day * DAY
        for round_ in range(vettings):
            at = t0 + round_ * DAY / vettings
            reports = []
            for node in names:
                t = at + rng.uniform(0, 600)
                kind, bad_now = truth.kind.get(node), truth.bad(node, t)
                results = []
                for check, typ in CHECKS:
                    failed = _fails(kind, bad_now, check, rng)
                    results.append(CheckResult(name=check, type=typ, outcome="fail" if failed else "pass"))
                    if failed:
                        truth.flags.append((check, node, t, truth.bad(node, t)))
                rep = NodeReport(node=node, time=t, protocol="fleet-sim", job_id=None,
                                 verdict="bad" if any(r.outcome == "fail" for r in results) else "good",
                                 results=results)
                rep.proven("node", "root")
                reports.append(rep)
            store.add(reports)
            if catalog is not None:             # a handler runs every few minutes: right after each round ...
                _handle_day(store, catalog, history, truth, names, drained, at + 660)
        summaries = []
        up = [n for n in names if n not in drained and n not in avoided]
        for _ in range(jobs_per_day):
            job_no += 1
            t = t0 + rng.uniform(3600, DAY - 7200)
            held = rng.sample(up, min(len(up), rng.choice((1, 2, 4, 8))))
            roles: dict[str, list[dict[str, Any]]] = {"lost": [], "culprits": [], "stragglers": [], "crashed": []}
            for node in held:
                kind, bad_now = truth.kind.get(node), truth.bad(node, t)
                if bad_now and kind == "dead":
                    roles["lost"].append({"node": node, "detail": "simulated lost node"})
                elif bad_now and kind == "intermittent" and rng.random() < 0.3:
                    roles["culprits"].append({"node": node, "detail": "simulated hang"})
                elif bad_now and kind == "slow" and rng.random() < 0.8:
                    roles["stragglers"].append({"node": node, "detail": "simulated straggler"})
            user = f"u{rng.randrange(users)}"
            if user in buggy and rng.random() < 0.3:          # the user's code: any node of theirs
                roles["crashed"].append({"node": rng.choice(held), "detail": "simulated exception"})
            if rng.random() < FALSE_STRAGGLER:                # the watch wrong about a healthy node
                roles["stragglers"].append({"node": rng.choice(held), "detail": "simulated false straggler"})
            failed = bool(roles["lost"] or roles["culprits"] or roles["crashed"])
            s = Received.model_validate({
                "job_id": str(job_no), "attempt": 1, "user": user, "account": "sim", "started": t, "ended": t + 3600,
                "duration_s": 3600, "exit_code": 1 if failed else 0,
                "outcome": ("hung" if roles["culprits"] else "failed") if failed else "completed", "nodes": held,
                "gpus": 4 * len(held),
                "node_hours": float(len(held)), "gpu_hours": 4.0 * len(held), **roles})
            s.proven(Proven(how="munge", user=user, uid=1000 + int(user[1:]), verified=True))
            summaries.append(s)
            truth.jobs.append((t, len(held), frozenset(k for k, v in roles.items() if v)))
        store.add_jobs(summaries)
        if catalog is not None:                 # ... and after the day's jobs
            _handle_day(store, catalog, history, truth, names, drained, t0 + DAY - 60)
        if avoid:
            from hpcml.centre.plan import AVOID_WINDOW, avoid_list
            now = t0 + DAY - 30
            avoided = {a.node for a in avoid_list(store.job_events_since(now - AVOID_WINDOW), now)}
            truth.avoids += [(n, now, truth.bad(n, now)) for n in sorted(avoided)]
    return truth


def _handler() -> tuple[Any, dict]:
    from hpcml.centre.rules import DEFAULT_RULES, load
    return load(DEFAULT_RULES), {}


def _handle_day(store: Any, catalog: Any, history: dict, truth: Truth, names: Sequence[str], drained: set[str],
                now: float) -> None:
    """The handler's ``plan`` over what the collector holds, as ``hpcml centre handle`` runs
    it once a day; its drains and resumes applied to the simulated Slurm."""
    from hpcml.centre.handler import NodeState, Record, plan, reach
    from hpcml.centre.sources import collector_results
    when = datetime.fromtimestamp(now, timezone.utc)
    states = {n: NodeState(n, "DRAIN" if n in drained else "IDLE",
                           (history[n].rule and f"hpcml: {history[n].rule}") if n in drained and n in history else "")
              for n in names}
    results = list(collector_results(store, reach(catalog, states, history, when)))
    p = plan(catalog, results, states, history, when)
    for a in p.actions:
        if a.action == "drain" and a.node not in drained:
            drained.add(a.node)
            history[a.node] = Record("drain", when, a.rule, a.check, (a.evidence or {}).get("strength") or "node")
            truth.drains.append({"node": a.node, "rule": a.rule, "time": now, "until": None})
        elif a.action == "resume" and a.node in drained:
            drained.discard(a.node)
            for d in reversed(truth.drains):
                if d["node"] == a.node:
                    d["until"] = now
                    break
            history[a.node] = Record("resume", when, a.rule, a.check)
