"""Starting the node workers and collecting their reports, kept light on purpose.

``hpcml vet`` starts the workers before it has validated the protocol, so this module
imports nothing heavy (no pydantic, no check modules): the sooner srun runs, the more
of the workers' start-up hides behind the launcher's own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import progress
from hpcml.cluster import slurm
from hpcml.proctree import die_with_parent, libc
from hpcml.vet.model import NodeReport
from hpcml.vet.wire import PRELOAD_ENV, Reassembler

#: what srun needs after its tasks end to flush their output and exit
SRUN_GRACE = 2.0
_BOOT = "import sys; sys.path[:0] = {path!r}; from hpcml.vet.worker import main; sys.exit(main())"


@dataclass
class StepResult:
    """One srun step's harvest."""

    reports: dict[str, NodeReport] = field(default_factory=dict)
    stderr: list[str] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False


def _read_lines(stream, on_line, at_end=None) -> None:
    for line in iter(stream.readline, ""):
        on_line(line.rstrip("\n"))
    stream.close()
    if at_end:
        at_end()


def _srun_argv(nodes: list[str], python: str) -> list[str]:
    return slurm.srun_argv(_worker_command(python), nodes=nodes, ntasks_per_node=1,
                           extra=["--kill-on-bad-exit=0", "--overlap", "--mpi=none",
                                  "--input=all", "--job-name=hpcml-vet"])


def spec(protocol: Any, evals: Sequence[Any], nodes: list[str], deadline_at: float, workdir: str | None) -> dict:
    """What every worker is told to run (``hpcml.vet.worker``): the checks, the nodes, the
    deadline (epoch s) and the run's shared directory."""
    return {"protocol": protocol.name, "nodes": nodes, "deadline_at": deadline_at,
            "workdir": workdir, "require_gpus": protocol.require_gpus,
            "evals": [e.to_dict() for e in evals]}


class Step:
    """One set of workers: started first, told what to run later.

    The spec goes to the workers on stdin (srun ``--input=all`` copies it to every task),
    so their interpreters start, and import the checks named in ``preload``, while the
    launcher is still validating the protocol. Workers that get no spec exit without
    running anything.
    """

    def __init__(self, argv: list[str], expected: int, preload: Sequence[str] = ()) -> None:
        self.expected = expected
        self.sent: dict | None = None         # the spec, once sent (it goes once: stdin is closed then)
        self.protocol: Any = None             # the Protocol it was built from, when sent before the launcher's
        self.step = StepResult()
        self.complete = threading.Event()
        self.wire = Reassembler()
        env = dict(os.environ, **{PRELOAD_ENV: ",".join(preload)})
        # TERM when the launcher dies, even by SIGKILL (hpcml run's re-vet included): srun
        # then ends the workers' step instead of leaving it to the checks' own timeouts
        libc()                           # loaded here, not in the forked child (other threads may run)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
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
        port = done[1].get("free_port")
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            report.free_port = port
        self.step.reports[report.node] = report
        progress.advance("vetting nodes", len(self.step.reports), self.expected)
        if len(self.step.reports) >= self.expected:
            self.complete.set()

    def _on_stderr(self, line: str) -> None:
        if len(self.step.stderr) < 200:
            self.step.stderr.append(line)

    def send(self, spec: dict | None) -> None:
        assert self.proc.stdin is not None  # stdin=PIPE
        if spec is not None:
            self.sent = spec
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
            slurm.stop_step(self.proc, term_wait=1.0)

    def harvest(self, deadline_at: float) -> StepResult:
        """Results of every node, returned as soon as all reported or at the deadline."""
        # an Event, not proc.wait(timeout): that polls with sleeps of up to 50 ms
        # capped: a deadline that is not finite (the models refuse one) must not overflow the wait
        wait = min(max(0.1, deadline_at - time.time() + SRUN_GRACE), threading.TIMEOUT_MAX)
        if not self.complete.wait(timeout=wait):
            self.step.timed_out = True
            slurm.stop_step(self.proc, term_wait=1.0)
        if len(self.step.reports) >= self.expected:
            # every node answered: srun's own end (its tasks' exit, its I/O's teardown, tens
            # of ms) tells the verdict nothing, so it is waited for beside the run, not before
            threading.Thread(target=self._reap, name="hpcml-vet-reap", daemon=True).start()
            return self.step
        try:
            self.step.returncode = self.proc.wait(timeout=SRUN_GRACE)
        except subprocess.TimeoutExpired:
            slurm.stop_step(self.proc, term_wait=1.0)
        for t in self.readers:
            t.join(timeout=1.0)
        return self.step


    def _reap(self) -> None:
        """srun's end, after every node answered: its exit status kept, and the step
        stopped where it outlives its workers by ``SRUN_GRACE``."""
        try:
            self.step.returncode = self.proc.wait(timeout=SRUN_GRACE)
        except subprocess.TimeoutExpired:
            slurm.stop_step(self.proc, term_wait=1.0)


def start_workers(nodes: list[str], python: str | None = None, *, use_srun: bool = True,
                  preload: Sequence[str] = ()) -> Step:
    python = python or sys.executable
    argv = _srun_argv(nodes, python) if use_srun else _worker_command(python)
    return Step(argv, len(nodes) if use_srun else 1, list(preload))


def _worker_command(python: str) -> list[str]:
    """The worker, started with ``-S`` and this interpreter's own ``sys.path`` when it is
    this interpreter: site's .pth processing costs each worker 20-30 ms. Another
    interpreter (the checks' venv) starts normally."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return [python, "-S", "-c", _BOOT.format(path=[p for p in sys.path if p])]
    return [python, "-m", "hpcml.vet.worker"]


def preload_hint(path: str | Path) -> list[str]:
    """The check classes a protocol file probably names, read without validating it, so
    workers can import them while the launcher validates. A wrong guess costs nothing."""
    from hpcml.vet import registry, vetnode_compat
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for name in dict.fromkeys(re.findall(r"\btype:\s*['\"]?([\w.:-]+)", text)):
        try:
            if vetnode_compat.is_vetnode(name):
                name = vetnode_compat.MAPPING[name[len("vetnode.evaluations."):]][0]
            out.append(registry.resolve(name))
        except (LookupError, KeyError):
            continue
    return out
