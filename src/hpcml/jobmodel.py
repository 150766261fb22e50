"""The job as a typed model: run.json (``hpcml.run/1``), the centre's job summary
(``hpcml.job.summary/1``) and the vetting report (``hpcml.vet/1``), defined once.

Why one module: the launcher writes run.json, the watch, recovery, report and summary read
it, and the collector receives the summary built from it; ``hpcml vet`` writes report.json,
which ``hpcml run``'s summary, the node handler and the collector read. Four hand-kept definitions (a
dict here, a pydantic model there, a JSON Schema, a test fixture) drift; a field renamed in
one was silently dropped by another. Here each document is a pydantic model, closed
(``extra="forbid"``), and its JSON Schema under ``hpcml/schemas`` is generated from it
(``python -m hpcml.jobmodel --write-schemas``; ``tests/test_jobmodel.py`` fails when the
file and the model differ). A reader validates with the same model the writer used.

Compatibility: a minor (``/1.N``) may only add keys (``hpcml.schemas``). A document of a
newer minor than this hpcml's is read with the keys it does not know dropped; of its own
minor or older, an unknown key is refused in one line naming it. Models are written with
``exclude_unset``: a key is in the file when the writer set it (None included), as it was
when run.json was a dict. The vet report is the exception: its writer builds it by hand
from ``hpcml.vet.model``'s dataclasses (see ``VetDocument``), and tests hold the two to
one set of fields.

A top-level module (pydantic and ``hpcml.schemas`` only), so that ``run``, ``vet`` and the
collector all use it without importing each other.
"""

from __future__ import annotations

import json
import time
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from hpcml.errors import UsageError
from hpcml.schemas import VET_REPORT, check, parse, tag

RUN_SCHEMA = tag("run", 1)
SUMMARY_SCHEMA = tag("job.summary", 1)
MAX_RUN_JSON = 256 << 20         # a run.json of many attempts, each with its timeline (files.JSON_MAX)
#: keys older hpcml versions wrote into run.json and this one no longer does: dropped on reading
LEGACY_RUN_KEYS = frozenset({"superseded"})
FaultKind = Literal["crash", "hang", "straggler", "node"]
#: what the live watch's timeline holds: the faults, and a rank slowed by its node's CPUs (not its fault)
EventKind = Literal["crash", "hang", "straggler", "node", "contention"]


def _no_nul(text: str) -> str:
    # PostgreSQL's text cannot hold NUL; refused for every reader alike
    if "\x00" in text:
        raise ValueError("NUL character not allowed")
    return text


Text = Annotated[str, AfterValidator(_no_nul)]


