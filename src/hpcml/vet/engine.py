"""The launcher: run a protocol on every node of the allocation and reach a verdict.

Node checks run first, one srun step with one worker per node; their results come back on
srun's stdout. Checks that span the allocation (collectives) then run in a second step on
the nodes that are still good, so one bad node cannot spoil the measurement of the
others. Every step is bounded by the run's deadline: a node whose result has not arrived
by then is unreachable, and the run ends on time whatever hangs.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hpcml import logs
from hpcml.cluster.allocation import Allocation
from hpcml.cluster.hostlist import fold
from hpcml.errors import SlurmError
from hpcml.phases import phase
from hpcml.vet import culprit_run, isolate, registry, relative, verdict
from hpcml.vet.launch import Step, StepResult, spec, start_workers
from hpcml.vet.model import CheckResult, NodeReport, Outcome, Verdict
from hpcml.vet.protocol import EvalSpec, Protocol
from hpcml.vet.worker import context_fields, run_node
from hpcml.words import plural

log = logs.get(__name__)


@dataclass
class VetRun:
    protocol: Protocol
    nodes: list[str]
    reports: dict[str, NodeReport]
    verdict: Verdict
    started_at: float
    duration: float
    job_id: str | None = None
    launcher: str = "local"
    notes: list[str] = field(default_factory=list)


_spec = spec                       # the one builder of a spec (hpcml.vet.launch), under its old name here


INTERRUPTED_NOTE = "interrupted (SIGINT): checks still running were stopped and count as errors"


NOTHING_CHECKED = "NOTHING WAS CHECKED"


def _nothing_checked(nodes: list[str], reports: dict[str, NodeReport]) -> list[str]:
    """Nodes that will be judged good although every check was skipped on them (a GPU
    protocol on a node without GPUs, say), or that answered with no result at all: good only
    because nothing was checked."""
    out = []
    for node in nodes:
        rep = reports[node]
        if not rep.reachable or any(r.outcome is not Outcome.SKIPPED for r in rep.results):
            continue
        if not rep.results:
            out.append(f"{node}: {NOTHING_CHECKED}: it answered with no check's result")
            continue
        why = next((r.message for r in rep.results if r.message), "")
        out.append(f"{node}: {NOTHING_CHECKED}: all {len(rep.results)} checks were skipped"
                   + (f" (e.g. {why})" if why else ""))
    return out


def _starved(reports: dict[str, NodeReport]) -> list[str]:
    """One note when checks ran out of time waiting for a CPU rather than running: errors
    still (fail closed), but the nodes' CPUs were oversubscribed, not the nodes broken."""
    hit = {n: [r.check for r in rep.results if r.details.get("starved")] for n, rep in reports.items()}
    hit = {n: checks for n, checks in hit.items() if checks}
    if not hit:
        return []
    return [f"{sum(map(len, hit.values()))} checks on {len(hit)} nodes ({fold(hit, sort=True)}) timed out "
            "waiting for a CPU, not while running: the nodes' CPUs were oversubscribed (many virtual "
            "nodes on one host, or another job's processes); they count as errors. On a test cluster, "
            "raise the checks' timeouts and the deadline (README: vetting many virtual nodes)"]


def _local_step(spec: dict) -> StepResult:
    report = run_node(spec, context_fields(spec))
    report.received_at = time.time()
    return StepResult(reports={report.node: report}, returncode=0)


def _unreachable(node: str, step: StepResult) -> NodeReport:
    if step.timed_out:
        why = "no result by the run's deadline"
    else:
        hint = [line for line in step.stderr if node in line] or step.stderr[-1:]
        why = f"no result (srun exit {step.returncode}" + (f": {hint[-1].strip()})" if hint else ")")
    return NodeReport(node=node, reachable=False, message=why)


def _judge_across(evals: list[EvalSpec], reports: dict[str, NodeReport]) -> None:
    """Comparisons that need every node's result: check-specific, then relative limits."""
    for ev in evals:
        results = {n: r for n, rep in reports.items() if rep.reachable
                   for r in rep.results if r.check == ev.name}
        if not results:
            continue
        cls = registry.load(ev.check)
        cls.compare(cls.Params(**ev.params), results, reports)
        relative.apply(results, ev.min_relative, ev.max_relative, ev.severity)


