"""`hpcml run`'s live watch: time from fault to detection and to culprit named, and what
the watch costs the launcher at 1,024 ranks; NVRx's straggler detector beside it.

    python benchmarks/bench_watch.py [--runs 3] [--ranks 1024] [--seconds 60]

1. Faults: tests/run/faulty_ddp.py on 2 local ranks (torch CPU, gloo), rank 1 going wrong at
   step 30: stuck before its all_reduce, in the data loader, in a C call holding the GIL,
   exiting 1. ``--hang-timeout 10s`` (the default, at least 120 s, only adds the same 110 s
   to every hang figure). From run.json: a hang's ``began`` (the last step any rank
   completed), ``detected`` and ``named``; a crash's rank end (its recorder's metadata) and
   ``detected``.
2. Launcher cost: 1,024 simulated ranks (one writer process rewriting each rank's heartbeat
   once a second, as each recorder does, at 10 steps/s with ``step`` section times), the
   watch polled as the launcher does (every 50 ms) for ``--seconds``; the watch's CPU time
   (this process: ``time.process_time``) over the wall time, in % of one core. One rank is
   made 1.5x slower half way: when it is named is the live straggler's detection time.
3. NVRx (nvidia-resiliency-ext 0.4.1, the newest on PyPI for Python 3.11) is tried on CPU.

Writes benchmarks/results/watch.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tests" / "run" / "faulty_ddp.py"
HANG_TIMEOUT = 10.0


def fault_run(fault: str, work: Path, i: int) -> dict:
    d = work / f"{fault}-{i}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(FAULT=fault, PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    start = time.time()
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--dir", str(d), "--no-report",
                        "--hang-timeout", f"{HANG_TIMEOUT:g}s", "--kill-grace", "5", "--", sys.executable, str(TASK)],
                       env=env, capture_output=True, text=True, timeout=600, cwd=work)
    run = json.loads((d / "run.json").read_text())
    out: dict = {"fault": fault, "exit_code": p.returncode, "wall_s": round(time.time() - start, 2)}
    if run.get("hang"):
        h = run["hang"]
        culprits = [c["rank"] for c in h["verdict"]["culprits"]]
        out.update(detected_s=round(h["detected"] - h["began"], 2), named_s=round(h["named"] - h["began"], 2),
                   beyond_timeout_s=round(h["detected"] - h["began"] - HANG_TIMEOUT, 2),
                   culprits=culprits, method=h["verdict"]["method"],
                   line=h["verdict"]["culprits"][0]["where"] if culprits else None)
    crash = next((e for e in run.get("timeline") or [] if e["kind"] == "crash"), None)
    if crash:
        meta = json.loads((d / "observe" / f"rank-{crash['rank']:05d}.json").read_text())
        out.update(culprits=[crash["rank"]], detected_s=round(crash["detected"] - meta["end"], 2), method="exit code")
    return out


def _writer(observe: str, ranks: int, seconds: float, slow_rank: int, stop_at: float) -> None:
    """All ranks' recorders: each heartbeat rewritten once a second, 10 steps/s each."""
    from hpcml.observe.beat import BeatWriter, Progress
    progress = {r: Progress() for r in range(ranks)}
    writers = {r: BeatWriter(Path(observe), r, f"n{r // 4:04d}") for r in range(ranks)}
    t0, step = time.time(), 0
    while time.time() < stop_at:
        now = time.time()
        for _ in range(10):
            half = now - t0 > seconds / 2
            for r, p in progress.items():
                slow = 1.5 if half and r == slow_rank else 1.0
                p.update([now], ["section"], ["step"], [0.1 * slow * (1 + 0.01 * ((step + r) % 7))], [step])
            step += 1
        for r, w in writers.items():
            w.write(progress[r])
        time.sleep(max(0.0, 1.0 - (time.time() - now)))