class Model(BaseModel):
    """Closed, and checked on assignment: the launcher fills a record field by field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)

    def to_json(self) -> dict[str, Any]:
        """The fields set (None included): the document as its writer made it; a document's
        schema tag first, always. Python values (an infinite score stays ``inf``, which
        ``dumps`` writes as the standard library's JSON does)."""
        out = self.model_dump(exclude_unset=True, by_alias=True)
        tagged = getattr(self, "schema_", None)
        return {"schema": tagged, **{k: v for k, v in out.items() if k != "schema"}} if tagged else out


# ---------------------------------------------------------------------------- run.json

class Launcher(Model):
    """The ``hpcml run`` process that writes run.json (``hpcml.owner``'s identity): no
    ``ended`` while it is gone means it was killed."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)

    pid: int
    host: str
    created: Optional[float] = None
    boot_id: Optional[str] = None
    pid_ns: Optional[int] = None


class Who(Model):
    """The job's owner and where it ran, from Slurm's environment."""

    user: Optional[str] = None
    account: Optional[str] = None
    partition: Optional[str] = None
    cluster: str = ""


class FarmTaskRef(Model):
    """The ``hpcml farm`` task attempt this run is in: once the farm ended it
    (FARM/ends/ID.ATTEMPT), the launcher is gone, whatever the farm's Slurm job does."""

    farm: str
    id: int
    attempt: int


class VetTier(Model):
    """One way ``--vet auto`` could vet, priced: the checks, their seconds, the share of bad
    nodes they catch, and GPU-hours (node-hours without GPUs) it costs and saves."""

    name: str                               # none | quick (the prolog's fast checks) | full
    checks: list[str] = []
    seconds: float = 0.0
    catch: float = 0.0
    catch_source: str = ""
    cost_h: float = 0.0
    saved_h: float = 0.0
    net_h: float = 0.0


class VetAuto(Model):
    """``--vet auto``'s model and its numbers (``hpcml.vet.autoplan``): each figure with
    where it came from (the collector's measurement, or a documented default)."""

    protocol: str
    nodes: int
    gpus_per_node: int                      # 0: costs in node-hours
    hours: float                            # the job's time left when it vetted
    hours_source: str
    rate_per_node_day: float                # jobs hurt by a node, per node-day held
    rate_source: str
    loss_h: float                           # wall hours one hurt costs the whole job
    loss_source: str
    expected_hurts: float
    unit: str                               # GPU-h | node-h
    tiers: list[VetTier] = []
    chosen: str
    note: str = ""                          # why the choice is not the model's best, when it is not


class Vetting(Model):
    """``--vet``: the decision and each node's verdict."""

    decision: str
    good: list[str] = []
    bad: list[str] = []
    reasons: dict[str, list[str]] = {}
    duration_s: Optional[float] = None
    auto: Optional[VetAuto] = None          # --vet auto: how much vetting the job was worth
    avoided: list[str] = []                 # on the centre's avoid list: left out (advice: not bad, not excluded)
    cluster_fault: Optional[str] = None     # vetting failed for the cluster's reason (Slurm, MUNGE): no node judged


class FirstFailure(Model):
    """The rank that failed first, by when its command ended."""

    rank: Optional[int] = None
    exit_code: int
    node: Optional[str] = None
    end: Optional[float] = None
    failed_ranks: int = 1
    signal: Optional[Annotated[str, Field(pattern=r"^SIG[A-Z0-9+]+$")]] = None   # what killed it, as the recorder saw
    oom_killer: Optional[bool] = None     # its cgroup's OOM-kill count rose as SIGKILL came (hpcml.observe.oom)


class Requeued(Model):
    """The attempt ended in a requeue, not a failure: by ``hpcml ckpt`` after its final
    checkpoint committed (step, signal, checkpoint, time), or by ``slurm`` (restart_count)."""

    by: Literal["hpcml ckpt", "slurm"]
    step: Optional[int] = None
    signal: Optional[str] = None
    checkpoint: Optional[str] = None
    time: Optional[float] = None
    restart_count: Optional[int] = None


class LostNode(Model):
    state: str
    seen: float


class Culprit(Model):
    rank: int
    node: Optional[str] = None
    where: Optional[str] = None
    why: str


class HangVerdict(Model):
    method: Literal["flight-recorder", "progress", "stacks", "none"]
    culprits: list[Culprit]
    blocked: list[int]
    note: str = ""


class Hang(Model):
    """The hang the watch detected (``--hang-timeout``): ``began`` is the last step any rank
    completed."""

    began: float
    detected: float
    timeout: float
    ranks: int
    stacks: Optional[int] = None
    named: Optional[float] = None
    action: Optional[Literal["stop", "report", "ended"]] = None
    verdict: Optional[HangVerdict] = None


class Event(Model):
    """What the live watch saw, in order: a crash, a hang, a straggler, a lost node, with
    when it began (as far as the data shows), when it was detected and named, what was done."""

    kind: EventKind
    began: Optional[float] = None
    detected: float
    what: str
    named: Optional[float] = None
    action: Optional[Literal["stop", "report", "ended"]] = None
    rank: Optional[int] = None
    node: Optional[str] = None
    exit_code: Optional[int] = None
    stderr: Optional[str] = None
    culprits: Optional[list[int]] = None
    score: Optional[float] = None
    since_step: Optional[int] = None
    step: Optional[int] = None


class IgnoredBeat(Model):
    """Heartbeats the live watch did not take (``hpcml.observe.beat.Trust``): for a rank the
    attempt did not start, or not signed by the rank's recorder; said once each."""

    rank: int
    why: str
    file: str
    seen: float


class Straggler(Model):
    """A rank the watch named a chronic straggler: times slower than the step median, from
    ``since_step`` (the change point of its ratios to the others, ``stragglers.onset``)."""

    rank: int
    node: Optional[str] = None
    score: float
    since_step: int
    since_before: bool = False            # slow from the judged window's first step: it began there or earlier
    confidence: Optional[float] = None    # the model's, when it was named (RankScore.confidence)
    detected: float
    cpu_wait: Optional[float] = None      # seconds its threads waited for a CPU, per second, while slow
    # what named it: compute (its steps less its waits in collectives), step times, or the Flight
    # Recorder's arrivals (who started each collective last: hpcml.observe.arrivals)
    measure: Optional[Literal["compute", "step", "arrivals"]] = None
    steal: Optional[float] = None         # the share of its node's CPU time stolen by the hypervisor then
    gpu_throttled: Optional[float] = None  # the share of that time its GPU's clocks were held back (heat, power brake)
    cpu_throttled: Optional[float] = None  # the share of that time its CPU cores ran throttled for heat (the kernel's)
    gpu_throttle: Optional[list[str]] = None  # why: NVML's clocks event reasons seen (hw_thermal_slowdown, hw_slowdown...)
    # its GPUs as the GPU names itself (its heartbeat's, as ``beat._valid`` takes them); None: none proven its
    gpu_uuids: Optional[Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,96}$")]],
                                  Field(max_length=16)]] = None