def _run_phase(protocol: Protocol, evals: list[EvalSpec], nodes: list[str], deadline_at: float,
               workdir: str | None, use_srun: bool, python: str,
               started: Step | None = None) -> dict[str, NodeReport]:
    told = _spec(protocol, evals, nodes, deadline_at, workdir)
    if started is None and (use_srun or python != sys.executable):
        # srun, or the checks' own venv: workers in that interpreter
        started = start_workers(nodes, python, use_srun=use_srun)
    try:
        with phase("vet.gather"):                # the spec out, every node's result in (or the deadline)
            if started is not None and started.sent is not None:     # told before the launcher was ready
                step = started.harvest(min(deadline_at, started.sent["deadline_at"]))
            elif started is not None:
                started.send(told)
                step = started.harvest(deadline_at)
            else:
                step = _local_step(told)
    except KeyboardInterrupt:         # srun passes the SIGINT to the workers, which stop their checks
        isolate.mark_interrupted()
        if started is not None:
            started.cancel()
        return {n: NodeReport(node=n, reachable=False, message="interrupted (SIGINT) before its results came")
                for n in nodes}
    except BaseException:             # the launcher stopped by TERM (hpcml.run.launcher): its workers too
        if started is not None:
            started.cancel()
        raise
    try:
        if use_srun:
            step = _again_while_the_cluster_fails(protocol, evals, nodes, deadline_at, workdir, python, step)
    except KeyboardInterrupt:         # srun passes the SIGINT to the workers, which stop their checks
        isolate.mark_interrupted()
        return {n: NodeReport(node=n, reachable=False, message="interrupted (SIGINT) before its results came")
                for n in nodes}
    with phase("vet.decide"):
        reports = {n: step.reports.get(n) or _unreachable(n, step) for n in nodes}
        _judge_across(evals, reports)
    return reports


class ClusterFault(SlurmError):
    """Most nodes gave no result for one Slurm or MUNGE reason: the cluster failed, not the
    nodes. Fail closed: no node is judged (none is excluded or reported bad)."""


#: a Slurm or MUNGE failure of the step itself, as srun and slurmstepd print it
_SLURM_FAULT = re.compile(r"munge|authentication|unable to contact slurm|socket timed out|communication connection "
                          r"failure|zero bytes were transmitted|job step creation|protocol|slurmstepd.*error|"
                          r"srun: error", re.IGNORECASE)
#: a worker's own end, as srun reports it per task: the node's business, not the cluster's
_TASK_EXIT = re.compile(r"task \d+: |exit code \d+|signal \d+", re.IGNORECASE)
CLUSTER_SHARE = 0.5                # of the nodes without a result, for one reason: the cluster's fault
CLUSTER_RETRIES = (5.0, 15.0)      # seconds before each retry of the nodes without a result
CLUSTER_MIN_LEFT = 20.0            # a retry needs this much of the deadline left


def _slurm_said(step: StepResult) -> list[str]:
    """The lines in which srun or slurmstepd said a Slurm or MUNGE error of the step itself
    (not a worker's own end)."""
    return [line.strip() for line in step.stderr if _SLURM_FAULT.search(line) and not _TASK_EXIT.search(line)]


def _said(nodes: list[str], step: StepResult, said: list[str]) -> str:
    missing = [n for n in nodes if n not in step.reports]
    reasons = Counter(re.sub(r"[\w.-]*\d[\w.-]*", "#", line) for line in said)
    top, _ = reasons.most_common(1)[0]
    example = next(line for line in said if re.sub(r"[\w.-]*\d[\w.-]*", "#", line) == top)
    return (f"{len(missing)} of {len(nodes)} nodes gave no result (srun exit {step.returncode}), "
            f"Slurm said: {example[:300]}")


def cluster_fault(nodes: list[str], step: StepResult) -> str | None:
    """Why the step failed as the cluster's fault, or None: at least two nodes and
    ``CLUSTER_SHARE`` of them gave no result, not for the deadline, and srun or slurmstepd
    said a Slurm or MUNGE error (the most common one, node names and numbers taken out)."""
    missing = [n for n in nodes if n not in step.reports]
    if step.timed_out or len(missing) < 2 or len(missing) < CLUSTER_SHARE * len(nodes):
        return None
    said = _slurm_said(step)
    return _said(nodes, step, said) if said else None


def step_failed(nodes: list[str], step: StepResult) -> str | None:
    """Why some nodes gave no result because Slurm failed the step, or None: srun ends a
    whole step when the launch fails on one node ("Task launch ... failed", "authentication
    error"), and the workers of healthy nodes die with it, unjudged. Those nodes are asked
    again before any is called unreachable."""
    missing = [n for n in nodes if n not in step.reports]
    if step.timed_out or not missing:
        return None
    said = _slurm_said(step)
    return _said(nodes, step, said) if said else None


