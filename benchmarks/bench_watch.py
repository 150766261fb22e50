"""`hpcml run`'s live watch: time from fault to detection and to culprit named, and what
the watch costs the launcher at 1,024 ranks and at Alps's 10,752; NVRx's straggler detector
beside it.

    python benchmarks/bench_watch.py [--runs 3] [--ranks 1024] [--seconds 60]
    python benchmarks/bench_watch.py --alps [--writers 2] [--hang-timeout 60]

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
4. ``--alps`` (only this part): Alps's size, 10,752 ranks (2,688 nodes n0000-n2687 x 4
   GPUs), their heartbeats written by ``--writers`` processes (each round's lag measured),
   the watch polled as in 2 with ``--hang-timeout`` (60 s): rank 3584 1.5x slower from 60 s
   in, and 120 s later a hang (rank 4711 completes no step after S, the others none after
   S + 1; every recorder still beating, none answering the snapshot request, which synthetic
   writers cannot: naming is then by progress alone). Detection and naming are measured
   from when the timeout ran out; CPU, peak RSS and the slowest scan of the polling process.

Writes benchmarks/results/watch.json (``--alps`` adds its ``alps`` key, keeping the rest).
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
from typing import Any

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


STEPS_PER_S = 10                    # each synthetic rank's pace
ALPS_RANKS, ALPS_HUNG = 10_752, 4711


def _step_time(r: int, step: int, slow: bool) -> float:
    return 0.1 * (1.5 if slow else 1.0) * (1 + 0.01 * ((step + r) % 7))


def _alps_writer(observe: str, ranks: list[int], t0: float, onset: float, hang_at: float, stop: Any,
                 slow_rank: int, hung_rank: int, out: str) -> None:
    """One writer of many: its ranks' heartbeats rewritten once a second, byte for byte what
    ``BeatWriter.write`` makes (checked once per kind of rank), but serialised once per kind
    (the step times repeat every 7 ranks) so that 10,752 records a second fit on 2 cores.
    Step k ends at t0 + k/10 on every rank; from ``hang_at`` on, ``hung_rank`` completes no
    step after S and the others none after S + 1 (they wait in the next collective), while
    every record keeps being rewritten (recorders alive, not answering snapshots)."""
    from hpcml.observe.beat import SIZE, BeatWriter, Progress
    hang_step = int((hang_at - t0) * STEPS_PER_S)
    kinds = {r: ("slow" if r == slow_rank else "hung" if r == hung_rank else r % 7) for r in ranks}
    progress = {k: Progress() for k in set(kinds.values())}
    done = dict.fromkeys(progress, -1)                 # the last step each kind completed
    like = {k: r for r, k in kinds.items()}            # one rank of each kind
    writers = {r: BeatWriter(Path(observe), r, f"n{r // 4:04d}") for r in ranks}
    heads = {r: json.dumps(w.fixed, separators=(",", ":")).encode()[:-1] + b"," for r, w in writers.items()}
    checked, lags, oldest = False, [], 0.0
    due = t0
    while not stop.is_set():
        now = time.time()
        last = int((now - t0) * STEPS_PER_S)
        for k, p in progress.items():
            r = like[k]
            cap = last if now < hang_at else min(last, hang_step if k == "hung" else hang_step + 1)
            steps = range(done[k] + 1, cap + 1)
            if steps:
                p.update([t0 + s / STEPS_PER_S for s in steps], ["section"] * len(steps), ["step"] * len(steps),
                         [_step_time(r, s, k == "slow" and t0 + s / STEPS_PER_S >= onset) for s in steps], list(steps))
                done[k] = cap
        bodies = {k: json.dumps(p.to_json(), separators=(",", ":")).encode()[1:-1] for k, p in progress.items()}
        for r, w in writers.items():
            beat = time.time()
            data = heads[r] + bodies[kinds[r]] + b',"beat":' + repr(beat).encode() + b"}"
            if len(data) > SIZE or not checked and like[kinds[r]] == r:
                w.write(progress[kinds[r]], now=beat)            # the real writer, to compare with
                if len(data) <= SIZE and os.pread(w.fd, SIZE, 0) != data.ljust(SIZE):
                    raise SystemExit(f"rank {r}: the synthetic record differs from BeatWriter.write's")
                continue
            os.pwrite(w.fd, data.ljust(SIZE), 0)
        checked = True
        end = time.time()
        lags.append(end - due)                     # how long after its due time the round's last record went out
        oldest = max(oldest, end - now)
        due += 1.0
        time.sleep(max(0.0, due - time.time()))
    Path(out).write_text(json.dumps({"ranks": len(ranks), "rounds": len(lags), "lag_max_s": round(max(lags), 3),
                                     "lag_p99_s": round(sorted(lags)[int(0.99 * (len(lags) - 1))], 3),
                                     "rounds_late": sum(lag > 1.0 for lag in lags),
                                     "cpu_s": round(time.process_time(), 1)}))


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def alps(ranks: int, writers: int, hang_timeout: float, before: float, straggler_for: float, hung_rank: int) -> dict:
    """Alps's size (2,688 nodes x 4 GPUs): the straggler from ``before`` s into the watch, the
    hang ``straggler_for`` s later, the watch polled as ``hpcml run`` polls it until the
    hang's culprit is named (or the timeout + 120 s passed)."""
    import resource

    from hpcml.run.watch import COLLECT, Watch, period_for
    work = Path(tempfile.mkdtemp(prefix="hpcml-bench-alps-"))
    (work / "writers").mkdir()
    slow_rank = ranks // 3
    load0 = os.getloadavg()
    t0 = time.time() + 10                          # the writers have started
    onset, hang_at = t0 + 10 + before, t0 + 10 + before + straggler_for
    stop_at = hang_at + hang_timeout + 150
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=_alps_writer, args=(
        str(work / "observe"), list(range(i, ranks, writers)), t0, onset, hang_at, stop, slow_rank, hung_rank,
        str(work / "writers" / f"{i}.json"))) for i in range(writers)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, t0 + 10 - time.time()))    # every record is out
    watch = Watch(work, 0, ranks, timeout=hang_timeout, on_hang="report")
    rss0, peak0 = _rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu0, wall0 = time.process_time(), time.time()
    scans, slowest_cpu, slowest_wall, stale, rss = 0, 0.0, 0.0, 0.0, []
    straggler_at = detected = named = None
    while time.time() < stop_at - 5 and named is None:
        c, w = time.process_time(), time.time()
        before_next = watch._next
        watch.poll()
        if watch._next != before_next:
            scans += 1
            slowest_cpu, slowest_wall = max(slowest_cpu, time.process_time() - c), max(slowest_wall, time.time() - w)
            if watch.hang is None:
                stale = max(stale, w - min(b.beat for b in watch.beats.values()))
            rss.append(_rss_mb())
        if watch.stragglers and straggler_at is None:
            straggler_at = time.time()
        if watch.hang and detected is None:
            detected = time.time()
        if watch.hang and watch.hang.get("named") and named is None:
            named = time.time()
        time.sleep(0.05)
    cpu, wall = time.process_time() - cpu0, time.time() - wall0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stop.set()
    for p in procs:
        p.join()
    stats = [json.loads(f.read_text()) for f in sorted((work / "writers").glob("*.json"))]
    expires = t0 + (int((hang_at - t0) * STEPS_PER_S) + 1) / STEPS_PER_S + hang_timeout   # the others' last step + timeout
    verdict = (watch.hang or {}).get("verdict") or {}
    return {"ranks": ranks, "nodes": ranks // 4, "period_s": period_for(ranks), "scans": scans,
            "seconds": round(wall, 1), "load_before": [round(x, 2) for x in load0],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "writers": writers, "writer_stats": stats, "oldest_beat_seen_s": round(stale, 2),
            "launcher_cpu_percent_of_one_core": round(100 * cpu / wall, 2),
            "slowest_scan_cpu_ms": round(1000 * slowest_cpu, 1), "slowest_scan_wall_ms": round(1000 * slowest_wall, 1),
            "rss_mb_first_scan": round(rss[0], 1) if rss else None, "rss_mb_last_scan": round(rss[-1], 1) if rss else None,
            "rss_mb_at_watch_start": round(rss0, 1), "peak_rss_mb_before": round(peak0, 1), "peak_rss_mb": round(peak, 1),
            "straggler_expected": slow_rank, "straggler_named": sorted(watch.stragglers),
            "straggler_named_after_onset_s": round(straggler_at - onset, 1) if straggler_at else None,
            "hang_timeout_s": hang_timeout, "hung_rank": hung_rank, "collect_s": COLLECT,
            "hang_detected_after_timeout_s": round(detected - expires, 1) if detected else None,
            "hang_named_after_timeout_s": round(named - expires, 1) if named else None,
            "culprits": [c["rank"] for c in verdict.get("culprits", [])], "method": verdict.get("method"),
            "blocked": len(verdict.get("blocked", [])), "stacks": (watch.hang or {}).get("stacks")}


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
    ap.add_argument("--ranks", type=int, default=None, help="1,024; 10,752 with --alps")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--alps", action="store_true", help="only the watch at Alps's size (part 4)")
    ap.add_argument("--writers", type=int, default=2, help="--alps: processes writing the heartbeats")
    ap.add_argument("--hang-timeout", type=float, default=60.0, help="--alps: the watch's explicit timeout (s)")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "results" / "watch.json"
    if args.alps:
        a = alps(args.ranks or ALPS_RANKS, args.writers, args.hang_timeout, 60.0, 120.0,
                 min(ALPS_HUNG, (args.ranks or ALPS_RANKS) - 1))
        print(json.dumps(a, indent=2))
        doc = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**doc, "alps": a}, indent=2) + "\n")
        print(f"wrote {out}")
        return
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
    cost = launcher_cost(args.ranks or 1024, args.seconds)
    print(f"launcher: {cost['ranks']} ranks, scan every {cost['period_s']} s: "
          f"{cost['launcher_cpu_percent_of_one_core']} % of one core (slowest scan {cost['slowest_scan_cpu_ms']} ms); "
          f"straggler rank {cost['straggler_expected']} named {cost['straggler_named']} "
          f"{cost['straggler_named_after_onset_s']} s after its onset")
    nvrx = nvrx_on_cpu()
    print(f"NVRx straggler Detector on CPU: {'runs' if nvrx['runs'] else 'cannot run: ' + nvrx['why']}")
    old = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({"faults": faults, "summary": summary, "launcher": cost, "nvrx": nvrx,
                               "hang_timeout_s": HANG_TIMEOUT, **({"alps": old["alps"]} if "alps" in old else {})},
                              indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