class StoppedFor(Model):
    """The straggler the attempt was stopped for (``--on-straggler restart``)."""

    what: str
    node: Optional[str] = None
    rank: Optional[int] = None
    began: Optional[float] = None
    detected: Optional[float] = None


class Fault(Model):
    """What ended an attempt (``hpcml.run.recovery.fault_of``)."""

    kind: FaultKind
    what: str
    nodes: list[str]                 # the suspects
    step: Optional[int] = None       # the furthest step a rank completed (a crash: the crashed rank's)
    began: Optional[float] = None    # as far as the data shows
    detected: Optional[float] = None


class Revet(Model):
    """The suspects vetted again: those that passed are back as spares."""

    nodes: list[str]
    passed: list[str]
    began: float
    duration_s: float
    dir: str


class ResumeSplit(Model):
    detection: Optional[float] = None
    stop: Optional[float] = None
    revet: Optional[float] = None
    relaunch: Optional[float] = None
    startup: Optional[float] = None


class Resumed(Model):
    """How the next attempt resumed: its checkpoint's step (``hpcml.ckpt``, HF Trainer's or
    Lightning's global step), or the step the script printed (``--step-pattern``), the steps
    lost, the time from the fault to its first step and how that time split."""

    step: Optional[int] = None
    checkpoint: Optional[str] = None
    printed_step: Optional[int] = None     # --step-pattern: the script's own number of the attempt's first step
    first_step_at: Optional[float] = None
    steps_lost: Optional[int] = None
    time_to_resume_s: Optional[float] = None
    split_s: ResumeSplit = ResumeSplit()


class Restart(Model):
    """``--max-restarts``: the fault that ended the attempt and what ``hpcml run`` did about
    it (``hpcml.run.recovery``)."""

    fault: Fault
    action: Optional[Literal["restart", "stop"]] = None
    why: Optional[str] = None             # why not restarted
    decided: Optional[float] = None
    suspects: Optional[list[str]] = None
    excluded: Optional[dict[str, list[str]]] = None
    revet: Optional[Revet] = None
    nodes: Optional[list[str]] = None     # the next attempt's nodes
    spares: Optional[list[str]] = None
    restart: Optional[int] = None
    resumed: Optional[Resumed] = None


