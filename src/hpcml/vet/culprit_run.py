"""The culprit search on a real allocation: each group test is one srun step, all of a
round's steps run at once, each with its own rendezvous directory.

A step runs this module (``python -m hpcml.vet.culprit_run SPEC``) once per task; it runs
the protocol's own collective check through the worker (forked, under the check's
timeout) with the rank and world size taken from srun, so one node can run a collective
on its own with two tasks. Rank 0 prints the result as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpcml.cluster import slurm
from hpcml.cluster.hostlist import fold
from hpcml.cluster.ranks import slurm_ranks
from hpcml.vet import culprit
from hpcml.vet.launch import SRUN_GRACE
from hpcml.vet.model import NodeReport, Outcome
from hpcml.vet.protocol import EvalSpec

_MARK = "HPCML-CULPRIT "


class SrunMeasure:
    """``measure`` for :func:`hpcml.vet.culprit.search`: one srun step per group."""

    def __init__(self, ev: EvalSpec, workdir: Path, python: str, deadline_at: float) -> None:
        self.ev, self.workdir, self.python, self.deadline_at = ev, workdir, python, deadline_at
        self.round = 0

    def _argv(self, group: list[str], spec: dict) -> list[str]:
        per_node = 2 if len(group) == 1 else 1  # one node alone: two ranks on it
        return slurm.srun_argv(
            [self.python, "-m", "hpcml.vet.culprit_run", json.dumps(spec)], nodes=group,
            ntasks_per_node=per_node,
            extra=["--overlap", "--overcommit", "--kill-on-bad-exit=0", "--mpi=none",
                   "--input=none", "--job-name=hpcml-vet-culprit"])

    def __call__(self, groups: list[list[str]]) -> dict[int, float | None]:
        self.round += 1
        ends = min(self.deadline_at, time.time() + self.ev.timeout)
        procs = []
        for i, group in enumerate(groups):
            rdv = self.workdir / f"round{self.round}-group{i}"
            rdv.mkdir(parents=True, exist_ok=True)
            spec = {"eval": self.ev.to_dict(), "group": group, "workdir": str(rdv),
                    "deadline_at": ends}
            procs.append(subprocess.Popen(self._argv(group, spec), stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True,
                                          start_new_session=True))
        out: dict[int, float | None] = {}
        for i, proc in enumerate(procs):
            try:
                stdout, _ = proc.communicate(timeout=max(0.1, ends - time.time() + SRUN_GRACE))
            except subprocess.TimeoutExpired:
                slurm.stop_step(proc, term_wait=1.0)
                stdout = ""
            out[i] = _bandwidth(stdout)
        return out


def _bandwidth(stdout: str) -> float | None:
    """Bytes/s from rank 0's line; None when the collective did not complete."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(_MARK):
            r = json.loads(line[len(_MARK):])
            if r["outcome"] in ("pass", "fail", "warn") and isinstance(r["value"], (int, float)):
                return float(r["value"]) * 1e9  # the check reports GB/s
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    from hpcml.cluster.allocation import this_node
    from hpcml.vet.worker import run_check
    spec = json.loads((argv or sys.argv[1:])[0])
    who = slurm_ranks()
    rank, ntasks = who.rank, who.world_size
    group = spec["group"]
    per_node = max(1, ntasks // len(group))
    ranks = tuple(n for n in group for _ in range(per_node))  # srun's block distribution
    ctx = {"node": this_node(), "nodes": ranks, "rank": rank, "workdir": spec["workdir"],
           "gpus": (), "require_gpus": False}
    result = run_check(spec["eval"], ctx, spec["deadline_at"])
    if rank == 0:
        print(_MARK + json.dumps({"outcome": result.outcome.value, "value": result.value,
                                  "message": result.message}), flush=True)
    return 0


def _failed_collectives(evals: list[EvalSpec], reports: dict[str, NodeReport]):
    for ev in evals:
        if ev.type != "collective" or not ev.params.get("culprit_search", True):
            continue
        results = {n: r for n, rep in reports.items() for r in rep.results if r.check == ev.name}
        failed = [n for n, r in results.items()
                  if r.outcome is Outcome.FAIL or (r.outcome is Outcome.ERROR and
                                                   not r.message.startswith("missing dependency"))]
        if len(failed) >= 2:
            yield ev, results


def find_culprits(evals: list[EvalSpec], nodes: list[str], reports: dict[str, NodeReport],
                  deadline_at: float, workdir: str | None, use_srun: bool,
                  python: str) -> list[str]:
    """Search every failed allocation-wide collective among ``nodes``, mark the results in
    ``reports``; return notes for the run."""
    notes = []
    for ev, results in _failed_collectives(evals, reports):
        if not use_srun:
            notes.append(f"{ev.name}: no culprit search outside srun")
            continue
        searched = [n for n in nodes if n in results]
        measure = SrunMeasure(ev, Path(workdir or ".") / f"culprit-{ev.name}", python,
                              deadline_at)
        res = culprit.search(searched, measure, threshold=ev.params.get("min_bandwidth"),
                             min_relative=ev.min_relative, rounds=ev.params.get("culprit_rounds"),
                             deadline_at=deadline_at, clock=time.time)
        _mark(res, results)
        notes.append(f"culprit search for '{ev.name}' over {fold(searched, sort=True)}: {res.conclusion}")
    return notes


def _mark(res: culprit.Search, results: dict) -> None:
    took = f"rounds {res.rounds}, {res.seconds:.1f} s"
    for node, r in results.items():
        r.details["culprit_search"] = res.to_dict() if node == next(iter(results)) else {
            "culprits": res.culprits, "rounds": res.rounds, "seconds": round(res.seconds, 3)}
        if node in res.culprits:
            r.outcome = Outcome.FAIL
            r.message = f"culprit: slow in {res.slow_tests[node]} group tests ({took}); {r.message}"
        elif res.culprits and node in res.cleared:
            # the allocation-wide result was the culprits' doing; this node passed its groups
            r.outcome = Outcome.PASS
            r.message = (f"cleared: passed its group tests; the allocation-wide result was "
                         f"held back by {fold(res.culprits, sort=True)} ({took}); {r.message}")


if __name__ == "__main__":
    sys.exit(main())
