"""What the collector accepts at ``POST /v1/jobs``: job summaries (``hpcml.job.summary/1``).

``hpcml run`` writes one per attempt (``hpcml.run.summary``); this is the collector's side
of that contract, validated with pydantic so that a refusal names the field in one line,
with every string and list bounded so that one summary cannot bloat the store. A summary
of an unknown schema major is refused, never half read.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal, Optional

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator

from hpcml.errors import UsageError
from hpcml.schemas import check, tag
from hpcml.vet.fleet.collector.schema import Invalid, Text, _reason

SUMMARY_SCHEMA = tag("job.summary", 1)
MAX_SUMMARIES = 10_000             # per request
MAX_NODES = 100_000                # per job
#: the roles a job names a node in, each with the summary's list of them
FIELDS = {"excluded": "excluded", "straggler": "stragglers", "culprit": "culprits", "lost": "lost",
          "crashed": "crashed"}
ROLES = tuple(FIELDS)
GPUS_PER_NODE = 64                 # above this a summary's GPU count is not a job's
OUTCOMES = ("completed", "failed", "hung", "aborted", "requeued", "running")

BIG = 2**31 - 1                    # PostgreSQL's INTEGER
LOTS = 1e12                        # hours, seconds, throughput: anything above is not a job's
FUTURE_S = 86400                   # a job may end up to a day ahead of the collector's clock


def _plain(text: str) -> str:
    """Names are printed in terminals and pages: no control characters at all."""
    if not text.isprintable():
        raise ValueError("control characters not allowed")
    return text


Name = Annotated[Text, AfterValidator(_plain), Field(min_length=1, max_length=255)]
Short = Annotated[Text, AfterValidator(_plain), Field(max_length=255)]
Reason = Annotated[Text, AfterValidator(_plain), Field(max_length=1024)]
Number = Annotated[float, Field(ge=0, le=LOTS, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=BIG)]
Time = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class NodeEvent(BaseModel):
    """A node the job names: excluded by vetting, a straggler, a hang culprit, lost, or the
    node of a rank that crashed."""

    model_config = ConfigDict(extra="ignore")

    node: Name
    rank: Optional[Count] = None
    attempt: int = Field(default=0, ge=0, le=1_000_000)
    detail: Reason = ""


class Gpu(BaseModel):
    model_config = ConfigDict(extra="ignore")

    score: Optional[Annotated[float, Field(ge=0, le=1)]] = None
    bound: Optional[Short] = None


class Vetting(BaseModel):
    """One node's vetting by the job's ``hpcml run --vet``: what the fleet report shows as
    the node's vetting history (never what the node handler's vetting rules count: a job's
    vetting is its sender's word, and only its exclusions are job evidence)."""

    model_config = ConfigDict(extra="ignore")

    node: Name
    attempt: int = Field(default=0, ge=0, le=1_000_000)
    time: Time
    verdict: Literal["good", "bad"]
    failing: list[Short] = Field(default_factory=list, max_length=64)


class Throughput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    median: Number
    unit: Short = ""


class Proven(BaseModel):
    """What the collector proved about a summary's sender (``proof.Verifier``); never read
    from the summary itself."""

    how: Literal["munge", "token", "trusted", "none"] = "none"
    user: Optional[str] = None
    uid: Optional[int] = None
    verified: bool = False


