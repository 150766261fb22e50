"""hpcml vet against vetnode 0.1.5, side by side, on the 2-node local Slurm cluster.

    python benchmarks/bench_vet.py [--runs 15]

Starts the local cluster (hpcml.testing.localslurm), installs vetnode 0.1.5 in its own venv
(plus tabulate, which it imports but does not declare), then inside one 2-node allocation
alternates, run after run: `srun true` (the floor), vetnode's nearest equivalent protocol
(env-var and TCP checks, tests/fixtures/vetnode/cpu-equivalent.yaml) and `hpcml vet` with the
CPU example protocol. Wall time is the whole command, as a job script sees it. Then it
times the verdict and report for 10,000 synthetic nodes. Prints a table and ratios and
writes benchmarks/results/vet.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from measure import compile_sources  # noqa: E402 - beside this file

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / ".work"
VETNODE_VENV = WORK / "vetnode-venv"


def _vetnode() -> Path:
    exe = VETNODE_VENV / "bin" / "vetnode"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VETNODE_VENV)], check=True)
        subprocess.run([str(VETNODE_VENV / "bin" / "pip"), "install", "-q", "vetnode==0.1.5",
                        "tabulate"], check=True)
    return exe


def _timed(argv: list[str], env: dict, cwd: Path, timeout: float = 120) -> tuple[float, int]:
    start = time.perf_counter()
    try:
        rc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    return time.perf_counter() - start, rc


def inner(runs: int, vetnode: str, ctld_port: int) -> dict:
    """Runs inside the allocation: alternate the three commands."""
    work = Path(tempfile.mkdtemp(prefix="hpcml-bench-"))
    proto = (ROOT / "tests/fixtures/vetnode/cpu-equivalent.yaml").read_text()
    (work / "vn.yaml").write_text(proto.replace("port: 6917", f"port: {ctld_port}"))
    env = dict(os.environ)
    cmds = {
        "srun true": ["srun", "-N2", "--ntasks-per-node=1", "true"],
        "vetnode 0.1.5": ["srun", "-N2", "--ntasks-per-node=1", vetnode, "diagnose", "--skip-install",
                          str(work / "vn.yaml")],
        "hpcml vet": [sys.executable, "-m", "hpcml", "vet", str(ROOT / "examples/vet/cpu.yaml"),
                      "--out", str(work / "out")],
    }
    for argv in cmds.values():  # warm-up: page cache, slurmd's first step
        _timed(argv, env, work)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    codes: dict[str, list[int]] = {k: [] for k in cmds}
    for _ in range(runs):
        for name, argv in cmds.items():
            t, rc = _timed(argv, env, work)
            times[name].append(t)
            codes[name].append(rc)
    return {"times": times, "codes": codes}


def synthetic(n: int = 10_000) -> dict:
    """Verdict, JSON report, exclude files and table for ``n`` nodes x 7 checks."""
    from hpcml.vet import report, verdict
    from hpcml.vet.engine import VetRun
    from hpcml.vet.model import CheckResult, NodeReport, Outcome
    from hpcml.vet.protocol import load
    proto = load(ROOT / "examples/vet/cpu.yaml")
    nodes = [f"nid{i:06d}" for i in range(n)]
    reports = {}
    for i, node in enumerate(nodes):
        outcome = Outcome.FAIL if i % 997 == 0 else Outcome.PASS
        reports[node] = NodeReport(node=node, results=[
            CheckResult(node=node, check=e.name, type=e.type, outcome=outcome, value=1.0,
                        threshold="x", duration=0.01, message="m") for e in proto.evals])
    start = time.perf_counter()
    v = verdict.decide(nodes, reports, {e.name: True for e in proto.evals}, n - 20)
    run = VetRun(protocol=proto, nodes=nodes, reports=reports, verdict=v, started_at=0, duration=0)
    with tempfile.TemporaryDirectory() as tmp:
        report.write_outputs(run, tmp)
    from rich.console import Console
    Console(file=open(os.devnull, "w"), width=200).print(report.table(run))
    elapsed = time.perf_counter() - start
    return {"nodes": n, "seconds": elapsed, "decision": v.decision.value, "bad": len(v.bad)}


def _summary(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times),
            "slow_runs_over_2s": sum(t > 2 for t in times), "runs": len(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--vetnode", default="")
    ap.add_argument("--ctld-port", type=int, default=0)
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(args.runs, args.vetnode, args.ctld_port)))
        return
    print(compile_sources())
    from hpcml.testing.localslurm import LocalSlurm
    WORK.mkdir(parents=True, exist_ok=True)
    vetnode = _vetnode()
    with LocalSlurm(Path("/tmp/hpcml-slurm-bench"), ctld_port=6957, first_slurmd_port=6961) as cluster:
        env = cluster.client_env()
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        out = subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", sys.executable, __file__,
                              "--inner", "--runs", str(args.runs), "--vetnode", str(vetnode),
                              "--ctld-port", str(cluster.ctld_port)],
                             env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"benchmark failed: {out.stderr[-2000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    summary = {k: _summary(v) for k, v in data["times"].items()}
    synth = synthetic()
    print(f"{'command':16} {'median s':>9} {'min':>7} {'max':>7} {'>2 s':>5}  exit codes")
    for name, s in summary.items():
        codes = sorted(set(data["codes"][name]))
        print(f"{name:16} {s['median']:9.3f} {s['min']:7.3f} {s['max']:7.3f} {s['slow_runs_over_2s']:5d}  {codes}")
    hp, vn = summary["hpcml vet"], summary["vetnode 0.1.5"]
    print(f"hpcml/vetnode median ratio: {hp['median'] / vn['median']:.2f}; "
          f"max ratio: {hp['max'] / vn['max']:.2f}")
    print(f"verdict + report for {synth['nodes']} nodes: {synth['seconds']:.3f} s ({synth['decision']}, {synth['bad']} bad)")
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "vet.json").write_text(json.dumps({"summary": summary, "raw": data, "synthetic": synth,
                                                  "ratio_median": hp["median"] / vn["median"]}, indent=1))


if __name__ == "__main__":
    main()