def _again_while_the_cluster_fails(protocol: Protocol, evals: list[EvalSpec], nodes: list[str], deadline_at: float,
                                   workdir: str | None, python: str, step: StepResult) -> StepResult:
    """Retry the nodes without a result, with backoff, while Slurm says it failed the step
    (``step_failed``: any share of the nodes); if most still gave none for the cluster's
    reason (``cluster_fault``), raise ``ClusterFault`` (fail closed). Results that came are
    kept; a node still without one after the retries is unreachable, as before."""
    tries = 0
    for delay in CLUSTER_RETRIES:
        why = step_failed(nodes, step)
        if why is None or time.time() + delay + CLUSTER_MIN_LEFT > deadline_at:
            break
        log.warning(f"hpcml vet: {why}: Slurm failed the step, not necessarily the nodes; the nodes without a "
                    f"result again in {delay:g} s")
        time.sleep(delay)
        tries += 1
        missing = [n for n in nodes if n not in step.reports]
        again = start_workers(missing, python, use_srun=True)
        again.send(_spec(protocol, evals, missing, deadline_at, workdir))
        more = again.harvest(deadline_at)
        more.reports = {**step.reports, **more.reports}
        step = more
    why = cluster_fault(nodes, step)
    if why is not None:
        raise ClusterFault(f"vetting: {why}" + (f"; still after {plural(tries, 'retry', 'retries')}" if tries else "")
                           + ": the cluster failed, not the nodes; no node is judged (check slurmctld and munged)")
    return step


def _merge(into: dict[str, NodeReport], more: dict[str, NodeReport]) -> None:
    for node, rep in more.items():
        base = into[node]
        if not rep.reachable:
            base.reachable, base.message = False, rep.message
        base.results.extend(rep.results)


def vet(protocol: Protocol, allocation: Allocation, *, nodes: list[str] | None = None,
        min_nodes: int | None = None, deadline: float | None = None,
        workdir: str | None = None, use_srun: bool | None = None,
        python: str | None = None, started: Step | None = None) -> VetRun:
    """Vet ``nodes`` (default: the whole allocation) and decide. ``started``: workers
    for these nodes already started with ``start_workers`` (see ``Step``)."""
    t0 = time.time()
    in_step = allocation.step_id is not None  # `srun hpcml vet`: each task vets its own node
    nodes = list(nodes or ([allocation.node] if in_step else allocation.nodes))
    deadline_at = t0 + (deadline if deadline is not None else protocol.deadline)
    use_srun = (allocation.under_slurm and not in_step) if use_srun is None else use_srun
    python = python or sys.executable
    if workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    count_errors = {e.name: e.count_errors for e in protocol.evals}
    node_evals = [e for e in protocol.evals if e.scope == "node"]
    alloc_evals = [e for e in protocol.evals if e.scope != "node"]
    if node_evals:
        reports = _run_phase(protocol, node_evals, nodes, deadline_at, workdir, use_srun,
                             python, started)
    else:
        if started is not None:
            started.cancel()
        reports = {n: NodeReport(node=n) for n in nodes}
    notes = []
    if alloc_evals and isolate.interrupted():
        for node in nodes:
            reports[node].results += [CheckResult(
                node=node, check=e.name, type=e.type, outcome=Outcome.ERROR,
                message="interrupted: not started") for e in alloc_evals]
        alloc_evals = []
    if alloc_evals:
        good = verdict.decide(nodes, reports, count_errors).good
        if good:
            _merge(reports, _run_phase(protocol, alloc_evals, good, deadline_at, workdir,
                                       use_srun, python))
            notes += culprit_run.find_culprits(alloc_evals, good, reports, deadline_at,
                                               workdir, use_srun, python)
        for node in set(nodes) - set(good):
            reports[node].results += [CheckResult(
                node=node, check=e.name, type=e.type, outcome=Outcome.SKIPPED,
                message="not run: the node already failed") for e in alloc_evals]
        if len(good) < len(nodes):
            notes.append(f"allocation checks ran on the {len(good)} good nodes only "
                         f"({fold(good, sort=True) or 'none'})")
    if isolate.interrupted():
        notes.append(INTERRUPTED_NOTE)
    with phase("vet.decide"):
        notes += _nothing_checked(nodes, reports) + _starved(reports)
        result = verdict.decide(nodes, reports, count_errors,
                                min_nodes if min_nodes is not None else protocol.min_nodes)
    return VetRun(protocol=protocol, nodes=nodes, reports=reports, verdict=result,
                  started_at=t0, duration=time.time() - t0,
                  job_id=allocation.job_id, launcher="srun" if use_srun else "local",
                  notes=notes)
