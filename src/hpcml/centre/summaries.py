"""What the collector accepts at ``POST /v1/jobs``: job summaries (``hpcml.job.summary/1``).

``hpcml run`` writes one per attempt (``hpcml.run.summary``) with the model defined once in
``hpcml.jobmodel``; the collector validates with that same model (closed: a renamed or
unknown field is refused, naming it, not silently dropped), every string and list bounded
so that one summary cannot bloat the store. A summary of an unknown schema major is
refused, never half read; one of a newer minor is read without the keys it added.
"""

from __future__ import annotations

from typing import Literal, Optional

import orjson
from pydantic import BaseModel, PrivateAttr, TypeAdapter, ValidationError

from hpcml.errors import UsageError
from hpcml.jobmodel import (
    GPUS_PER_NODE,
    MAX_NODES,
    OUTCOMES,
    ROLE_FIELDS,
    SUMMARY_SCHEMA,
    JobSummary,
    NodeEvent,
    NodeVetting,
    known,
    newer_minor,
    reason,
)
from hpcml.schemas import check

MAX_SUMMARIES = 10_000             # per request
FIELDS = ROLE_FIELDS
ROLES = tuple(FIELDS)

__all__ = ["FIELDS", "GPUS_PER_NODE", "MAX_NODES", "OUTCOMES", "ROLES", "SUMMARY_SCHEMA", "NodeEvent", "NodeVetting",
           "Proven", "Received", "parse_job_items"]


class Invalid(UsageError, ValueError):
    """A refused document (bad input, exit 2); ``str()`` is the one-line reason the
    collector sends back with the 400."""


class Proven(BaseModel):
    """What the collector proved about a summary's sender (``proof.Verifier``); never read
    from the summary itself."""

    how: Literal["munge", "token", "trusted", "none"] = "none"
    user: Optional[str] = None
    uid: Optional[int] = None
    verified: bool = False


class Received(JobSummary):
    """A summary as the collector holds it: the model, and what was proven of its sender."""

    _proof: Proven = PrivateAttr(default_factory=Proven)

    @property
    def proof(self) -> Proven:
        return self._proof

    def proven(self, proof: Proven) -> Received:
        self._proof = proof
        return self


_MANY = TypeAdapter(list[Received])


def parse_job_items(body: bytes) -> tuple[list[dict], list[Received]]:
    """Body (one summary or a list) -> (the summaries as received, validated), or
    ``Invalid`` naming the field. The received form is what a MUNGE credential's digest covers."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Invalid(f"invalid JSON: {exc}") from None
    items = data if isinstance(data, list) else [data]
    if len(items) > MAX_SUMMARIES:
        raise Invalid(f"body: more than {MAX_SUMMARIES} job summaries in one request")
    if not all(isinstance(i, dict) for i in items):
        raise Invalid("body: expected a job summary object or a list of them")
    for i, item in enumerate(items):              # another kind or major: refused before its fields
        try:
            check(item, SUMMARY_SCHEMA, "body")
        except UsageError as exc:
            raise Invalid(f"{'' if isinstance(data, dict) else f'{i}.'}schema: {exc.problem}") from None
    # the credential (``auth``) is the request's, not the summary's: proof.Verifier reads it
    bare = [{k: v for k, v in i.items() if k != "auth"} for i in items]
    bare = [known(Received, i) if newer_minor(i, SUMMARY_SCHEMA) else i for i in bare]
    try:
        return items, _MANY.validate_python(bare)
    except ValidationError as exc:
        why = reason(exc)
        raise Invalid(why[2:] if isinstance(data, dict) and why.startswith("0.") else why) from None