class JobSummary(BaseModel):
    """One attempt's summary; ``(cluster, job_id, attempt)`` is its identity."""

    model_config = ConfigDict(extra="ignore")
    _proof: Proven = PrivateAttr(default_factory=Proven)

    @property
    def proof(self) -> Proven:
        return self._proof

    def proven(self, proof: Proven) -> JobSummary:
        self._proof = proof
        return self

    schema_: str = Field(alias="schema")        # checked by parse_job_items before the fields
    cluster: Short = ""
    job_id: Name
    attempt: int = Field(ge=0, le=1_000_000)
    requeues: Optional[Count] = None            # Slurm's restart count this attempt ran under
    user: Optional[Short] = None
    account: Optional[Short] = None
    partition: Optional[Short] = None
    started: Time
    ended: Optional[Time] = None
    duration_s: Optional[Number] = None
    exit_code: Optional[int] = Field(default=None, ge=-1024, le=1024)
    outcome: Literal["completed", "failed", "hung", "aborted", "requeued", "running"]
    nodes: list[Name] = Field(default_factory=list, max_length=MAX_NODES)
    ntasks: Count = 0
    gpus: Count = 0
    excluded: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    stragglers: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    culprits: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    lost: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    crashed: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    vetting: list[Vetting] = Field(default_factory=list, max_length=MAX_NODES)
    hangs: Count = 0                            # hangs over the attempts, a recovered one too
    gpu: Gpu = Gpu()
    throughput: Optional[Throughput] = None
    attempts: int = Field(default=1, ge=1, le=1_000_000)
    time_lost_s: Optional[Number] = None
    node_hours: Number = 0.0
    gpu_hours: Number = 0.0
    gpu_hours_lost: Optional[Number] = None

    @model_validator(mode="after")
    def _consistent(self) -> JobSummary:
        if self.ended is not None and self.ended < self.started:
            raise ValueError(f"ended: {self.ended} is before started ({self.started})")
        if max(self.started, self.ended or 0) > time.time() + FUTURE_S:
            raise ValueError("started/ended: more than a day in the future")
        held = set(self.nodes)
        for role, e in self.events():
            if e.node not in held:          # a summary names only nodes its job held
                raise ValueError(f"{role}: node {e.node!r} is not one of the job's nodes")
        until = (self.ended if self.ended is not None else time.time()) + 600
        for v in self.vetting:
            if v.node not in held:
                raise ValueError(f"vetting: node {v.node!r} is not one of the job's nodes")
            if not self.started - 86400 <= v.time <= until:
                raise ValueError(f"vetting: node {v.node!r} vetted at {v.time:.0f}, outside the job's time")
        self._plausible()
        return self

    def _plausible(self) -> None:
        """Totals a job can have had: no more GPUs than its nodes hold, no more hours than
        its nodes and GPUs were held for (a forged 1e11 GPU-hours would own every total)."""
        if self.gpus > GPUS_PER_NODE * max(len(self.nodes), 1):
            raise ValueError(f"gpus: {self.gpus} on {len(self.nodes)} nodes")
        span_h = ((self.ended if self.ended is not None else time.time()) - self.started) / 3600
        slack = 1.01 * span_h + 0.01
        if self.duration_s is not None and self.duration_s > span_h * 3600 * 1.01 + 60:
            raise ValueError(f"duration_s: {self.duration_s:g} s is longer than the job ran")
        if self.node_hours > slack * max(len(self.nodes), 1):
            raise ValueError(f"node_hours: {self.node_hours:g} for {len(self.nodes)} nodes over {span_h:.3g} h")
        for key in ("gpu_hours", "gpu_hours_lost"):
            value = getattr(self, key)
            if value is not None and value > slack * max(self.gpus, 0):
                raise ValueError(f"{key}: {value:g} for {self.gpus} GPUs over {span_h:.3g} h")

    @property
    def time(self) -> float:
        """When the job's outcome is dated: its end, else its start."""
        return self.ended if self.ended is not None else self.started

    def events(self) -> list[tuple[str, NodeEvent]]:
        """(role, event) for every node the job names."""
        return [(role, e) for role, name in FIELDS.items() for e in getattr(self, name)]


_MANY = TypeAdapter(list[JobSummary])


def parse_job_items(body: bytes) -> tuple[list[dict], list[JobSummary]]:
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
    try:
        return items, _MANY.validate_python(items)
    except ValidationError as exc:
        reason = _reason(exc)
        return_reason = reason[2:] if isinstance(data, dict) and reason.startswith("0.") else reason
        raise Invalid(return_reason) from None
