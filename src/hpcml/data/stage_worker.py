"""Staging on every node of an allocation: one ``python -m hpcml.data.stage_worker`` per node,
started by ``stage_nodes`` with srun from the batch script.

The worker stages its node (``hpcml.data.stage.stage``) and prints one result line on
stdout, which srun carries back; with ``--progress`` it also prints its bytes done now and
then, for the launcher's progress bar. The worker does not depend on the CLI's wiring, so
srun starts it the same way whatever commands ``hpcml`` mounts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TypedDict

from hpcml.cluster import slurm
from hpcml.data.stage import THREADS, StageResult, source_bytes, source_of, stage
from hpcml.errors import HpcmlError, SlurmError, UsageError
from hpcml.schemas import tag

RESULT = "hpcml-stage-result "
PROGRESS = "hpcml-stage-progress "
PROGRESS_EVERY = 0.5


@dataclass
class AllocationStage:
    """Every node's result, and the one path the job's tasks should read."""

    src: str
    path: str
    staged: bool
    results: dict[str, StageResult] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"schema": tag("data.stage", 1), "src": self.src, "path": self.path, "staged": self.staged,
                "seconds": round(self.seconds, 3), "notes": self.notes,
                "nodes": {n: r.to_dict() for n, r in self.results.items()}}


def combine(src: str, results: dict[str, StageResult], seconds: float = 0.0) -> AllocationStage:
    """The path for all tasks: the staged copy if every node has it at the same path, else
    (some node streams) the source; per-node paths stay in the results."""
    out = AllocationStage(src=src, path=src, staged=False, results=results, seconds=seconds)
    if results and all(r.staged for r in results.values()):
        paths = {r.path for r in results.values()}
        out.staged, out.path = True, next(iter(results.values())).path
        if len(paths) > 1:
            out.notes.append(f"the staged copy is at a different path on each node; {out.path} is "
                             f"{next(iter(results))}'s (use a DIR without %n to get one path)")
    elif results:
        streaming = [n for n, r in results.items() if not r.staged]
        if len(streaming) < len(results):
            out.notes.append(f"{', '.join(streaming)} could not stage, so every node streams from {src}")
    return out


# --- the worker ---------------------------------------------------------------------------

def worker_argv(src: str, to: str | None, *, threads: int = THREADS, verify: bool = False,
                keep_free: int | None = None, progress: bool = False, python: str | None = None) -> list[str]:
    argv = [python or sys.executable, "-m", "hpcml.data.stage_worker", src, f"--threads={threads}"]
    if to:
        argv.append(f"--to={to}")
    if verify:
        argv.append("--verify")
    if keep_free is not None:
        argv.append(f"--keep-free={keep_free}")
    if progress:
        argv.append("--progress")
    return argv


class _Ticker:
    """Bytes done, printed at most every PROGRESS_EVERY s (called from the copy threads)."""

    def __init__(self, node: str) -> None:
        self.node, self.done, self.total, self.last = node, 0, 0, 0.0
        self.lock = threading.Lock()

    def plan(self, total: int) -> None:
        self.total = total
        self.emit()

    def advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            if time.monotonic() - self.last >= PROGRESS_EVERY:
                self.emit()

    def emit(self) -> None:
        self.last = time.monotonic()
        print(f"{PROGRESS}{self.node} {self.done} {self.total}", flush=True)


class _Hooks(TypedDict, total=False):
    on_plan: Callable[[int], None]
    advance: Callable[[int], None]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcml.data.stage_worker",
                                description="Stage a shard set on this node; print one JSON result line.")
    p.add_argument("src")
    p.add_argument("--to")
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--keep-free", type=int)
    p.add_argument("--progress", action="store_true")
    a = p.parse_args(argv)
    from hpcml.cluster.allocation import this_node
    tick = _Ticker(this_node())
    kw: _Hooks = {"on_plan": tick.plan, "advance": tick.advance} if a.progress else {}
    try:
        line = {"ok": True, **stage(a.src, a.to, threads=a.threads, verify=a.verify, keep_free=a.keep_free,
                                    **kw).to_dict()}
    except HpcmlError as exc:
        line = {"ok": False, "node": tick.node, "error": str(exc), "exit_code": exc.exit_code}
    if a.progress:
        tick.emit()
    print(RESULT + json.dumps(line), flush=True)
    return 0


# --- the launcher -------------------------------------------------------------------------

def _result(d: dict) -> StageResult:
    d = {k: v for k, v in d.items() if k not in ("ok", "mb_per_s")}
    return StageResult(**d)


def stage_nodes(src: str | Path, to: str | None, nodes: Sequence[str], *, threads: int = THREADS,
                verify: bool = False, keep_free: int | None = None,
                on_progress: Callable[[str, int, int], None] | None = None) -> AllocationStage:
    """One srun step, one task per node, each staging its node; every node must answer.

    A node's bad-input error (checksum mismatch, missing shard) is raised as UsageError
    naming the node and the file; a node without an answer is a SlurmError.
    """
    source_bytes(src)                      # bad input (no manifest, no token arrays): one line, before any step starts
    srcdir = source_of(src)
    argv = slurm.srun_argv(worker_argv(srcdir, to, threads=threads, verify=verify, keep_free=keep_free,
                                       progress=on_progress is not None),
                           nodes=list(nodes), ntasks_per_node=1,
                           extra=["--kill-on-bad-exit=0", "--overlap", "--mpi=none",
                                  "--job-name=hpcml-stage"])
    if not slurm.available("srun"):
        raise SlurmError("srun: Slurm is not installed or not on PATH")
    t0 = time.monotonic()
    results: dict[str, StageResult] = {}
    errors: list[dict] = []
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None  # stdout=PIPE
    try:
        for line in proc.stdout:
            if line.startswith(RESULT):
                d = json.loads(line[len(RESULT):])
                if d.get("ok"):
                    results[d["node"]] = _result(d)
                else:
                    errors.append(d)
            elif line.startswith(PROGRESS) and on_progress:
                node, done, total = line[len(PROGRESS):].split()
                on_progress(node, int(done), int(total))
            else:
                sys.stderr.write(line)
        rc = proc.wait()
    except BaseException:
        slurm.stop_step(proc, term_wait=5.0)
        raise
    if errors:
        first = errors[0]
        msg = f"{first['node']}: {first['error']}" + (f" (and {len(errors) - 1} more node(s))" if len(errors) > 1 else "")
        raise UsageError(msg) if first.get("exit_code") == 2 else HpcmlError(msg)
    missing = [n for n in nodes if n not in results]
    if missing:
        raise SlurmError(f"{', '.join(missing)}: no result from the staging step (srun exit {rc})")
    return combine(srcdir, {n: results[n] for n in nodes}, time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main())