class Phase(Model):
    """One phase of the launcher's own work (``hpcml.phases``): when it began, its wall time
    and the launcher's CPU in it. ``ranks started`` and ``last rank started`` are the srun
    step's start to the first and the last rank's command (from the ranks' records)."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    start: float
    wall_s: float = Field(ge=0)
    cpu_s: float = Field(ge=0)


class Attempt(Model):
    """One launch of the command in a job directory: run.json's own record, and each earlier
    one under its ``attempts``."""

    command: list[str]
    mode: Annotated[str, Field(min_length=1, max_length=64)]   # the backend's name (hpcml.run.backends)
    started: float
    job_id: Optional[str] = None
    attempt: int = Field(default=0, ge=0)
    restart_count: Optional[int] = Field(default=None, ge=0)      # SLURM_RESTART_COUNT it ran under
    run_id: Optional[str] = None
    who: Optional[Who] = None
    launcher: Optional[Launcher] = None
    farm_task: Optional[FarmTaskRef] = None
    allocation: list[str] = []                   # every node of the allocation
    excluded: dict[str, list[str]] = {}          # node -> why it is out (vetting, an earlier restart)
    vet: Optional[Vetting] = None
    env: Optional[str] = None                    # the EDF every task ran in
    nodes: Optional[list[str]] = None            # the nodes the command ran on
    ntasks: Optional[int] = Field(default=None, ge=1)
    ntasks_per_node: Optional[int] = Field(default=None, ge=1)
    master: Optional[str] = None                 # MASTER_ADDR:MASTER_PORT given to every task
    launch: Optional[list[str]] = None           # the srun command line (local mode: the task command)
    rank_launcher: Optional[str] = None          # each task ran this launcher (hpcml.run.launchers) ...
    world: Optional[int] = Field(default=None, ge=1)   # ... whose workers were the ranks: tasks x workers
    ended: Optional[float] = None
    exit_code: Optional[int] = None
    launcher_exit_code: Optional[int] = None
    aborted: Optional[bool] = None               # vetting said abort: the command never started
    first_failure: Optional[FirstFailure] = None
    signals_forwarded: Optional[list[Annotated[str, Field(pattern=r"^SIG[A-Z0-9]+$")]]] = None
    killed_after_grace: Optional[bool] = None    # ranks still ran --kill-grace seconds after TERM/INT
    stopped_at: Optional[float] = None           # hpcml run stopped the attempt itself
    signalled_at: Optional[float] = None         # hpcml run got TERM or INT (passed on): its ranks were stopped
    slurm_state: Optional[Annotated[str, Field(pattern=r"^[A-Z_]{1,32}$")]] = None   # Slurm's job state then:
    # TIMEOUT (the time limit), CANCELLED (scancel), PREEMPTED, NODE_FAIL, DEADLINE, ... (hpcml.run.slurmend)
    stopped_for: Optional[StoppedFor] = None
    lost_nodes: Optional[dict[str, LostNode]] = None
    requeued: Optional[Requeued] = None
    restart: Optional[Restart] = None
    timeline: Optional[list[Event]] = None
    stragglers: Optional[list[Straggler]] = None
    contended: Optional[list[Straggler]] = None   # slow while waiting for its node's CPUs: named as contention
    hang: Optional[Hang] = None
    ignored_beats: Optional[list[IgnoredBeat]] = None
    furthest_step: Optional[int] = None          # the highest step any rank reported
    straggler_window_s: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)  # --straggler-window
    first_step_at: Optional[float] = None        # when the attempt's first step completed
    end_recorded_by_next_attempt: Optional[bool] = None    # its launcher was killed (a requeue) before it could

    @property
    def restart_of(self) -> int:
        """The Slurm restart count the attempt ran under: its attempt number, unless in-job
        restarts (``--max-restarts``) numbered attempts past it."""
        return self.restart_count if self.restart_count is not None else self.attempt


LedgerPartName = Literal["vetting", "launch", "startup", "productive", "checkpoint", "stalls", "redone", "tail",
                         "detection", "stopping", "relaunch", "queued", "idle", "other"]
LEDGER_CITATION = "Kokolis et al., Revisiting Reliability in Large-Scale ML Research Clusters, arXiv:2410.21680 (2024)"


class LedgerPart(Model):
    """Seconds of the job (``seconds``, one after another) and node-seconds of its allocation
    (``node_s``: the seconds times the nodes they held); ``idle`` runs beside the others:
    nodes of the allocation no rank ran on (spares, excluded) while the attempt ran."""

    part: LedgerPartName
    attempt: int = Field(ge=0)
    seconds: Optional[float] = None          # None: not measured (the note says why)
    node_s: Optional[float] = None
    note: str = ""


class Ledger(Model):
    """The job's seconds, part by part (``parts`` add up to ``total_s``, and their ``node_s``
    to ``node_s``, where each is known): ``hpcml.run.ledger``."""

    total_s: float
    parts: list[LedgerPart]
    productive_s: Optional[float] = None               # None: no attempt recorded a step (not measured)
    ettr: Optional[float] = None                       # productive over the time the job held nodes (not queued)
    ettr_bound: Optional[Literal["at most"]] = None    # a part that would lower it was not measured
    node_s: Optional[float] = None                      # the allocation's nodes x the job's seconds
    productive_node_s: Optional[float] = None
    definition: str = LEDGER_CITATION

    def by_part(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.parts:
            if p.seconds is not None:
                out[p.part] = round(out.get(p.part, 0.0) + p.seconds, 3)
        return out

    def lost(self) -> list[tuple[str, float]]:
        """Node-seconds that did not train, by part, the largest first."""
        out: dict[str, float] = {}
        for p in self.parts:
            if p.part != "productive" and p.node_s:
                out[p.part] = round(out.get(p.part, 0.0) + p.node_s, 3)
        return sorted(out.items(), key=lambda kv: -kv[1])


class RunRecord(Attempt):
    """run.json: the current attempt, with the earlier ones (oldest first) under ``attempts``."""

    schema_: str = Field(default=RUN_SCHEMA, alias="schema", pattern=r"^hpcml\.run/1(\.[0-9]+)?$")
    attempts: Optional[list[Attempt]] = None
    ledger: Optional[Ledger] = None              # where the job's time went, written when it ended
    phases: Optional[list[Phase]] = None         # where the launcher's own time went, every attempt (hpcml.phases)

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    def records(self) -> list[Attempt]:
        """Every attempt, oldest first, this one last."""
        return [*(self.attempts or []), self]

    def as_attempt(self) -> Attempt:
        """This record as an earlier attempt of the next one's."""
        return Attempt.model_validate({k: v for k, v in self.to_json().items()
                                       if k not in ("schema", "attempts", "ledger", "phases")})


