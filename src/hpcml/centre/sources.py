"""Where the node handler reads past vetting results from.

The handler needs only "every result since T" (``Reach``: the check results and the job
events each for their rules' window, the nodes it drained since their drain), so it depends
on this small read interface rather than on a store: ``JsonDirSource`` reads the report.json files that
``hpcml vet`` leaves behind (validated with the model their writer's document is defined by,
``hpcml.jobmodel.VetReport``), ``StoreSource`` adapts the results collector's store, and with it
the job summaries' node events (a straggler or hang culprit named by a job), as results of
the check ``@job`` whose type is the role.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from hpcml.errors import UsageError
from hpcml.files import JSON_MAX, load_json_bounded_stat
from hpcml.jobmodel import VetReport, validate
from hpcml.schemas import VET_REPORT

JOB_CHECK = "@job"           # the name a job summary's node event goes by (type: the role); ``from_job`` tells it
UNREACHABLE = "unreachable"  # check name and type of a node whose result never came back

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """One check's outcome on one node at one time; ``outcome`` is an Outcome value."""

    node: str
    check: str
    type: str
    outcome: str
    time: datetime
    job: str | None = None
    from_job: bool = False        # a job summary's node event (check JOB_CHECK, type: the role)
    user: str | None = None       # whose job it was (job events, users' vetting reports)
    #: how strong it is (``collector.proof``): node (root's or SlurmUser's on the node, a
    #: trusted token, or report files owned by root, SlurmUser or the operator), job (a proven user's report
    #: of their own job: counted by people), none (a token only: never acted on)
    evidence: str = "node"


@dataclass(frozen=True)
class Reach:
    """How far back a handler run reads: every node's check results since ``checks`` (the
    longest check rule's window), its job events since ``jobs`` (the longest job rule's), and
    everything of each node in ``older`` since its time there (a node drained by us: its
    passes since the drain count towards the resume). The fleet is read for the windows
    alone: one node drained for weeks does not make every run read weeks of every node."""

    checks: datetime
    jobs: datetime
    older: Mapping[str, datetime] = field(default_factory=dict)

    @classmethod
    def of(cls, since: datetime | Reach) -> Reach:
        return since if isinstance(since, Reach) else cls(since, since)

    def wants(self, node: str, time: datetime, from_job: bool) -> bool:
        if time >= (self.jobs if from_job else self.checks):
            return True
        at = self.older.get(node)
        return at is not None and time >= at


class ResultSource(Protocol):
    def results_since(self, since: datetime | Reach) -> Iterable[Result]:
        """Every result since ``since``, or within the ``Reach``."""
        ...


def _utc(value) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, timezone.utc)
    if isinstance(value, str):
        t = datetime.fromisoformat(value)
        return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    raise ValueError(f"expected a time, found {value!r}")


def results_of_report(data: dict, evidence: str = "node") -> Iterator[Result]:
    """The results of one ``report.to_json`` document, all dated at the run's start, each
    the result of the node it is filed under (a result that names another node is dropped:
    the collector's door files them the same way)."""
    when = _utc(data["started_at"])
    job = data.get("job_id")
    job = str(job) if job is not None else None
    for node, rep in data.get("nodes", {}).items():
        if not rep.get("reachable", True):
            yield Result(node, UNREACHABLE, UNREACHABLE, "error", when, job, evidence=evidence)
        for r in rep.get("results", []):
            if r.get("node", node) != node:
                log.warning(f"a result of {node!r} names node {r.get('node')!r}: not counted")
                continue
            yield Result(node, r["check"], r["type"], r["outcome"], when, job, evidence=evidence)


def file_evidence(st: os.stat_result, trusted: frozenset[int]) -> str:
    """How strong a report file is: the node's own evidence where its owner is trusted (root,
    the operator running the handler, SlurmUser: who runs ``hpcml vet`` in a prolog) and no
    one else may write it; else none, never acted on (a user's file in a shared directory
    is the user's say-so, proven by nothing)."""
    if st.st_uid in trusted and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "node"
    return "none"


def trusted_owners() -> frozenset[int]:
    """root, this process's user, and SlurmUser's account where it exists."""
    import pwd
    uids = {0, os.geteuid()}
    try:
        uids.add(pwd.getpwnam("slurm").pw_uid)
    except KeyError:
        pass
    return frozenset(uids)


class JsonDirSource:
    """Every ``report.json`` under the given directories (or the given files)."""

    def __init__(self, paths: Sequence[str | Path]) -> None:
        self.paths = [Path(p) for p in paths]

    def files(self) -> list[Path]:
        out: list[Path] = []
        for p in self.paths:
            if p.is_file():
                out.append(p)
            elif p.is_dir():
                out += sorted(p.rglob("report.json"))
            else:
                raise UsageError("no such file or directory", file=str(p))
        return out

    def results_since(self, since: datetime | Reach) -> Iterator[Result]:
        reach = Reach.of(since)
        trusted = trusted_owners()
        for path in self.files():
            try:
                data, st = load_json_bounded_stat(path, JSON_MAX)
                # a newer hpcml's report is refused, not misread; a bad field named in one line
                validate(VetReport, data, VET_REPORT, str(path))
                evidence = file_evidence(st, trusted)
                if evidence == "none":
                    log.warning(f"{path}: owned by uid {st.st_uid} or writable by others: its results count for "
                                "nothing (only root's, SlurmUser's or this user's own report files are evidence)")
                results = list(results_of_report(data, evidence))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                problem = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
                raise UsageError(f"cannot read results: {problem}", file=str(path)) from None
            yield from (r for r in results if reach.wants(r.node, r.time, r.from_job))


class StoreSource:
    """The results collector's store, by URL (``sqlite:///…``, ``postgresql://…``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def results_since(self, since: datetime | Reach) -> Iterator[Result]:
        try:
            from hpcml.centre.collector.store import StoreError, open_store
        except ImportError:
            raise UsageError("the results collector is not available in this version",
                             key="db") from None
        try:
            store = open_store(self.url)
        except (StoreError, ValueError) as exc:
            raise UsageError(f"cannot open the results store: {exc}", key="db") from None
        try:
            yield from collector_results(store, Reach.of(since))
        finally:
            store.close()


def collector_results(store, reach: Reach) -> Iterator[Result]:
    """An open collector store's results and job summaries' node events within ``reach``,
    as the handler counts them."""
    checks = reach.checks.timestamp()
    rows = store.results_since(checks)
    older = {n: t.timestamp() for n, t in reach.older.items() if t < reach.checks}
    if older:                                     # the drained nodes' own, from before the window
        rows = [*(r for r in store.results_since(min(older.values()), nodes=sorted(older))
                  if older[r["node"]] <= r["time"] < checks), *rows]
    for row in rows:
        job = row["job"]
        yield Result(node=row["node"], check=row["name"], type=row["type"] or "",
                     outcome=row["outcome"], time=_utc(row["time"]),
                     job=str(job) if job is not None else None,
                     user=row["sender"] if row["evidence"] == "job" else None,
                     evidence=row["evidence"])
    jobs = min([reach.jobs, *reach.older.values()]).timestamp()
    for ev in store.job_events_since(jobs):     # hpcml run's job summaries
        when = _utc(ev["time"])
        if reach.wants(ev["node"], when, True):
            yield Result(node=ev["node"], check=JOB_CHECK, type=ev["role"], outcome="fail",
                         time=when, job=ev["job"], from_job=True, user=ev["user"], evidence="job")
