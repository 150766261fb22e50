"""What a job's launcher asks the centre before it vets: the fleet's measured failure rate,
what each check costs and catches, and the nodes to avoid (``GET /v1/plan``; issue 68).

Why one document: ``hpcml run --vet auto`` sizes its vetting to the job from these figures
(``hpcml.vet.autoplan``), and every ``hpcml run --vet`` with a collector leaves out the
nodes on the avoid list. Both are the centre's measurements, so the collector computes them
at most once every ``TTL`` seconds, not per job start.

A node **hurt** a job when a proven job named it its hang culprit or a straggler
(``NODE_ROLES``): evidence about the node. A crashed rank is not counted: any user's bug
crashes a rank, on whatever node it ran.

- **The rate** is jobs a node hurt per node-day the window's verified jobs held: what a job of
  N nodes for D days can expect, ``rate * N * D`` hurts, measured on the same jobs.
- **A check's duration** is its mean over the nodes' own reports (``node`` evidence: root's or
  SlurmUser's on the node, a trusted token's); for a check none of those measured, the
  median of each person's mean over users' reports of their own jobs, where at least
  ``DURATION_USERS`` people ran it: one user's say-so must not price a check for every job
  (or add checks to the list).
- **A check's recall** is the share of the bad nodes it ran on (within ``HORIZON`` before the
  first job a node hurt) that it flagged there: read from those few nodes' results only, the
  nodes' own reports, else users' reports of their own jobs where ``RECALL_USERS`` people
  say so (one user's "pass" or "fail" moves no check's recall).
- **The avoid list**: nodes proven jobs of at least ``AVOID_USERS`` different proven users
  named in the last ``AVOID_WINDOW`` (one user, or one user's code, never puts a node on
  it). A node leaves it when its last such job is older than the window: jobs that avoid it
  cannot name it again. It is advice to the next jobs, not a drain. No job ids: a job token
  reads it, and a site may hide jobs from other users (Slurm's ``PrivateData=jobs``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Optional

from pydantic import Field

from hpcml.centre.precision import HORIZON
from hpcml.jobmodel import Model, validate
from hpcml.schemas import tag

SCHEMA = tag("centre.plan", 1)
WINDOW = 30 * 86400.0           # the rate's, the durations' and the recall's window
RECALL_USERS = 2                # people whose own jobs' results on a bad node count without the node's own
AVOID_WINDOW = 7 * 86400.0
AVOID_USERS = 2
TTL = 600.0                     # seconds the collector keeps a computed plan
NODE_ROLES = ("culprit", "straggler")


class CheckFacts(Model):
    """One check as the fleet measured it: how often it ran, how long, what it caught."""

    name: str
    type: str
    runs: int = Field(ge=0)
    mean_s: float = Field(ge=0, le=86400)
    recall: Optional[float] = Field(default=None, ge=0, le=1)   # caught / bad_nodes (None: it ran on none)
    caught: int = Field(default=0, ge=0)
    bad_nodes: int = Field(default=0, ge=0)     # bad nodes it ran on before the first job they hurt


class AvoidNode(Model):
    """A node proven jobs of several users named in the avoid window."""

    node: str
    users: int = Field(ge=0)
    jobs: int = Field(ge=0)
    roles: dict[str, int] = {}
    last: float


class Plan(Model):
    """``GET /v1/plan``: what the centre measured for the next jobs' vetting."""

    schema_: str = Field(default=SCHEMA, alias="schema", pattern=r"^hpcml\.centre\.plan/1(\.[0-9]+)?$")
    generated: float
    window_s: float
    node_days: float = Field(ge=0)      # what the window's verified jobs held
    hurt_jobs: int = Field(ge=0)        # of them, those a node hurt (culprit, straggler)
    rate_per_node_day: Optional[float] = Field(default=None, ge=0)
    checks: list[CheckFacts] = []
    avoid_window_s: float = AVOID_WINDOW
    avoid_users: int = AVOID_USERS
    avoid: list[AvoidNode] = []

    @classmethod
    def from_doc(cls, doc: Any, source: str) -> Plan:
        """A plan from the collector's answer; a UsageError names ``source`` and the key."""
        return validate(cls, doc, SCHEMA, source)