# ------------------------------------------------------------------------- job summary

MAX_NODES = 100_000                # per job
GPUS_PER_NODE = 64                 # above this a summary's GPU count is not a job's
BIG = 2**31 - 1                    # PostgreSQL's INTEGER
LOTS = 1e12                        # hours, seconds, throughput: anything above is not a job's
FUTURE_S = 86400                   # a job may end up to a day ahead of the reader's clock
#: the roles a job names a node in, each with the summary's list of them
ROLE_FIELDS = {"excluded": "excluded", "straggler": "stragglers", "culprit": "culprits", "lost": "lost",
               "crashed": "crashed"}
OUTCOMES = ("completed", "failed", "hung", "aborted", "requeued", "interrupted", "running")


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
AttemptNo = Annotated[int, Field(ge=0, le=1_000_000)]


class NodeEvent(Model):
    """A node the job names: excluded by vetting, a straggler, a hang culprit, lost, or the
    node of a rank that crashed."""

    node: Name
    rank: Optional[Count] = None
    attempt: AttemptNo = 0
    detail: Reason = ""


class Gpu(Model):
    score: Optional[Annotated[float, Field(ge=0, le=1)]] = None
    bound: Optional[Short] = None


class NodeVetting(Model):
    """One node's vetting by the job's ``hpcml run --vet``: the fleet report's vetting
    history (never counted by the node handler's rules: a job's vetting is its sender's
    word, and only its exclusions are job evidence)."""

    node: Name
    attempt: AttemptNo = 0
    time: Time
    verdict: Literal["good", "bad"]
    failing: list[Short] = Field(default_factory=list, max_length=64)


class Throughput(Model):
    median: Number
    unit: Short = ""


