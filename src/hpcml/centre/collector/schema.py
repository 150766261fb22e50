"""What the collector accepts: a node's full result, a list of them, or a whole vet report.

Validated with pydantic so a refusal names the field (``results.3.outcome: ...``) in one
line. Sizes are bounded per field so one report cannot bloat the store.

A whole vet report is validated with the model its writer's document is defined by
(``hpcml.jobmodel.VetReport``, closed: an unknown or wrong-typed key is refused, naming it),
then split into node reports. Every ``hpcml.vet/1`` writer wrote the same keys; one of a
newer minor (``/1.N``) is read without the keys it added, a newer major refused. The node
reports (the prolog's, and a large report's pieces, whose results keep every key of the
vet report's) are the collector's own format: keys they do not name are ignored.

A node report's verdict is ``good``, ``bad`` or ``unchecked``: a report must say only what it
measured, so a node on which every check was skipped (or none ran) is ``unchecked``, never
``good``. An older sender's ``good`` that measured nothing is stored as ``unchecked``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal, Optional, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator

from hpcml.centre.summaries import Invalid
from hpcml.errors import UsageError
from hpcml.jobmodel import Text, VetOutcome, VetReport, known, newer_minor, reason

Outcome = VetOutcome
BAD_OUTCOMES = ("fail", "error")
#: a node report's verdict: ``unchecked`` when no check measured anything (unknown is never good)
Verdict = Literal["good", "bad", "unchecked"]
MAX_RESULTS = 10_000
#: node reports, and check results, in one request: what its memory is bounded by (the
#: client sends a large vet report in 512 KiB pieces, well under both)
MAX_REPORTS = 10_000
MAX_RESULTS_PER_REQUEST = 20_000


class CheckResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Text = Field(min_length=1, max_length=255)
    type: Text = Field(default="", max_length=255)
    outcome: Outcome
    value: Union[float, Annotated[Text, Field(max_length=1024)], None] = None
    unit: Optional[Text] = Field(default=None, max_length=64)
    message: Text = Field(default="", max_length=4096)
    duration: float = Field(default=0.0, ge=0)


class NodeReport(BaseModel):
    """One node's full result in one vetting run."""

    model_config = ConfigDict(extra="ignore")

    job_id: Optional[Text] = Field(default=None, max_length=255)
    node: Text = Field(min_length=1, max_length=255)
    time: float = Field(ge=0, description="when the run started, seconds since the epoch")
    protocol: Text = Field(default="", max_length=255)
    verdict: Verdict
    results: list[CheckResult] = Field(default_factory=list, max_length=MAX_RESULTS)
    # reports waiting in the sender's spool when it sent this one (the prolog's); None: not told
    spool_waiting: Optional[int] = Field(default=None, ge=0, le=1_000_000)
    # what the collector proved of it (``proof.prove_report``), never read from the body
    _evidence: str = PrivateAttr("none")
    _sender: Optional[str] = PrivateAttr(None)

    @model_validator(mode="after")
    def _only_what_it_measured(self) -> NodeReport:
        """``good`` needs a measured result (an older prolog sent it for a node whose every
        check was skipped): without one it is ``unchecked``; ``unchecked`` beside a measured
        result contradicts itself and is refused."""
        if measured(r.outcome for r in self.results):
            if self.verdict == "unchecked":
                raise ValueError("verdict: 'unchecked' but a check measured something (only skipped results and "
                                 "errors may go with it)")
        elif self.verdict == "good":
            self.verdict = "unchecked"
        return self

    def proven(self, evidence: str, sender: str | None) -> None:
        self._evidence, self._sender = evidence, sender

    @property
    def evidence(self) -> str:
        """node | job | none: what the node handler may do with it."""
        return self._evidence

    @property
    def sender(self) -> str | None:
        return self._sender


#: the outcomes of a check that measured the node (an ``error``: the check broke; ``skipped``: it did not run)
MEASURED = ("pass", "warn", "fail")


def measured(outcomes: Iterable[object]) -> bool:
    """Whether any result measured something: a pass, warning or failure."""
    return any(o in MEASURED for o in outcomes)


_ONE = TypeAdapter(NodeReport)
_MANY = TypeAdapter(list[NodeReport])


