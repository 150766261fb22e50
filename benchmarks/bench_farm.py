"""`hpcml farm run` against GNU Parallel on one task list; and tasks/s under Slurm.

    python benchmarks/bench_farm.py [--tasks 10000] [--slots 2] [--runs 1] [--no-slurm]

The task list is N lines of `true`, the same file for both. Each run is the whole command
as a job script sees it, the tools alternated run after run:

- GNU Parallel (Debian's `parallel`): `parallel -j SLOTS --joblog FILE < tasks.txt` (the
  joblog is what records each task's exit code and times, as the farm does) and plain
  `parallel -j SLOTS < tasks.txt`.
- hpcml: `hpcml farm run FARM --slots SLOTS` on a fresh farm (`hpcml farm create` is timed
  apart): claims, end records, per-task stdout/stderr files, heartbeats included.

Per-task overhead = wall x slots / N - the bare cost of running `true` once (posix_spawn +
waitpid from a small Python loop, measured here first). Under Slurm (a private 2-node
local cluster, hpcml.testing.localslurm, ports of its own): one 2-node allocation with
2 tasks per node, `hpcml farm run` (srun of one agent per node, 2 workers each): tasks/s
over the whole command, and from the first start to the last end in the end records.
Writes benchmarks/results/farm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HPCML = [sys.executable, "-m", "hpcml"]


def bare_true_ms(n: int = 2000) -> float:
    true = shutil.which("true") or "/bin/true"
    t = time.perf_counter()
    for _ in range(n):
        pid = os.posix_spawn(true, [true], os.environ)
        os.waitpid(pid, 0)
    return (time.perf_counter() - t) / n * 1000


def _timed(argv: list[str], stdin: Path | None = None, env: dict | None = None, timeout: float = 3600) -> float:
    t = time.perf_counter()
    with open(stdin or os.devnull, "rb") as f:
        p = subprocess.run(argv, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=timeout)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    return wall


def local(work: Path, n: int, slots: int, runs: int) -> dict:
    tasks = work / "tasks.txt"
    tasks.write_text("true\n" * n)
    parallel = shutil.which("parallel")
    times: dict[str, list[float]] = {"hpcml farm run": [], "hpcml farm create": []}
    if parallel:
        times["parallel --joblog"] = []
        times["parallel"] = []
    else:
        print("GNU parallel not found (apt-get install parallel): not measured", file=sys.stderr)
    for r in range(runs):
        farm = work / f"farm{r}"
        shutil.rmtree(farm, ignore_errors=True)
        times["hpcml farm create"].append(_timed([*HPCML, "farm", "create", str(farm), str(tasks)]))
        times["hpcml farm run"].append(_timed([*HPCML, "farm", "run", str(farm), "--slots", str(slots)]))
        shutil.rmtree(farm)
        if parallel:
            log = work / f"joblog{r}"
            times["parallel --joblog"].append(_timed([parallel, "-j", str(slots), "--joblog", str(log)], tasks))
            times["parallel"].append(_timed([parallel, "-j", str(slots)], tasks))
    return times


def slurm(work: Path, n: int) -> dict:
    from hpcml.testing.localslurm import LocalSlurm
    farm = work / "slurmfarm"
    shutil.rmtree(farm, ignore_errors=True)
    (work / "tasks.txt").write_text("true\n" * n)
    subprocess.run([*HPCML, "farm", "create", str(farm), str(work / "tasks.txt")], check=True, capture_output=True)
    with LocalSlurm(Path("/tmp/hpcml-slurm-farmbench"), ctld_port=6977, first_slurmd_port=6981) as cluster:
        env = cluster.client_env()
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        wall = _timed(["salloc", "-N2", "--ntasks-per-node=2", *HPCML, "farm", "run", str(farm)], env=env)
    ends = [json.loads(f.read_text()) for f in (farm / "ends").iterdir() if not f.name.startswith(".")]
    ok = sum(e["outcome"] == "ok" for e in ends)
    span = max(e["end"] for e in ends) - min(e["start"] for e in ends)
    workers = len({e["worker"] for e in ends})
    return {"tasks": n, "ok": ok, "wall_s": wall, "tasks_per_s_wall": n / wall, "span_s": span,
            "tasks_per_s_span": n / span, "workers": workers, "nodes": sorted({e["node"] for e in ends})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--slots", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--no-slurm", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as tmp:
        work = Path(tmp)
        bare = bare_true_ms()
        times = local(work, args.tasks, args.slots, args.runs)
        summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": len(v)}
                   for k, v in times.items()}
        print(f"{args.tasks} tasks of `true`, {args.slots} slots; bare `true` costs {bare:.2f} ms")
        for name, s in summary.items():
            per = s["median"] * args.slots / args.tasks * 1000
            extra = "" if name == "hpcml farm create" else \
                f"  slot-ms/task {per:.2f}  overhead/task {per - bare:.2f} ms  {args.tasks / s['median']:.0f} tasks/s"
            print(f"{name:20} median {s['median']:.2f} s  min {s['min']:.2f}  max {s['max']:.2f}{extra}")
            if name != "hpcml farm create":
                s["overhead_ms_per_task"] = per - bare
        if "parallel --joblog" in summary:
            for other in ("parallel --joblog", "parallel"):
                ratio = summary["hpcml farm run"]["overhead_ms_per_task"] / summary[other]["overhead_ms_per_task"]
                print(f"overhead hpcml farm run / {other}: {ratio:.2f}")
        result: dict = {"tasks": args.tasks, "slots": args.slots, "bare_true_ms": bare, "summary": summary,
                        "raw": times}
        if not args.no_slurm:
            s = slurm(work, args.tasks)
            print(f"Slurm, 2 nodes x 2 workers: {s['ok']}/{s['tasks']} ok, {s['wall_s']:.2f} s for the whole "
                  f"`hpcml farm run` ({s['tasks_per_s_wall']:.0f} tasks/s), {s['tasks_per_s_span']:.0f} tasks/s "
                  f"from first start to last end; {s['workers']} workers on {', '.join(s['nodes'])}")
            result["slurm"] = s
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "farm.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