class JobSummary(Model):
    """One attempt's compact summary for the centre; ``(cluster, job_id, attempt)`` is its
    identity. Built by ``hpcml.run.summary``, validated again by the collector."""

    schema_: str = Field(default=SUMMARY_SCHEMA, alias="schema", pattern=r"^hpcml\.job\.summary/1(\.[0-9]+)?$")
    cluster: Short = ""                         # SLURM_CLUSTER_NAME, empty outside Slurm
    job_id: Name                                # Slurm's job id, or local-RUNID outside Slurm
    attempt: AttemptNo
    requeues: Optional[Count] = None            # Slurm's restart count this attempt ran under
    user: Optional[Short] = None
    account: Optional[Short] = None
    partition: Optional[Short] = None
    started: Time
    ended: Optional[Time] = None
    duration_s: Optional[Number] = None
    exit_code: Optional[Annotated[int, Field(ge=-1024, le=1024)]] = None
    outcome: Literal["completed", "failed", "hung", "aborted", "requeued", "interrupted", "running"]
    nodes: list[Name] = Field(default_factory=list, max_length=MAX_NODES)
    ntasks: Count = 0
    #: None where nothing said how many GPUs the job had (no rank ran, no sampler read one):
    #: unknown, not 0, and so are its GPU-hours
    gpus: Optional[Count] = None
    excluded: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    stragglers: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    culprits: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    lost: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    crashed: list[NodeEvent] = Field(default_factory=list, max_length=MAX_NODES)
    vetting: list[NodeVetting] = Field(default_factory=list, max_length=MAX_NODES)
    hangs: Count = 0                            # hangs over the attempts, a recovered one too
    gpu: Gpu = Gpu()
    throughput: Optional[Throughput] = None
    attempts: int = Field(default=1, ge=1, le=1_000_000)
    time_lost_s: Optional[Number] = None
    ettr: Optional[float] = Field(default=None, ge=0, le=1)     # productive / whole (hpcml.run.ledger)
    ettr_bound: Optional[Literal["at most"]] = None              # a part that would lower it was not measured
    productive_s: Optional[Number] = None
    node_hours: Number = 0.0
    gpu_hours: Optional[Number] = None
    gpu_hours_lost: Optional[Number] = None
    #: the ledger's (hpcml.run.ledger) node time that did not train, and the GPU time of it
    #: (the job's GPUs per node), with the part that cost the most: the centre ranks by these
    node_hours_not_training: Optional[Number] = None
    gpu_hours_not_training: Optional[Number] = None
    not_training_why: Optional[LedgerPartName] = None

    model_config = ConfigDict(extra="forbid", validate_assignment=False, populate_by_name=True)

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
        if self.gpus is not None and self.gpus > GPUS_PER_NODE * max(len(self.nodes), 1):
            raise ValueError(f"gpus: {self.gpus} on {len(self.nodes)} nodes")
        span_h = ((self.ended if self.ended is not None else time.time()) - self.started) / 3600
        slack = 1.01 * span_h + 0.01
        if self.duration_s is not None and self.duration_s > span_h * 3600 * 1.01 + 60:
            raise ValueError(f"duration_s: {self.duration_s:g} s is longer than the job ran")
        if self.node_hours > slack * max(len(self.nodes), 1):
            raise ValueError(f"node_hours: {self.node_hours:g} for {len(self.nodes)} nodes over {span_h:.3g} h")
        for key in ("gpu_hours", "gpu_hours_lost", "gpu_hours_not_training"):
            value = getattr(self, key)
            if value is not None and self.gpus is None:       # GPU-hours of GPUs nobody counted
                raise ValueError(f"{key}: {value:g} GPU-hours, but the job's gpus are not given")
            if value is not None and self.gpus is not None and value > slack * self.gpus:
                raise ValueError(f"{key}: {value:g} for {self.gpus} GPUs over {span_h:.3g} h")
        for key in ("node_hours", "node_hours_not_training"):
            value = getattr(self, key)
            if value is not None and value > slack * max(len(self.nodes), 1):
                raise ValueError(f"{key}: {value:g} for {len(self.nodes)} nodes over {span_h:.3g} h")

    @property
    def time(self) -> float:
        """When the job's outcome is dated: its end, else its start."""
        return self.ended if self.ended is not None else self.started

    def events(self) -> list[tuple[str, NodeEvent]]:
        """(role, event) for every node the job names."""
        return [(role, e) for role, name in ROLE_FIELDS.items() for e in getattr(self, name)]


# ------------------------------------------------------------------------- vet report

#: what a check found (``hpcml.vet.model.Outcome``'s values: ``vet`` is above this module)
VetOutcome = Literal["pass", "warn", "fail", "error", "skipped"]
VET_OUTCOMES: tuple[str, ...] = typing.get_args(VetOutcome)


