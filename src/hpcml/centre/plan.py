"""What a job's launcher asks the centre before it vets: the fleet's measured failure rate,
what each check costs and catches, and the nodes to avoid (``GET /v1/plan``; issue 68).

Why one document: ``hpcml run --vet auto`` sizes its vetting to the job from these figures
(``hpcml.vet.autoplan``), and every ``hpcml run`` with a collector excludes the nodes on the
avoid list. Both are the centre's measurements, so the collector computes them once every
``TTL`` seconds, not per job start.

- **The rate** is jobs hurt by a node (a proven job naming it culprit, crashed rank or
  straggler) per node-day the jobs held: what a job of N nodes for D days can expect,
  ``rate * N * D`` hurts, measured on the same jobs.
- **A check's recall** is ``hpcml.centre.precision``'s: of the nodes proven jobs named in
  the window, the share the check flagged before the first job it hurt.
- **The avoid list**: nodes proven jobs of at least ``AVOID_USERS`` different proven users
  named in the last ``AVOID_WINDOW`` (one user, or one user's code, never puts a node on
  it). A node leaves it when its last such job is older than the window: jobs that avoid
  it cannot name it again, so an operator who repaired it sooner resumes it by hand and
  drains nothing; the list is advice to the next jobs, not a drain.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Optional

from pydantic import Field

from hpcml.jobmodel import Model, validate
from hpcml.schemas import tag

SCHEMA = tag("centre.plan", 1)
WINDOW = 30 * 86400.0           # the rate's, the durations' and the recall's window
AVOID_WINDOW = 7 * 86400.0
AVOID_USERS = 2
TTL = 600.0                     # seconds the collector keeps a computed plan
HARM_ROLES = ("culprit", "crashed", "straggler")
MAX_AVOID_JOBS = 5              # job ids named per avoided node


class CheckFacts(Model):
    """One check as the fleet measured it: how often it ran, how long, what it caught."""

    name: str
    type: str
    runs: int
    mean_s: float
    recall: Optional[float] = None      # caught / bad nodes (None: no bad node in the window)
    caught: int = 0
    bad_nodes: int = 0


class AvoidNode(Model):
    """A node proven jobs of several users named in the avoid window."""

    node: str
    users: int
    jobs: int
    roles: dict[str, int] = {}
    last: float
    job_ids: list[str] = []


class Plan(Model):
    """``GET /v1/plan``: what the centre measured for the next jobs' vetting."""

    schema_: str = Field(default=SCHEMA, alias="schema", pattern=r"^hpcml\.centre\.plan/1(\.[0-9]+)?$")
    generated: float
    window_s: float
    node_days: float                    # what the window's verified jobs held
    hurt_jobs: int                      # of them, those a node hurt (culprit, crashed, straggler)
    rate_per_node_day: Optional[float] = None
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
    """The nodes proven jobs of ``users`` distinct proven users named since ``now - window``
    (``events``: ``job_events_since``'s rows), most users first."""
    since = now - window
    by_node: dict[str, dict[str, Any]] = defaultdict(lambda: {"users": set(), "jobs": {}, "roles": defaultdict(int),
                                                            "last": 0.0})
    for e in events:
        if e.get("role") not in HARM_ROLES or not isinstance(e.get("time"), (int, float)) or e["time"] < since:
            continue
        d = by_node[str(e["node"])]
        if e.get("user"):
            d["users"].add(e["user"])
        if e["job"] not in d["jobs"]:
            d["jobs"][e["job"]] = e["time"]
        d["roles"][e["role"]] += 1
        d["last"] = max(d["last"], float(e["time"]))
    out = [AvoidNode(node=n, users=len(d["users"]), jobs=len(d["jobs"]), roles=dict(d["roles"]), last=d["last"],
                     job_ids=sorted(d["jobs"], key=lambda j: -d["jobs"][j])[:MAX_AVOID_JOBS])
           for n, d in by_node.items() if len(d["users"]) >= users]
    return sorted(out, key=lambda a: (-a.users, -a.jobs, a.node))


def build(store: Any, now: float | None = None, window: float = WINDOW) -> Plan:
    """The plan from what the collector holds (``store``: the collector's ``Store``)."""
    from hpcml.centre.precision import HORIZON, Evidence, checks
    now = time.time() if now is None else now
    since = now - window
    totals = store.job_totals(since)
    events = store.job_events_since(min(since, now - AVOID_WINDOW) - HORIZON)
    hurt = {e["job"] for e in events if e.get("role") in HARM_ROLES and e["time"] >= since}
    node_days = float(totals.get("node_hours") or 0.0) / 24.0
    ev = Evidence(store.results_since(since - HORIZON), events)
    recall = {c["check"]: c for c in checks(ev, since, now)}
    facts = []
    for d in store.check_durations(since):
        r = recall.get(d["name"]) or {}
        facts.append(CheckFacts(name=d["name"], type=d["type"], runs=d["runs"], mean_s=round(d["mean_s"], 3),
                                recall=r.get("recall"), caught=r.get("caught") or 0, bad_nodes=r.get("bad_nodes") or 0))
    return Plan(generated=now, window_s=window, node_days=round(node_days, 3), hurt_jobs=len(hurt),
                rate_per_node_day=(len(hurt) / node_days) if node_days > 0 else None, checks=facts,
                avoid_window_s=AVOID_WINDOW, avoid_users=AVOID_USERS, avoid=avoid_list(events, now))
