"""The repeat-offender node handler: rules + past results + Slurm's node states -> drains
and resumes, applied with ``scontrol update`` and recorded in an audit log.

Safety comes first, because a wrong rule could empty a cluster:
- only nodes whose Slurm reason starts with ``hpcml:`` are ours; a node drained or down
  for any other reason is never touched;
- drains are capped: at most ``max_drain_fraction`` of the cluster drained within the
  rolling ``drain_window`` (24 h by default, counted from the audit log over every handler
  run), and never fewer than ``min_nodes_kept`` nodes left up. When a plan asks for more,
  the strongest evidence goes first (a node's own failing checks, a critical Xid, in the
  catalog's rule order, before what jobs said of it) and the rest are deferred, each
  reported and audited, never silently dropped: weak evidence cannot block strong;
- each node's state is read again just before it is changed;
- the audit log is locked for the run, so two handlers never act at once, and it is the
  handler's memory: the drain record says which check must pass again, and results
  older than the node's last drain or resume are never counted again;
- a skipped result (a report that checked nothing: ``unchecked``) is never a pass: it breaks
  a run of passes and never hides a check's last failure.
"""

from __future__ import annotations

import bisect
import fcntl
import getpass
import json
import math
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Iterator

from hpcml.centre.rules import REASON_PREFIX, Catalog, Rule, fmt_window
from hpcml.centre.sources import Reach, Result, ResultSource
from hpcml.cluster import slurm
from hpcml.errors import SlurmError, UsageError
from hpcml.schemas import DRAIN_TYPE, tag

DEFAULT_AUDIT = Path("hpcml-vet-audit.jsonl")
PLAN_SCHEMA = tag("vet.handle", 1)   # `hpcml centre handle --json`; the tag kept from when it was `hpcml vet handle`


@dataclass
class NodeState:
    name: str
    state: str
    reason: str = ""

    @property
    def flags(self) -> set[str]:
        return {f.strip("*~#!%$@^-") for f in self.state.upper().split("+")}

    @property
    def drained(self) -> bool:
        return bool(self.flags & slurm.DRAINED)

    @property
    def ours(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)

    @property
    def available(self) -> bool:
        return not self.drained and not (self.flags & slurm.UNAVAILABLE)


def read_node_states(nodes: str | None = None) -> dict[str, NodeState]:
    """``scontrol show -o node`` as NodeStates (Slurm's "[user@time]" suffix kept)."""
    return {r["NodeName"]: NodeState(r["NodeName"], r.get("State", ""),
                                     "" if r.get("Reason") in (None, "(null)") else r["Reason"])
            for r in slurm.scontrol_show("node", nodes)}


@dataclass
class Action:
    """What the handler decided for one node. Only drain and resume change anything."""

    node: str
    action: str                  # drain | resume | hold | skip | defer (over a cap)
    reason: str = ""
    rule: str | None = None
    check: str | None = None
    evidence: dict = field(default_factory=dict)
    note: str = ""
    status: str = "planned"      # planned | done | failed | dry-run | deferred
    scontrol: str | None = None  # "ok" or the error

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    actions: list[Action]
    total_nodes: int
    available_nodes: int
    time: datetime

    def of(self, kind: str) -> list[Action]:
        return [a for a in self.actions if a.action == kind]

    @property
    def changes(self) -> list[Action]:
        return [a for a in self.actions if a.action in ("drain", "resume")]

    def to_json(self) -> dict:
        return {"schema": PLAN_SCHEMA, "time": self.time.isoformat(), "total_nodes": self.total_nodes,
                "available_nodes": self.available_nodes,
                "actions": [a.to_dict() for a in self.actions]}


# --- history: the audit log ---------------------------------------------------------------

@dataclass
class Record:
    action: str
    time: datetime
    rule: str | None = None
    check: str | None = None
    strength: str = "node"       # of the evidence a drain rested on: a resume needs as strong


def _applied(lines: Iterable[str]) -> Iterator[tuple[str, Record]]:
    """(node, record) of every drain or resume the handler really applied."""
    for line in lines:
        try:
            e = json.loads(line)
            if e.get("dry_run") or e.get("status") != "done" or e.get("action") not in ("drain", "resume"):
                continue
            when = datetime.fromisoformat(e["time"])
            ev = e.get("evidence")
            strength = ev.get("strength") if isinstance(ev, dict) else None
            rec = Record(e["action"], when if when.tzinfo else when.replace(tzinfo=timezone.utc),
                         e.get("rule"), e.get("check"), strength if strength in STRENGTH else "node")
            node = e["node"]
            if not isinstance(node, str):
                continue
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a torn or foreign line must not stop the handler
        yield node, rec


