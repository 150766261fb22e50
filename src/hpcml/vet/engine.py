"""The launcher: run a protocol on every node of the allocation and reach a verdict.

Node checks run first, one srun step with one worker per node; their results come back on
srun's stdout. Checks that span the allocation (collectives) then run in a second step on
the nodes that are still good, so one bad node cannot spoil the measurement of the
others. Every step is bounded by the run's deadline: a node whose result has not arrived
by then is unreachable, and the run ends on time whatever hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpcml.cluster import slurm
from hpcml.cluster.allocation import Allocation
from hpcml.cluster.hostlist import fold
from hpcml.vet import registry, relative, verdict
from hpcml.vet.model import CheckResult, NodeReport, Outcome, Verdict
from hpcml.vet.protocol import EvalSpec, Protocol
from hpcml.vet.wire import Reassembler
from hpcml.vet.worker import PRELOAD_ENV, context_fields, run_node

#: what srun needs after its tasks end to flush their output and exit
SRUN_GRACE = 2.0


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


@dataclass
class _Step:
    """One srun step's harvest."""

    reports: dict[str, NodeReport] = field(default_factory=dict)
    stderr: list[str] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False


def _spec(protocol: Protocol, evals: list[EvalSpec], nodes: list[str], deadline_at: float,
          workdir: str | None) -> dict:
    return {"protocol": protocol.name, "nodes": nodes, "deadline_at": deadline_at,
            "workdir": workdir, "require_gpus": protocol.require_gpus,
            "evals": [e.to_dict() for e in evals]}


def _read_lines(stream, on_line, at_end=None) -> None:
    for line in iter(stream.readline, ""):
        on_line(line.rstrip("\n"))
    stream.close()
    if at_end:
        at_end()


def _srun_argv(nodes: list[str], python: str) -> list[str]:
    return slurm.srun_argv([python, "-m", "hpcml.vet.worker"], nodes=nodes, ntasks_per_node=1,
                           extra=["--kill-on-bad-exit=0", "--overlap", "--mpi=none",
                                  "--input=all", "--job-name=hpcml-vet"])


class Step:
    """One set of workers: started first, told what to run later.

    The spec goes to the workers on stdin (srun ``--input=all`` copies it to every task),
    so their interpreters start, and import the checks named in ``preload``, while the
    launcher is still validating the protocol. Workers that get no spec exit without
    running anything.
    """

    def __init__(self, argv: list[str], expected: int, preload: list[str] = ()) -> None:
        self.expected = expected
        self.step = _Step()
        self.complete = threading.Event()
        self.wire = Reassembler()
        env = dict(os.environ, **{PRELOAD_ENV: ",".join(preload)})
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        self.readers = [threading.Thread(target=_read_lines, args=args, daemon=True) for args in
                        ((self.proc.stdout, self._on_stdout, self.complete.set),
                         (self.proc.stderr, self._on_stderr))]
        for t in self.readers:
            t.start()

    def _on_stdout(self, line: str) -> None:
        done = self.wire.feed(line)
        if done is None:
            return
        try:
            report = NodeReport.from_dict(done[1])
        except (ValueError, KeyError, TypeError):
            return
        report.received_at = time.time()
        self.step.reports[report.node] = report
        if len(self.step.reports) >= self.expected:
            self.complete.set()

    def _on_stderr(self, line: str) -> None:
        if len(self.step.stderr) < 200:
            self.step.stderr.append(line)

    def send(self, spec: dict | None) -> None:
        try:
            if spec is not None:
                self.proc.stdin.write(json.dumps(spec) + "\n")
            self.proc.stdin.close()
        except BrokenPipeError:  # the workers are gone; harvest() says so
            pass

    def cancel(self) -> None:
        self.send(None)
        try:
            self.proc.wait(timeout=SRUN_GRACE)
        except subprocess.TimeoutExpired:
            _stop(self.proc)

    def harvest(self, deadline_at: float) -> _Step:
        """Results of every node, returned as soon as all reported or at the deadline."""
        # an Event, not proc.wait(timeout): that polls with sleeps of up to 50 ms
        if not self.complete.wait(timeout=max(0.1, deadline_at - time.time() + SRUN_GRACE)):
            self.step.timed_out = True
            _stop(self.proc)
        try:
            self.step.returncode = self.proc.wait(timeout=SRUN_GRACE)
        except subprocess.TimeoutExpired:
            _stop(self.proc)
        for t in self.readers:
            t.join(timeout=1.0)
        return self.step


def start_workers(nodes: list[str], python: str | None = None, *, use_srun: bool = True,
                  preload: list[str] = ()) -> Step:
    python = python or sys.executable
    argv = _srun_argv(nodes, python) if use_srun else [python, "-m", "hpcml.vet.worker"]
    return Step(argv, len(nodes) if use_srun else 1, list(preload))


def _stop(proc: subprocess.Popen) -> None:
    """srun forwards SIGTERM to its tasks; SIGKILL if it does not leave promptly."""
    for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _local_step(spec: dict) -> _Step:
    report = run_node(spec, context_fields(spec))
    report.received_at = time.time()
    return _Step(reports={report.node: report}, returncode=0)


def _unreachable(node: str, step: _Step) -> NodeReport:
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
    spec = _spec(protocol, evals, nodes, deadline_at, workdir)
    if started is None and (use_srun or python != sys.executable):
        # srun, or the checks' own venv: workers in that interpreter
        started = start_workers(nodes, python, use_srun=use_srun)
    if started is not None:
        started.send(spec)
        step = started.harvest(deadline_at)
    else:
        step = _local_step(spec)
    reports = {n: step.reports.get(n) or _unreachable(n, step) for n in nodes}
    _judge_across(evals, reports)
    return reports


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
    if alloc_evals:
        good = verdict.decide(nodes, reports, count_errors).good
        if good:
            _merge(reports, _run_phase(protocol, alloc_evals, good, deadline_at, workdir,
                                       use_srun, python))
        for node in set(nodes) - set(good):
            reports[node].results += [CheckResult(
                node=node, check=e.name, type=e.type, outcome=Outcome.SKIPPED,
                message="not run: the node already failed") for e in alloc_evals]
        if len(good) < len(nodes):
            notes.append(f"allocation checks ran on the {len(good)} good nodes only "
                         f"({fold(good) or 'none'})")
    result = verdict.decide(nodes, reports, count_errors,
                            min_nodes if min_nodes is not None else protocol.min_nodes)
    return VetRun(protocol=protocol, nodes=nodes, reports=reports, verdict=result,
                  started_at=t0, duration=time.time() - t0,
                  job_id=allocation.job_id, launcher="srun" if use_srun else "local",
                  notes=notes)