class VetDocument(Model):
    """A part of ``hpcml vet``'s report. Built by hand from ``hpcml.vet.model``'s
    dataclasses (the worker on every node imports no pydantic, and 100k results are
    written in a fraction of a second), whose fields these models name: every key is
    written, so every key is required in the schema; a reader takes a missing one at its
    default, the dataclass's."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class VetCheck(VetDocument):
    """One eval of the protocol, as it was run (``hpcml.vet.protocol.EvalSpec``)."""

    name: str
    type: str
    scope: Literal["node", "allocation"]
    timeout: float
    severity: Literal["fail", "warn"]
    count_errors: bool = True
    params: dict[str, JsonValue] = {}
    min_relative: Optional[float] = None
    max_relative: Optional[float] = None


class VetProtocol(VetDocument):
    """The protocol the nodes were vetted by (``hpcml.vet.protocol.Protocol``)."""

    name: str
    source: str
    vetnode: bool = False
    checks: list[VetCheck]


class VetResult(VetDocument):
    """One check on one node (``hpcml.vet.model.CheckResult``)."""

    node: str
    check: str
    type: str
    outcome: VetOutcome
    value: Union[float, int, str, bool, None] = None
    threshold: Optional[str] = None
    unit: Optional[str] = None
    duration: float = Field(default=0.0, ge=0)
    message: str = ""
    details: dict[str, JsonValue] = {}


class VetNode(VetDocument):
    """Every result of one node (``hpcml.vet.model.NodeReport``); ``reachable`` is false
    when no result came back in time."""

    node: str
    reachable: bool = True
    message: str = ""
    sent_at: Optional[float] = None
    results: list[VetResult] = []


class VetVerdict(VetDocument):
    """The decision over every node (``hpcml.vet.model.Verdict``), the nodes as hostlists."""

    decision: Literal["continue", "shrink", "abort"]
    exit_code: Literal[0, 3, 4]
    min_nodes: int = Field(ge=0)
    good: str = Field(description="Slurm hostlist")
    bad: str = Field(description="Slurm hostlist, for srun --exclude")
    good_count: int = Field(ge=0)
    bad_count: int = Field(ge=0)
    reasons: dict[str, list[str]] = {}


class VetReport(VetDocument):
    """``hpcml vet``'s report.json (``hpcml.vet.report.to_json``): the protocol, every
    node's check results and the verdict."""

    schema_: str = Field(default=VET_REPORT, alias="schema", pattern=r"^hpcml\.vet/1(\.[0-9]+)?$")
    protocol: VetProtocol
    job_id: Optional[str]
    launcher: str
    started_at: float = Field(description="seconds since the epoch")
    duration: float = Field(ge=0)
    nodes: dict[str, VetNode]
    verdict: VetVerdict
    notes: list[str] = []

    model_config = ConfigDict(populate_by_name=True)


# ------------------------------------------------------------------ reading and writing

M = TypeVar("M", bound=BaseModel)