def history(lines: Iterable[str]) -> dict[str, Record]:
    """Node -> the last drain or resume the handler really applied."""
    last: dict[str, Record] = {}
    for node, rec in _applied(lines):
        if node not in last or rec.time >= last[node].time:
            last[node] = rec
    return last


def drained_since(lines: Iterable[str], since: datetime) -> set[str]:
    """Nodes the handler drained at or after ``since`` (resumed since or not: the cap is on
    how much of the cluster one bad rule or bad input can take in a window)."""
    return {node for node, rec in _applied(lines) if rec.action == "drain" and rec.time >= since}


# --- planning -----------------------------------------------------------------------------

#: passes in a row of each check a prolog drained on, before the handler resumes the node
PROLOG_PASSES = 2
#: evidence strengths (``collector.proof``), weakest first; ``none`` is never acted on
STRENGTH = ("none", "job", "node")


def _counted(rule: Rule, hits: list[Result]) -> list[Result]:
    """What of one check's matching results ``rule`` may count: people, not claims. A job
    rule counts proven jobs of at least ``match.users`` users; a check rule counts the
    node's own evidence, and users' reports of their jobs only with ``match.users``, from
    at least that many users."""
    users = {r.user for r in hits if r.user and r.evidence == "job"}
    if rule.match.job is not None:
        return hits if len(users) >= (rule.match.users or 1) else []
    if rule.match.users is None or len(users) < rule.match.users:
        return [r for r in hits if r.evidence == "node"]
    return hits


def _fires(rule: Rule, results: list[Result], now: datetime,
           after: datetime | None) -> tuple[str, list[Result]] | None:
    """The check of ``rule`` with the most countable matching results in the window, if
    enough; ``results`` in time order."""
    start = now - timedelta(seconds=rule.window)
    groups: dict[str, list[Result]] = {}
    jobs: set[str | None] = set()
    for r in results:
        if r.evidence != "none" and start <= r.time <= now and (after is None or r.time > after) \
                and rule.match.matches(r.check, r.type, r.outcome, r.from_job):
            if rule.match.job is not None:              # a job that named the node twice counts once
                if r.job in jobs:
                    continue
                jobs.add(r.job)
            groups.setdefault(r.check, []).append(r)
    counted = {check: _counted(rule, hits) for check, hits in groups.items()}
    best = max(counted.items(), key=lambda kv: len(kv[1]), default=None)
    return best if best and len(best[1]) >= rule.count else None


def _evidence(rule: Rule, hits: list[Result]) -> dict:
    jobs = sorted({r.job for r in hits if r.job})
    return {"strength": max((r.evidence for r in hits), key=STRENGTH.index),
            "results": len(hits), "count": rule.count, "window": fmt_window(rule.window),
            "window_seconds": rule.window, "outcomes": sorted({r.outcome for r in hits}),
            "first": min(r.time for r in hits).isoformat(),
            "last": max(r.time for r in hits).isoformat(), "jobs": jobs[:10],
            **({"users": len({r.user for r in hits if r.user})} if rule.match.job is not None else {})}


def _first_firing(catalog: Catalog, results: list[Result], now: datetime,
                  after: datetime | None):
    ordered = sorted(results, key=lambda r: r.time)     # once, not once per rule
    times = [r.time for r in ordered]
    end = bisect.bisect_right(times, now)
    for rule in catalog.rules:                          # each rule reads its own window only
        begin = bisect.bisect_left(times, now - timedelta(seconds=rule.window))
        if after is not None:
            begin = max(begin, bisect.bisect_right(times, after))
        hit = _fires(rule, ordered[begin:end], now, after)
        if hit:
            return rule, *hit
    return None