def _bounded(data: dict[str, object]) -> dict[str, object]:
    """A whole report's nodes, refused before anything is validated or expanded when there
    are more of them, or of their results, than one request may hold."""
    verdict = data.get("verdict") or {}
    nodes = data.get("nodes")
    if not isinstance(nodes, dict) or not isinstance(verdict, dict):
        raise Invalid("nodes: expected an object of node reports (and verdict an object)")
    if len(nodes) > MAX_REPORTS:
        raise Invalid(f"nodes: more than {MAX_REPORTS} nodes in one report")
    _count_results(list(nodes.values()))
    return nodes


def split_vet_report(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole ``hpcml vet`` report (``report.to_json``) -> one node report per node: ``bad``
    where the verdict says so or the node gave no result in time, ``unchecked`` where it
    answered but no result of it measured anything, else ``good``."""
    from hpcml.cluster.hostlist import expand
    nodes = _bounded(data)
    verdict = data.get("verdict") or {}
    reasons = verdict.get("reasons") or {}
    if not isinstance(reasons, dict) or len(reasons) > len(nodes):
        raise Invalid("verdict.reasons: expected an object naming at most the report's nodes")
    try:      # bounded before it is expanded: a verdict names at most the report's nodes
        bad = set(expand(str(verdict.get("bad") or ""), limit=max(len(nodes), 1))) | set(reasons)
    except Exception as exc:  # a hostlist that does not parse, or names more
        raise Invalid(f"verdict.bad: {exc}") from None
    protocol = data.get("protocol")
    name = protocol.get("name", "") if isinstance(protocol, dict) else ""
    out = []
    for node, rep in nodes.items():
        rep = rep if isinstance(rep, dict) else {}
        results = rep.get("results")
        checked = isinstance(results, list) and measured(r.get("outcome") if isinstance(r, dict) else None
                                                         for r in results)
        out.append({
            "job_id": data.get("job_id"), "node": node, "time": data.get("started_at"),
            "protocol": name,
            "verdict": "bad" if node in bad or rep.get("reachable") is False else "good" if checked else "unchecked",
            "results": [{**r, "name": r.get("check", r.get("name"))} if isinstance(r, dict) else r
                        for r in results] if isinstance(results, list) else results,
        })
    return out


def _count_results(items: list[Any]) -> None:
    """Refuse a request holding more check results than one may, before they are validated."""
    n = sum(len(r) for i in items if isinstance(i, dict) and isinstance(r := i.get("results"), list))
    if n > MAX_RESULTS_PER_REQUEST:
        raise Invalid(f"results: {n} check results in one request, more than {MAX_RESULTS_PER_REQUEST}")


def _check_tag(data: dict[str, Any]) -> None:
    """A whole report of another kind or of a newer hpcml (``hpcml.vet/2``) is refused."""
    from hpcml.schemas import VET_REPORT, check
    try:
        check(data, VET_REPORT, "body")
    except UsageError as exc:
        raise Invalid(f"schema: {exc.problem}") from None


def vet_report(data: dict[str, object]) -> VetReport:
    """A whole vet report, as its writer defines it: tag, bounds, then every field
    (``ValidationError``); its ``auth`` is the request's, read by ``proof``, not the report's."""
    from hpcml.schemas import VET_REPORT
    _check_tag(data)
    _bounded(data)
    bare = {k: v for k, v in data.items() if k != "auth"}
    return VetReport.model_validate(known(VetReport, bare) if newer_minor(bare, VET_REPORT) else bare)


def parse(body: bytes) -> list[NodeReport]:
    """Body -> node reports, or ``Invalid`` with a reason naming the field."""
    return [r for _, reps in documents(body) for r in reps]


def documents(body: bytes) -> list[tuple[dict[str, Any], list[NodeReport]]]:
    """Body -> its documents, each as received (what its ``auth`` vouches for) with its
    node reports: a whole vet report, one node report, or a list of node reports (each its
    own document). ``Invalid`` with a reason naming the field."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Invalid(f"invalid JSON: {exc}") from None
    try:
        if isinstance(data, dict) and "nodes" in data and "schema" in data:
            vet_report(data)
            return [(data, _MANY.validate_python(split_vet_report(data)))]
        if isinstance(data, list):
            if len(data) > MAX_REPORTS:
                raise Invalid(f"body: more than {MAX_REPORTS} reports in one request")
            _count_results(data)
            reps = _MANY.validate_python(data)
            return [(item, [r]) for item, r in zip(data, reps)]
        if not isinstance(data, dict):
            raise Invalid("body: expected a report, a list of node reports or a vet report")
        return [(data, [_ONE.validate_python(data)])]
    except ValidationError as exc:
        raise Invalid(reason(exc)) from None