def known(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the keys ``model`` (and its nested models) does not declare: a
    newer minor's additions, which this hpcml cannot read and may ignore."""
    if not isinstance(data, dict):
        return data
    fields = model.model_fields
    names = {f.alias or k: f for k, f in fields.items()}
    return {k: _nested(names[k].annotation, v) for k, v in data.items() if k in names}


def _nested(annotation: Any, value: Any) -> Any:
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return known(annotation, value)
    if origin in (Union, types.UnionType, Annotated):
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and isinstance(value, dict):
                return known(arg, value)
            if typing.get_origin(arg) in (list, dict):
                return _nested(arg, value)
        return value
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(annotation) or (Any,)
        return [_nested(item, v) for v in value]
    if origin is dict and isinstance(value, dict):
        _, item = typing.get_args(annotation) or (str, Any)
        return {k: _nested(item, v) for k, v in value.items()}
    return value


def newer_minor(doc: dict[str, Any], expected: str) -> bool:
    found, want = doc.get("schema"), parse(expected)
    if not isinstance(found, str) or want is None or "." not in found.rsplit("/", 1)[-1]:
        return False
    return parse(found) == want and int(found.rsplit(".", 1)[-1]) > 0


def reason(exc: ValidationError, prefix: str = "") -> str:
    """One line naming the first bad field: ``attempts.0.exit_code: Input should be ...``."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    more = exc.error_count() - 1
    return f"{prefix}{loc or 'body'}: {err['msg']}" + (f" (and {more} more)" if more else "")


def validate(model: type[M], doc: Any, expected: str, source: str) -> M:
    """``doc`` as ``model``: its tag checked first (``hpcml.schemas.check``), then every
    field; ``UsageError`` naming ``source`` and the field, never a traceback."""
    check(doc, expected, source)
    if newer_minor(doc, expected):
        doc = known(model, doc)
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise UsageError(reason(exc), file=source) from None


def read_run(path: Path) -> RunRecord:
    """run.json, bounded and validated (a FIFO or a directory there: unreadable, not a hang);
    the keys of ``LEGACY_RUN_KEYS`` an older hpcml wrote are dropped, any other unknown key
    is refused."""
    from hpcml.files import read_json
    doc = read_json(path, RUN_SCHEMA, max_bytes=MAX_RUN_JSON)
    if isinstance(doc, dict):
        doc = _without_legacy(doc)
    return validate(RunRecord, doc, RUN_SCHEMA, str(path))


def _without_legacy(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k not in LEGACY_RUN_KEYS}
    if isinstance(out.get("attempts"), list):
        out["attempts"] = [_without_legacy(a) if isinstance(a, dict) else a for a in out["attempts"]]
    return out


def dumps(record: Model) -> bytes:
    """The document as hpcml has always written it (the standard library's JSON, indented):
    a non-UTF-8 argument or path (a surrogate escape) is written escaped, an infinite score
    as ``Infinity``, and both read back; orjson refuses the first and writes the second as
    null."""
    return (json.dumps(record.to_json(), indent=2) + "\n").encode()


def write_schemas(folder: Path | None = None) -> list[Path]:
    """The JSON Schemas of run.json, the job summary, the heartbeat and the vet report,
    generated from the models."""
    from hpcml.files import write_atomic
    folder = folder or Path(__file__).parent / "schemas"
    out = []
    for name, schema in generated().items():
        path = folder / f"{name}.schema.json"
        write_atomic(path, orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n")
        out.append(path)
    return out


def generated() -> dict[str, dict[str, Any]]:
    """``{"run": ..., "job.summary": ..., "observe.beat": ..., "vet": ...}``: closed
    (``additionalProperties: false``)."""
    run = RunRecord.model_json_schema(by_alias=True, mode="serialization")
    run.update({"$schema": "https://json-schema.org/draft/2020-12/schema",
                "title": "hpcml run job record (run.json of an hpcml run job directory)"})
    summary = JobSummary.model_json_schema(by_alias=True, mode="serialization")
    summary.update({"$schema": "https://json-schema.org/draft/2020-12/schema",
                    "title": "A job attempt's summary for the centre (JOBDIR/summary/attempt-N.json, POST /v1/jobs)"})
    vet = VetReport.model_json_schema(by_alias=True, mode="serialization")
    vet.update({"$schema": "https://json-schema.org/draft/2020-12/schema",
                "title": "hpcml vet report (report.json, `hpcml vet run --json`)",
                "description": "One vetting run: the protocol, every node's check results and the verdict. "
                               "Written by hpcml.vet.report.to_json."})
    for schema in (run, summary, vet):            # every writer writes its tag, first
        schema["required"] = ["schema", *[r for r in schema.get("required", []) if r != "schema"]]
    return {"run": run, "job.summary": summary, "observe.beat": _beat_schema(), "vet": vet}


def _beat_schema() -> dict[str, Any]:
    """A rank's heartbeat record (``hpcml.observe.beat.Beat``, a dataclass: the recorder
    imports no pydantic) in its envelope: the tag first, the HMAC ``sig`` last when signed."""
    import re

    from pydantic import TypeAdapter

    from hpcml.observe.beat import GPU_UUID, MAX_GPUS, SCHEMA, Beat
    schema = TypeAdapter(Beat).json_schema(mode="serialization")
    tag = {"type": "string", "pattern": "^" + re.escape(SCHEMA) + "$"}      # read_beats takes it exactly
    schema["properties"] = {"schema": tag, **schema["properties"], "sig": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}
    uuids = next(t for t in schema["properties"]["gpu_uuids"]["anyOf"] if t.get("type") == "array")
    uuids.update(maxItems=MAX_GPUS, items={"type": "string", "pattern": f"^{GPU_UUID.pattern}$"})   # as _valid reads them
    schema.update({"$schema": "https://json-schema.org/draft/2020-12/schema", "additionalProperties": False,
                   "title": "A rank's heartbeat (OBSERVE/beat/rank-NNNNN.json, rewritten in place, 4096 bytes)",
                   "required": ["schema", *schema.get("required", [])]})
    return schema


if __name__ == "__main__":                    # python -m hpcml.jobmodel --write-schemas
    import sys
    if sys.argv[1:] != ["--write-schemas"]:
        sys.exit("usage: python -m hpcml.jobmodel --write-schemas")
    for p in write_schemas():
        print(p)