def _recheck(catalog: Catalog, node: str, rec: Record | None, results: list[Result],
             now: datetime) -> Action:
    """A node we drained: resume it once the drain's check passed often enough since."""
    prolog = _last_prolog_drain(results, rec.time if rec is not None else None)
    if rec is None or rec.action != "drain" or prolog is not None:
        # the prolog drained it since the handler's last word on it (or the handler never had one)
        return _recheck_prolog(node, results, now, catalog, prolog)
    rule = catalog.rule(rec.rule or "")
    if rule is None or rule.resume_after is None:
        why = "is not in the catalog" if rule is None else "has no resume_after"
        return Action(node, "hold", rule=rec.rule, check=rec.check,
                      note=f"rule '{rec.rule}' {why}; resume it by hand")
    # a pass counts only as evidence as strong as the drain's: a token, or a user's own
    # report, cannot undo what the node's own checks drained
    floor = STRENGTH.index(rec.strength)
    since = [r for r in results if r.time > rec.time and STRENGTH.index(r.evidence) >= max(floor, 1)]
    run: list[Result] = []                  # the passes in a row, up to now
    for r in sorted((r for r in since if r.check == rec.check), key=lambda r: r.time):
        run = [*run, r] if r.outcome == "pass" else []
    passes, need = len(run), rule.resume_after.passes
    evidence = {"passes": passes, "needed": need, "check": rec.check,
                "drained_at": rec.time.isoformat()}
    if passes < need:
        return Action(node, "hold", rule=rule.name, check=rec.check, evidence=evidence,
                      note=f"{rec.check}: {passes}/{need} passes since the drain")
    # users' reports undo a drain as they made it: from as many people as it took (a node's
    # own pass is enough), not one user's job that was still running on the drained node
    people = {r.user for r in run if r.evidence == "job" and r.user}
    least = rule.match.users or 1
    if not any(r.evidence == "node" for r in run) and len(people) < least:
        evidence["users"] = len(people)
        return Action(node, "hold", rule=rule.name, check=rec.check, evidence=evidence,
                      note=f"{rec.check}: {passes} passes since the drain, from {len(people)} of the {least} users "
                           "a resume by users' reports needs")
    again = _first_firing(catalog, since, now, rec.time)
    if again:
        return Action(node, "hold", rule=rule.name, check=rec.check, evidence=evidence,
                      note=f"rule '{again[0].name}' still fires on {again[1]} since the drain")
    return Action(node, "resume", reason=f"{REASON_PREFIX} {rec.check} passed {passes}x after the drain",
                  rule=rule.name, check=rec.check, evidence=evidence)


def _last_prolog_drain(results: list[Result], after: datetime | None) -> Result | None:
    """The newest drain a prolog's own report recorded (node evidence), after ``after``."""
    drains = [r for r in results if r.type == DRAIN_TYPE and r.outcome == "fail" and r.evidence == "node"
              and (after is None or r.time > after)]
    return max(drains, key=lambda r: r.time) if drains else None


def _recheck_prolog(node: str, results: list[Result], now: datetime, catalog: Catalog,
                    last: Result | None) -> Action:
    """A node drained with hpcml's reason by the prolog or health check (``vet --prolog
    --drain --report-to``), whose report records it as a ``DRAIN_TYPE`` result (``last``: the
    newest since the handler's own last record of the node, which an older one cannot
    undo). Resume it once every check that failed in that run passed ``PROLOG_PASSES`` times
    in a row since, in the node's own evidence (the health check runs on drained nodes with
    ``HealthCheckNodeState=ANY``), and no rule fires since."""
    if last is None:
        return Action(node, "hold", note="drained by hpcml but neither the audit log nor the collector has a drain "
                      "since its last record (a prolog without --report-to?); resume it by hand")
    failed = sorted({r.check for r in results if r.time == last.time and r.type != DRAIN_TYPE
                     and r.outcome in ("fail", "error") and r.evidence == "node"})
    since = sorted((r for r in results if r.time > last.time and r.evidence == "node"), key=lambda r: r.time)
    passes = {}
    for check in failed:
        n = 0
        for r in since:
            if r.check == check:
                n = n + 1 if r.outcome == "pass" else 0
        passes[check] = n
    evidence = {"drained_at": last.time.isoformat(), "drained_by": "prolog", "checks": failed, "passes": passes,
                "needed": PROLOG_PASSES}
    short = [c for c in failed if passes[c] < PROLOG_PASSES]
    # another check failing now holds it: one that ran since the drained checks' passes began
    # and failed (not an error: a one-off run that could not finish says nothing of the node)
    streak = [r.time for r in since if r.check in failed and r.outcome == "pass"][-PROLOG_PASSES:]
    newest: dict[str, Result] = {}      # the newest measured result (pass, warn, fail) of every check since the drain
    seen: dict[str, datetime] = {}      # when each check last reported at all, a skip or an error too
    for r in since:
        if r.type != DRAIN_TYPE:
            seen[r.check] = r.time
            if r.outcome in ("pass", "warn", "fail"):   # a skip or an error measures nothing: the failure stands
                newest[r.check] = r
    failing = sorted(c for c, r in newest.items() if r.outcome == "fail" and c not in failed
                     and streak and seen[c] >= streak[0])
    if failed and not short and failing:   # its own checks pass, another fails now: not back yet
        return Action(node, "hold", rule="prolog", check=",".join(failed), evidence={**evidence, "failing": failing},
                      note=f"{', '.join(failing)} failing since the prolog's drain")
    if not failed or short:
        why = (f"{', '.join(f'{c}: {passes[c]}/{PROLOG_PASSES}' for c in short)} passes since the prolog drained it"
               if failed else "the prolog's drain names no check")
        return Action(node, "hold", rule="prolog", check=",".join(failed) or None, evidence=evidence, note=why)
    again = _first_firing(catalog, since, now, last.time)
    if again:
        return Action(node, "hold", rule="prolog", check=",".join(failed), evidence=evidence,
                      note=f"rule '{again[0].name}' still fires on {again[1]} since the prolog's drain")
    return Action(node, "resume", reason=f"{REASON_PREFIX} {', '.join(failed)} passed {PROLOG_PASSES}x after the "
                  "prolog's drain", rule="prolog", check=",".join(failed), evidence=evidence)