def avoid_list(events: list[dict[str, Any]], now: float, window: float = AVOID_WINDOW,
               users: int = AVOID_USERS) -> list[AvoidNode]:
    """The nodes proven jobs of ``users`` distinct proven users named (``NODE_ROLES``) since
    ``now - window`` (``events``: ``job_events_since``'s rows), worst first."""
    since = now - window
    by_node: dict[str, dict[str, Any]] = defaultdict(lambda: {"users": set(), "jobs": set(), "roles": defaultdict(int),
                                                            "last": 0.0})
    for e in events:
        if e.get("role") not in NODE_ROLES or not isinstance(e.get("time"), (int, float)) or e["time"] < since:
            continue
        d = by_node[str(e["node"])]
        if e.get("user"):
            d["users"].add(e["user"])
        d["jobs"].add(e["job"])
        d["roles"][e["role"]] += 1
        d["last"] = max(d["last"], float(e["time"]))
    out = [AvoidNode(node=n, users=len(d["users"]), jobs=len(d["jobs"]), roles=dict(d["roles"]), last=d["last"])
           for n, d in by_node.items() if len(d["users"]) >= users]
    return sorted(out, key=lambda a: (-a.users, -a.jobs, a.node))


def recall(store: Any, events: list[dict[str, Any]], since: float, horizon: float = HORIZON) -> dict[str, dict[str, int]]:
    """Per check: the bad nodes (named by a proven job since ``since``) it ran on within
    ``horizon`` before the first job they hurt, and of them those it flagged (fail, error)
    there. Only the bad nodes' results are read (proven reports only)."""
    first: dict[str, float] = {}
    for e in events:
        if e.get("role") in NODE_ROLES and isinstance(e.get("time"), (int, float)) and e["time"] >= since:
            node = str(e["node"])
            first[node] = min(first.get(node, e["time"]), e["time"])
    # per (check, node): who said it ran there, and who said it flagged the node: the node's
    # own reports ("node") count alone, users' reports of their own jobs where RECALL_USERS agree
    ran: dict[tuple[str, str], set[str]] = defaultdict(set)
    caught: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in store.results_of(sorted(first), since - horizon):
        node, t = str(r["node"]), r["time"]
        if r.get("evidence") == "none" or r.get("outcome") == "skipped" or not first[node] - horizon <= t <= first[node]:
            continue
        who = "node" if r.get("evidence") == "node" else f"user {r.get('sender')}"
        ran[(r["name"], node)].add(who)
        if r.get("outcome") in ("fail", "error"):
            caught[(r["name"], node)].add(who)

    def said(by: set[str]) -> bool:
        return "node" in by or len(by) >= RECALL_USERS

    out: dict[str, dict[str, int]] = {}
    for (name, node), by in ran.items():
        if said(by):
            got = out.setdefault(name, {"ran": 0, "caught": 0})
            got["ran"] += 1
            got["caught"] += said(caught[(name, node)])
    return out


def build(store: Any, now: float | None = None, window: float = WINDOW) -> Plan:
    """The plan from what the collector holds (``store``: the collector's ``Store``)."""
    now = time.time() if now is None else now
    since = now - window
    totals = store.job_totals(since)
    events = store.job_events_since(min(since, now - AVOID_WINDOW))
    hurt = {e["job"] for e in events if e.get("role") in NODE_ROLES and e["time"] >= since}
    node_days = float(totals.get("node_hours") or 0.0) / 24.0
    measured = recall(store, events, since)
    facts = []
    for d in store.check_durations(since):
        r = measured.get(d["name"]) or {"ran": 0, "caught": 0}
        facts.append(CheckFacts(name=d["name"], type=d["type"], runs=d["runs"], mean_s=round(min(d["mean_s"], 86400), 3),
                                recall=round(r["caught"] / r["ran"], 4) if r["ran"] else None, caught=r["caught"],
                                bad_nodes=r["ran"]))
    return Plan(generated=now, window_s=window, node_days=round(node_days, 3), hurt_jobs=len(hurt),
                rate_per_node_day=(len(hurt) / node_days) if node_days > 0 else None, checks=facts,
                avoid_window_s=AVOID_WINDOW, avoid_users=AVOID_USERS, avoid=avoid_list(events, now))
