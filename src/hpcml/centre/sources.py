"""Where the node handler reads past vetting results from.

The handler needs only "every result since T", so it depends on this small read
interface rather than on a store: ``JsonDirSource`` reads the report.json files that
``hpcml vet`` leaves behind (validated with the model their writer's document is defined by,
``hpcml.jobmodel.VetReport``), ``StoreSource`` adapts the results collector's store, and with it
the job summaries' node events (a straggler or hang culprit named by a job), as results of
the check ``@job`` whose type is the role.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from hpcml.errors import UsageError
from hpcml.files import JSON_MAX, load_json_bounded
from hpcml.jobmodel import VetReport, validate
from hpcml.schemas import VET_REPORT

JOB_CHECK = "@job"           # the name a job summary's node event goes by (type: the role); ``from_job`` tells it
UNREACHABLE = "unreachable"  # check name and type of a node whose result never came back


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
    #: trusted token, or report files the operator points at), job (a proven user's report
    #: of their own job: counted by people), none (a token only: never acted on)
    evidence: str = "node"


class ResultSource(Protocol):
    def results_since(self, since: datetime) -> Iterable[Result]: ...


def _utc(value) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, timezone.utc)
    if isinstance(value, str):
        t = datetime.fromisoformat(value)
        return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    raise ValueError(f"expected a time, found {value!r}")


def results_of_report(data: dict) -> Iterator[Result]:
    """The results of one ``report.to_json`` document, all dated at the run's start."""
    when = _utc(data["started_at"])
    job = data.get("job_id")
    job = str(job) if job is not None else None
    for node, rep in data.get("nodes", {}).items():
        if not rep.get("reachable", True):
            yield Result(node, UNREACHABLE, UNREACHABLE, "error", when, job)
        for r in rep.get("results", []):
            yield Result(r.get("node", node), r["check"], r["type"], r["outcome"], when, job)


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

    def results_since(self, since: datetime) -> Iterator[Result]:
        for path in self.files():
            try:
                data = load_json_bounded(path, JSON_MAX)
                # a newer hpcml's report is refused, not misread; a bad field named in one line
                validate(VetReport, data, VET_REPORT, str(path))
                results = list(results_of_report(data))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                problem = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
                raise UsageError(f"cannot read results: {problem}", file=str(path)) from None
            yield from (r for r in results if r.time >= since)


class StoreSource:
    """The results collector's store, by URL (``sqlite:///…``, ``postgresql://…``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def results_since(self, since: datetime) -> Iterator[Result]:
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
            yield from collector_results(store, since.timestamp())
        finally:
            store.close()


def collector_results(store, since: float) -> Iterator[Result]:
    """An open collector store's results and job summaries' node events since ``since``
    (epoch seconds), as the handler counts them."""
    for row in store.results_since(since):
        job = row["job"]
        yield Result(node=row["node"], check=row["name"], type=row["type"] or "",
                     outcome=row["outcome"], time=_utc(row["time"]),
                     job=str(job) if job is not None else None,
                     user=row["sender"] if row["evidence"] == "job" else None,
                     evidence=row["evidence"])
    for ev in store.job_events_since(since):     # hpcml run's job summaries
        yield Result(node=ev["node"], check=JOB_CHECK, type=ev["role"], outcome="fail",
                     time=_utc(ev["time"]), job=ev["job"], from_job=True, user=ev["user"],
                     evidence="job")