def plan(catalog: Catalog, results: Iterable[Result], nodes: Mapping[str, NodeState],
         last: Mapping[str, Record], now: datetime) -> Plan:
    """Decide, without side effects, what to do with every node that has results or is
    drained by us."""
    by_node: dict[str, list[Result]] = {}
    for r in set(results):  # the same report read twice counts once
        by_node.setdefault(r.node, []).append(r)
    actions = []
    for node in sorted(set(by_node) | {n for n, s in nodes.items() if s.ours}):
        res, st, rec = by_node.get(node, []), nodes.get(node), last.get(node)
        if st is not None and st.ours:
            actions.append(_recheck(catalog, node, rec, res, now))
            continue
        hit = _first_firing(catalog, res, now, rec.time if rec else None)
        if not hit:
            continue
        rule, check, hits = hit
        kind = "/".join(sorted({r.type for r in hits}))
        outcome = kind if rule.match.job is not None else "/".join(sorted({r.outcome for r in hits}))
        act = Action(node, "drain", rule.render_reason(node=node, check=check, type=kind,
                                                      outcome=outcome, count=len(hits)),
                     rule.name, check, _evidence(rule, hits))
        if st is None:
            act.action, act.note = "skip", "not a node of this cluster"
        elif not st.available:
            act.action = "skip"
            act.note = f"{st.state} by someone else ({st.reason or 'no reason'}); not touched"
        actions.append(act)
    return Plan(actions, len(nodes), sum(s.available for s in nodes.values()), now)


def strength(catalog: Catalog, a: Action) -> tuple:
    """Sort key, strongest evidence first: a node's own failing checks before what jobs
    said of it, then the catalog's rule order (a site lists its critical rules first), then
    more results before fewer."""
    rule = catalog.rule(a.rule or "")
    index = catalog.rules.index(rule) if rule is not None else len(catalog.rules)
    job = rule is not None and rule.match.job is not None
    return (job, index, -int(a.evidence.get("results", 0)), a.node)


def cap(catalog: Catalog, p: Plan, recent: set[str]) -> None:
    """Keep the strongest drains the caps allow and defer the rest (action ``defer``, with
    why): ``max_drain_fraction`` of the cluster over ``drain_window`` (``recent``: nodes
    drained within it, from the audit log), and ``min_nodes_kept`` nodes up."""
    drains = sorted(p.of("drain"), key=lambda a: strength(catalog, a))
    if not drains:
        return
    allowed = math.floor(catalog.max_drain_fraction * p.total_nodes + 1e-9)
    budget = max(0, allowed - len(recent - {a.node for a in drains}))
    keep_up = max(0, p.available_nodes - catalog.min_nodes_kept)
    n = min(budget, keep_up)
    if budget <= keep_up:
        why = (f"max_drain_fraction {catalog.max_drain_fraction:.0%} of {p.total_nodes} nodes allows {allowed} "
               f"drains in {fmt_window(catalog.drain_window)}; {len(recent)} done in it, {n} stronger planned now")
    else:
        why = f"min_nodes_kept {catalog.min_nodes_kept}: {p.available_nodes} nodes up, {n} stronger drains planned now"
    for a in drains[n:]:
        a.action, a.status, a.note = "defer", "deferred", f"deferred: {why}; drain it by hand if it must go"


