"""`hpcml run` (vet + launch + record + report) against plain `srun python train.py`.

    python benchmarks/bench_run.py [--runs 10]

Starts the local 2-node cluster (hpcml.testing.localslurm) and, inside one 2-node
allocation, alternates run after run: `srun -N2 python train.py` alone, and `hpcml run
--vet examples/vet/cpu.yaml -- python train.py`, which ends by printing the job's report
and writing report.html (the report included). train.py is examples/observe/train.py (100 steps,
numpy; ~2.5 s). Prints the medians and hpcml's added wall time, and where hpcml's time
goes in each run (``parts``, from the run's own records: the vet report's start and
duration, each rank's recorder start and end, the run's end): the launcher's start-up
(interpreter, imports, the job directory), vetting, launch (rendezvous probe, the srun step,
each task wrapper's start-up until it starts the rank; the latest rank counts), the ranks'
own run, and the tail (the last rank's end to hpcml's exit: the recorders' close and the
report). Warm caches: hpcml's sources compiled to bytecode first (as ``pip install``
leaves them; ``measure.compile_sources``), then one warm-up run of each command before the
timed ones (page cache, slurmd's first step). Writes benchmarks/results/run.json.
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
TRAIN = [sys.executable, str(ROOT / "examples/observe/train.py"), "--steps", "100"]


def _timed(argv: list[str], env: dict, cwd: Path, timeout: float = 300) -> tuple[float, int]:
    start = time.perf_counter()
    # stdin /dev/null, as sbatch gives a job script (srun copies its stdin to the tasks)
    rc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=timeout,
                        stdin=subprocess.DEVNULL).returncode
    return time.perf_counter() - start, rc


def parts(d: Path, began: float, exited: float) -> dict[str, float]:
    """Where one ``hpcml run``'s wall time went, from its own records (wall-clock times)."""
    vet = json.loads((d / "vet" / "report.json").read_text()) if (d / "vet" / "report.json").exists() else None
    ranks = [json.loads(p.read_text()) for p in sorted((d / "observe").glob("rank-*.json"))]
    vet_start = float(vet["started_at"]) if vet else json.loads((d / "run.json").read_text())["started"]
    vet_end = vet_start + (float(vet["duration"]) if vet else 0.0)
    first, last = max(r["start"] for r in ranks), max(r["end"] for r in ranks)
    return {"start-up": vet_start - began, "vetting": vet_end - vet_start, "launch": first - vet_end,
            "ranks": last - first, "tail (report)": exited - last}


def inner(runs: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hpcml-bench-run-"))
    env = dict(os.environ)
    hpcml = [sys.executable, "-m", "hpcml"]

    def plain() -> tuple[float, int]:
        return _timed(["srun", "-N2", "--ntasks-per-node=1", *TRAIN], env, work)

    split: list[dict[str, float]] = []
    phases: list[list[dict]] = []

    def wrapped(i: int) -> tuple[float, int]:
        d = work / f"run{i}"                # hpcml run prints the report and writes report.html itself
        began = time.time()
        out = _timed([*hpcml, "run", "--vet", str(ROOT / "examples/vet/cpu.yaml"), "--dir", str(d), "--", *TRAIN],
                     env, work)
        if i >= 0 and out[1] == 0:
            split.append(parts(d, began, time.time()))
            phases.append(json.loads((d / "run.json").read_text()).get("phases") or [])
        return out

    plain(), wrapped(-1)                                    # warm-up: page cache, slurmd's first step
    times: dict[str, list[float]] = {"srun python train.py": [], "hpcml run (report incl.)": []}
    codes: dict[str, list[int]] = {k: [] for k in times}
    for i in range(runs):
        for name, fn in (("srun python train.py", plain), ("hpcml run (report incl.)", lambda i=i: wrapped(i))):
            t, rc = fn()
            times[name].append(t)
            codes[name].append(rc)
    return {"times": times, "codes": codes, "parts": split, "phases": phases}


def phase_medians(runs: list[list[dict]]) -> dict[str, dict[str, float]]:
    """The launcher's own phases (run.json's ``phases``), each one's median wall and CPU
    seconds and its median start after the first phase's, over the runs that had it."""
    out: dict[str, dict[str, float]] = {}
    names = list(dict.fromkeys(p["name"] for run in runs for p in run))
    for name in names:
        rows = [(p, run[0]["start"]) for run in runs for p in run if p["name"] == name and run]
        out[name] = {"at_s": statistics.median(p["start"] - t0 for p, t0 in rows),
                     "wall_s": statistics.median(p["wall_s"] for p, _ in rows),
                     "cpu_s": statistics.median(p["cpu_s"] for p, _ in rows)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(args.runs)))
        return
    caches = compile_sources()
    print(caches)
    from hpcml.testing.localslurm import LocalSlurm
    with LocalSlurm(Path("/tmp/hpcml-slurm-bench"), ctld_port=6957, first_slurmd_port=6961) as cluster:
        env = cluster.client_env()
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        out = subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", sys.executable, __file__, "--inner",
                              "--runs", str(args.runs)], env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"benchmark failed: {out.stderr[-2000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": len(v)}
               for k, v in data["times"].items()}
    for name, s in summary.items():
        print(f"{name:22} median {s['median']:.3f} s  min {s['min']:.3f}  max {s['max']:.3f}  "
              f"exit codes {sorted(set(data['codes'][name]))}")
    base, hp = summary["srun python train.py"], summary["hpcml run (report incl.)"]
    added = hp["median"] - base["median"]
    print(f"hpcml run (report included) adds {added:.3f} s in the median (ratio {hp['median'] / base['median']:.2f}); "
          f"worst run adds {hp['max'] - base['median']:.3f} s")
    split = {k: statistics.median(p[k] for p in data["parts"]) for k in (data["parts"] or [{}])[0]}
    print("where hpcml run's time goes (medians, s): " + ", ".join(f"{k} {v:.3f}" for k, v in split.items()))
    launcher = phase_medians(data.get("phases") or [])
    print("the launcher's phases (medians: starts after its start-up began, wall, its CPU; s):")
    for name, m in launcher.items():
        print(f"  {name:20} at {m['at_s']:6.3f}  wall {m['wall_s']:6.3f}  cpu {m['cpu_s']:6.3f}")
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "run.json").write_text(json.dumps({"summary": summary, "raw": data, "added_median_s": added,
                                                  "parts_median_s": split,
                                                  "launcher_phases_median": launcher, "caches": caches}, indent=1))


if __name__ == "__main__":
    main()