def launcher_cost(ranks: int, seconds: float) -> dict:
    from hpcml.run.watch import Watch, period_for
    work = Path(tempfile.mkdtemp(prefix="hpcml-bench-watch-"))
    slow_rank = ranks // 3
    start = time.time()
    writer = multiprocessing.Process(target=_writer, args=(str(work / "observe"), ranks, seconds, slow_rank,
                                                            start + seconds + 5))
    writer.start()
    time.sleep(5)                                # the first records are out
    watch = Watch(work, 0, ranks, timeout=3600)
    cpu0, wall0 = time.process_time(), time.time()
    scans, slowest = 0, 0.0
    onset = start + seconds / 2
    named_at = None
    while time.time() < wall0 + seconds:
        t = time.process_time()
        before = watch._next
        watch.poll()
        if watch._next != before:
            scans += 1
            slowest = max(slowest, time.process_time() - t)
        if watch.stragglers and named_at is None:
            named_at = time.time()
        time.sleep(0.05)
    cpu = time.process_time() - cpu0
    wall = time.time() - wall0
    writer.join()
    found = list(watch.stragglers)
    return {"ranks": ranks, "seconds": round(wall, 1), "period_s": period_for(ranks), "scans": scans,
            "launcher_cpu_percent_of_one_core": round(100 * cpu / wall, 2),
            "slowest_scan_cpu_ms": round(1000 * slowest, 1),
            "straggler_named": found, "straggler_expected": slow_rank,
            "straggler_named_after_onset_s": round(named_at - onset, 1) if named_at else None}


def nvrx_on_cpu() -> dict:
    """NVRx's straggler Detector on this CPU-only machine."""
    probe = ("import nvidia_resiliency_ext.straggler as s\n"
             "s.Detector.initialize(report_time_interval=1.0)\n")
    try:
        p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"runs": False, "why": "timed out"}
    if p.returncode == 0:
        return {"runs": True}
    last = (p.stderr.strip().splitlines() or ["?"])[-1]
    return {"runs": False, "why": last[:300],
            "source": "straggler.py: Detector.initialize starts the CUPTI extension (nvrx_cupti_module, libcupti) "
                      "unconditionally; generate_report calls torch.cuda.synchronize()"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=90.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcml-bench-faults-"))
    faults = {f: [fault_run(f, work, i) for i in range(args.runs)] for f in ("collective", "loader", "gil", "exit")}
    summary = {}
    for f, rs in faults.items():
        summary[f] = {"detected_s_median": statistics.median(r["detected_s"] for r in rs),
                      "named_s_median": statistics.median(r.get("named_s", r["detected_s"]) for r in rs),
                      "right_culprit": sum(r.get("culprits") == [1] for r in rs), "runs": len(rs),
                      "method": rs[0].get("method"), "exit_codes": sorted({r["exit_code"] for r in rs})}
        print(f"{f:11s} detected {summary[f]['detected_s_median']:6.2f} s  named {summary[f]['named_s_median']:6.2f} s"
              f"  (after the last step; timeout {HANG_TIMEOUT:g} s for hangs)  culprit right {summary[f]['right_culprit']}"
              f"/{len(rs)}  by {summary[f]['method']}  exit {summary[f]['exit_codes']}")
    cost = launcher_cost(args.ranks, args.seconds)
    print(f"launcher: {cost['ranks']} ranks, scan every {cost['period_s']} s: "
          f"{cost['launcher_cpu_percent_of_one_core']} % of one core (slowest scan {cost['slowest_scan_cpu_ms']} ms); "
          f"straggler rank {cost['straggler_expected']} named {cost['straggler_named']} "
          f"{cost['straggler_named_after_onset_s']} s after its onset")
    nvrx = nvrx_on_cpu()
    print(f"NVRx straggler Detector on CPU: {'runs' if nvrx['runs'] else 'cannot run: ' + nvrx['why']}")
    out = ROOT / "benchmarks" / "results" / "watch.json"
    out.write_text(json.dumps({"faults": faults, "summary": summary, "launcher": cost, "nvrx": nvrx,
                               "hang_timeout_s": HANG_TIMEOUT}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