# --- acting -------------------------------------------------------------------------------

@contextmanager
def audit_log(path: Path) -> Iterator[IO[str]]:
    """The audit file, open for appending and locked for this run."""
    try:
        f = open(path, "a+", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot open the audit log: {exc.strerror}", file=str(path)) from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError("another hpcml centre handle holds the audit log", file=str(path)) from None
        f.seek(0)
        yield f


def _entry(a: Action, when: datetime, *, dry_run: bool, rules: str,
           before: NodeState | None) -> dict:
    return {"time": when.isoformat(), "node": a.node, "action": a.action,
            "reason": a.reason, "rule": a.rule, "check": a.check, "evidence": a.evidence,
            "dry_run": dry_run, "status": a.status, "scontrol": a.scontrol, "note": a.note,
            "state_before": before.state if before else None,
            "reason_before": before.reason if before else None,
            "rules": rules, "user": getpass.getuser(), "host": socket.gethostname()}


def _still_valid(a: Action, st: NodeState | None) -> str:
    """Why the node changed under us since the plan, or ''."""
    if st is None:
        return "node vanished from Slurm"
    if a.action == "drain" and not st.available:
        return f"now {st.state} ({st.reason or 'no reason'}); not touched"
    if a.action == "resume" and not st.ours:
        return f"no longer drained by hpcml ({st.state}, {st.reason or 'no reason'}); not touched"
    return ""


def apply(p: Plan, audit: IO[str], *, dry_run: bool, rules: str,
          states: Callable[[str], Mapping[str, NodeState]],
          update: Callable[..., None]) -> None:
    """Drain and resume; every change (or would-be change) is one audit line, dated on the
    plan's clock (its ``time`` plus the time elapsed since) so records and results compare."""
    t0 = time.monotonic()
    for a in p.changes:
        before = states(a.node).get(a.node) if not dry_run else None
        if dry_run:
            a.status = "dry-run"
        elif why := _still_valid(a, before):
            a.action, a.note = "skip", why
            continue
        else:
            try:
                if a.action == "drain":
                    update([a.node], state="drain", reason=a.reason)
                else:
                    update([a.node], state="resume")
                a.status, a.scontrol = "done", "ok"
            except SlurmError as exc:
                a.status, a.scontrol = "failed", str(exc)
        when = p.time + timedelta(seconds=time.monotonic() - t0)
        audit.write(json.dumps(_entry(a, when, dry_run=dry_run, rules=rules, before=before)) + "\n")
        audit.flush()


def reach(catalog: Catalog, nodes: Mapping[str, NodeState], last: Mapping[str, Record], now: datetime) -> Reach:
    """How far back a run reads (``sources.Reach``): each kind of result for the longest
    window of the rules that count it, the nodes drained by us since their drain."""
    checks = [r.window for r in catalog.rules if r.match.job is None]
    jobs = [r.window for r in catalog.rules if r.match.job is not None]
    # a node ours with no record of the handler's (the prolog drained it, or the audit log
    # was lost): its drain is somewhere in the collector, read as far back as any rule reads
    unknown = now - timedelta(seconds=catalog.longest_window)
    return Reach(now - timedelta(seconds=max(checks, default=0.0)), now - timedelta(seconds=max(jobs, default=0.0)),
                 {n: last[n].time if n in last else unknown for n, s in nodes.items() if s.ours})


def handle(catalog: Catalog, source: ResultSource, *, audit_path: Path = DEFAULT_AUDIT,
           dry_run: bool = False, now: datetime | None = None,
           states: Callable[..., Mapping[str, NodeState]] | None = None,
           update: Callable[..., None] | None = None) -> Plan:
    """One handler run: plan, cap (deferred drains audited too), apply."""
    now = now or datetime.now(timezone.utc)
    states = states or read_node_states
    update = update or slurm.scontrol_update_node
    with audit_log(Path(audit_path)) as audit:
        lines = audit.readlines()
        last = history(lines)
        recent = drained_since(lines, now - timedelta(seconds=catalog.drain_window))
        nodes = states()
        p = plan(catalog, source.results_since(reach(catalog, nodes, last, now)), nodes, last, now)
        cap(catalog, p, recent)
        for a in p.of("defer"):           # reported and audited, not silently dropped
            audit.write(json.dumps(_entry(a, now, dry_run=dry_run, rules=catalog.source, before=None)) + "\n")
        apply(p, audit, dry_run=dry_run, rules=catalog.source, states=states, update=update)
    return p
