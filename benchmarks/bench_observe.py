"""hpcml observe against wandb (offline), MLflow (file store) and TensorBoard, side by side.

    python benchmarks/bench_observe.py [--calls 100000] [--warmup 2000] [--record-seconds 30]
                                       [--api-seconds 60] [--tools hpcml,wandb,mlflow,tensorboard,tensorboardX]
                                       [--skip-recorder]

Installs wandb, mlflow and tensorboard (+ tensorboardX) each in its own venv under
benchmarks/.work/ (created once, reused; latest versions, recorded in the JSON). The
TensorBoard venv is made with --system-site-packages so that ``torch.utils.tensorboard``
finds this interpreter's torch. Three parts:

1. Per-call cost of logging one training step of 3 scalars (loss, acc, lr), in a fresh
   process per tool (this script re-run with --worker under the tool's venv python):
   ``--warmup`` calls, then ``--calls`` calls each timed alone with ``perf_counter_ns``
   around it (median, p90, p99, p99.9, max; the timer's own floor, ~50 ns, is reported and
   not subtracted). The garbage collector stays on, as in a training loop.
   - hpcml: ``observe.log(step=i, loss=, acc=, lr=)`` with HPCML_OBSERVE_DIR a temp dir,
     no recorder around it (the background thread writes the rank file itself); and, in
     another fresh process, ``with observe.section("step"): pass``. The rows in the file
     afterwards are counted against the calls made.
   - wandb: ``wandb.init(mode="offline", dir=tmp)`` then ``wandb.log({...}, step=i)``
     (WANDB_MODE=offline, WANDB_SILENT=true).
   - MLflow: ``mlflow.set_tracking_uri("file:" + tmp + "/mlruns")`` (MLFLOW_ALLOW_FILE_STORE=true:
     MLflow 3.x refuses the file store otherwise; MLFLOW_DISABLE_TELEMETRY=true, no network),
     inside ``mlflow.start_run()``:
     ``mlflow.log_metrics({...}, step=i)``.
   - TensorBoard: ``SummaryWriter.add_scalar`` x3 per step, both
     ``torch.utils.tensorboard`` (with the ``tensorboard`` package) and ``tensorboardX``.
   The closing call (``wandb.finish``, ``end_run``, ``close``, hpcml's flush) is timed
   apart, not in the per-call figures.
2. Recorder overhead: ``python -m hpcml observe record --dir TMP --interval I -- python -c
   "import time; time.sleep(S)"`` for I = 1 and 0.1, S = ``--record-seconds``. Method:
   this process starts the recorder and reads ``/proc/<recorder pid>/stat`` every 0.1 s.
   Fields 14 and 15 (utime, stime) are the recorder's *own* CPU time, all its threads
   included, never its children's (those go to cutime/cstime, 16-17, and only once
   reaped), so the child's CPU cannot leak in. The last reading before the recorder exits
   is its total (only the final close and JSON write, a few ms, can fall after it).
   Reported as CPU seconds per wall second, in % of one core: (a) steady state, the slope
   between the first reading after min(5 s, S/3) and the last before the child ends —
   what a long job pays; (b) whole life including interpreter start-up and imports (a
   one-off ~0.5-1 CPU-s that a 30 s run cannot amortise). Clock ticks are 10 ms, so (a)
   has a resolution of about 0.04 % over 25 s.
3. Store size per rank-hour: the same /proc polling reads the size of
   ``rank-00000.arrows`` (each batch is flushed to the OS as written), and the bytes per
   hour are the slope over the same steady window x 3600 (start-up header excluded; the
   whole file over the whole run is in the JSON too). Host sampler only at 1 s (no GPU
   here), and an API-heavy rank: the recorder around a process that does 3 scalars + 1
   section per step at 10 steps/s for ``--api-seconds`` (default 60), extrapolated to an
   hour; the API part alone is the difference of the two slopes.

Prints Markdown tables, ratios and goal checks; writes benchmarks/results/observe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / ".work"
SCRATCH = WORK / "observe"

VENVS = {  # name: (venv, packages, system site packages)
    "wandb": (WORK / "venv-wandb", ["wandb"], False),
    "mlflow": (WORK / "venv-mlflow", ["mlflow"], False),
    "tensorboard": (WORK / "venv-tensorboard", ["tensorboard", "tensorboardX"], True),
}
TOOL_VENV = {"hpcml": None, "hpcml-section": None, "wandb": "wandb", "mlflow": "mlflow",
             "tensorboard": "tensorboard", "tensorboardX": "tensorboard"}
LABELS = {"hpcml": "hpcml observe.log", "hpcml-section": "hpcml observe.section (empty block)",
          "wandb": "wandb.log (offline)", "mlflow": "mlflow.log_metrics (file store)",
          "tensorboard": "torch.utils.tensorboard add_scalar x3", "tensorboardX": "tensorboardX add_scalar x3"}
TOOLS = ("hpcml", "wandb", "mlflow", "tensorboard", "tensorboardX")
REFERENCE_US = {"tensorboard": 98.0, "wandb": 250.0, "mlflow": 545.0}   # medians, this kind of machine

GOAL_LOG_US = 5.0
GOAL_VS_WANDB = 50.0
GOAL_RECORDER_PCT = 1.0
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
POLL_S = 0.1


# --------------------------------------------------------------------------- part 1: per call


def _time_dict_logger(log, warm: int, n: int, losses, accs, lrs, times) -> None:
    """Time ``log({...}, step=i)`` call by call (wandb.log and mlflow.log_metrics share it)."""
    pc = time.perf_counter_ns
    for i in range(warm):
        log({"loss": losses[i], "acc": accs[i], "lr": lrs[i]}, step=i)
    for k in range(n):
        i = warm + k
        loss, acc, lr = losses[i], accs[i], lrs[i]
        t0 = pc()
        log({"loss": loss, "acc": acc, "lr": lr}, step=i)
        times[k] = pc() - t0


def _worker(spec: dict) -> dict:
    """Runs in a fresh process, under the tool's own interpreter: one tool, timed per call."""
    tool, n, warm, d = spec["tool"], spec["calls"], spec["warmup"], spec["dir"]
    pc = time.perf_counter_ns
    total = warm + n
    losses = [1.0 / (i + 1) for i in range(total)]
    accs = [i / total for i in range(total)]
    lrs = [1e-3 * (1 - i / total) for i in range(total)]
    times = [0] * n
    info: dict = {}
    floor = [0] * 10000
    for k in range(10000):
        t0 = pc()
        floor[k] = pc() - t0
    t_setup = time.perf_counter()

    if tool in ("hpcml", "hpcml-section"):
        os.environ["HPCML_OBSERVE_DIR"] = d
        from hpcml import observe
        setup_s = time.perf_counter() - t_setup
        log = observe.log
        if tool == "hpcml":
            for i in range(warm):
                log(step=i, loss=losses[i], acc=accs[i], lr=lrs[i])
            for k in range(n):
                i = warm + k
                loss, acc, lr = losses[i], accs[i], lrs[i]
                t0 = pc()
                log(step=i, loss=loss, acc=acc, lr=lr)
                times[k] = pc() - t0
        else:
            section = observe.section
            for _ in range(warm):
                with section("step"):
                    pass
            for k in range(n):
                t0 = pc()
                with section("step"):
                    pass
                times[k] = pc() - t0
        t_close = time.perf_counter()
        observe.flush()
        close_s = time.perf_counter() - t_close
        info["problems"] = observe.problems()
        from hpcml.observe.api import _close
        _close()
        from hpcml.observe.store import read_rank
        files = sorted(Path(d).glob("rank-*.arrows"))
        rows = {}
        for f in files:
            data = read_rank(f)
            for b in data.batches:
                for kind in b.column("kind").to_pylist():
                    rows[kind] = rows.get(kind, 0) + 1
        info.update(rows_in_store=rows, store_bytes=sum(f.stat().st_size for f in files),
                    expected_rows=3 * total if tool == "hpcml" else total)

    elif tool == "wandb":
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=d)
        import wandb
        run = wandb.init(mode="offline", dir=d, project="bench-observe")
        setup_s = time.perf_counter() - t_setup
        _time_dict_logger(wandb.log, warm, n, losses, accs, lrs, times)
        t_close = time.perf_counter()
        run.finish()
        close_s = time.perf_counter() - t_close
        info["version"] = wandb.__version__

    elif tool == "mlflow":
        import warnings
        warnings.simplefilter("ignore")
        # MLflow 3.x refuses the file store unless told (it is "in maintenance mode")
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        import mlflow
        # a directory FileStore does not create itself has no default experiment: use a new one
        mlflow.set_tracking_uri("file:" + os.path.join(d, "mlruns"))
        run = mlflow.start_run()
        setup_s = time.perf_counter() - t_setup
        _time_dict_logger(mlflow.log_metrics, warm, n, losses, accs, lrs, times)
        t_close = time.perf_counter()
        mlflow.end_run()
        close_s = time.perf_counter() - t_close
        info["version"] = mlflow.__version__
        info["run_id"] = run.info.run_id

    elif tool in ("tensorboard", "tensorboardX"):
        if tool == "tensorboard":
            import tensorboard
            import torch
            from torch.utils.tensorboard import SummaryWriter
            info["version"] = f"tensorboard {tensorboard.__version__}, torch {torch.__version__}"
        else:
            import tensorboardX
            from tensorboardX import SummaryWriter
            info["version"] = tensorboardX.__version__
        w = SummaryWriter(log_dir=d)
        setup_s = time.perf_counter() - t_setup
        add = w.add_scalar
        for i in range(warm):
            add("loss", losses[i], i)
            add("acc", accs[i], i)
            add("lr", lrs[i], i)
        for k in range(n):
            i = warm + k
            loss, acc, lr = losses[i], accs[i], lrs[i]
            t0 = pc()
            add("loss", loss, i)
            add("acc", acc, i)
            add("lr", lr, i)
            times[k] = pc() - t0
        t_close = time.perf_counter()
        w.close()
        close_s = time.perf_counter() - t_close
    else:
        raise SystemExit(f"unknown tool {tool}")

    times.sort()

    def q(p: float) -> float:
        return times[min(n - 1, int(p * n))] / 1000.0

    du = sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())
    return {"tool": tool, "calls": n, "warmup": warm, "median_us": q(0.5), "p90_us": q(0.9),
            "p99_us": q(0.99), "p999_us": q(0.999), "max_us": times[-1] / 1000.0,
            "mean_us": sum(times) / n / 1000.0, "timer_floor_us": statistics.median(floor) / 1000.0,
            "setup_s": setup_s, "close_s": close_s, "dir_bytes": du, **info}


def _venv_python(name: str) -> tuple[str | None, str]:
    """The venv's interpreter, installing its packages on first use."""
    venv, packages, system_site = VENVS[name]
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import importlib.metadata as m; " +
             "; ".join(f"m.version({p!r})" for p in packages)]

    def installed() -> bool:
        return py.exists() and subprocess.run(check, check=False, capture_output=True).returncode == 0

    if not installed():
        print(f"installing {' '.join(packages)} into {venv.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
        try:
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", *(["--system-site-packages"] if system_site else []),
                                str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *packages],
                           check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            return None, f"install failed: {(exc.stderr or '')[-500:]}"
    if not installed():
        return None, "install failed"
    return str(py), ""


def run_worker(tool: str, py: str, args) -> dict:
    d = SCRATCH / f"call-{tool}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    spec = {"tool": tool, "calls": args.calls, "warmup": args.warmup, "dir": str(d)}
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(d),
               MLFLOW_ALLOW_FILE_STORE="true", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
               PYTHONWARNINGS="ignore")
    start = time.perf_counter()
    out = subprocess.run([py, __file__, "--worker", json.dumps(spec)], cwd=d, env=env,
                         check=False, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        return {"status": "failed", "rc": out.returncode, "stderr": out.stderr[-3000:]}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res.update(status="ok", process_wall_s=wall, stderr_tail=out.stderr[-1000:])
    return res


# --------------------------------------------------------------------------- parts 2 and 3: recorder

def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` itself (all threads, no children), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _slope(samples: list[tuple[float, float]], t_from: float, t_to: float) -> tuple[float | None, float]:
    win = [s for s in samples if t_from <= s[0] <= t_to]
    if len(win) < 2 or win[-1][0] - win[0][0] <= 0:
        return None, 0.0
    return (win[-1][1] - win[0][1]) / (win[-1][0] - win[0][0]), win[-1][0] - win[0][0]


API_CHILD = """
import time
from hpcml import observe
steps = int({seconds} * 10)
t0 = time.perf_counter()
for step in range(steps):
    with observe.section("step"):
        delay = t0 + (step + 1) * 0.1 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    observe.log(step=step, loss=1.0 / (step + 1), acc=step / steps, lr=1e-3)
"""


def run_recorder(name: str, interval: float, child_code: str, child_seconds: float, *,
                 command: tuple[str, ...] = ("observe", "record"), env: dict | None = None,
                 scratch: Path = SCRATCH) -> dict:
    """CPU and store growth of one recorder run (``hpcml <command> --dir D --interval I -- ...``)."""
    d = scratch / f"rec-{name}"
    shutil.rmtree(d, ignore_errors=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "hpcml", *command, "--dir", str(d),
            "--interval", str(interval), "--", sys.executable, "-c", child_code]
    rank_file = d / "rank-00000.arrows"
    cpu: list[tuple[float, float]] = []
    size: list[tuple[float, float]] = []
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=WORK, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=None if env is None else {**os.environ, **env})
    child_end = None
    while proc.poll() is None:
        t = time.perf_counter() - start
        c = _proc_cpu_s(proc.pid)
        if c is not None and proc.poll() is None:   # a zombie's stat would still be right, but be safe
            cpu.append((t, c))
        try:
            size.append((t, float(rank_file.stat().st_size)))
        except OSError:
            pass
        if child_end is None:
            try:
                kids = [int(x) for x in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            except OSError:
                kids = [0]
            if not kids and t > 1.0:
                child_end = t
        time.sleep(POLL_S)
    wall = time.perf_counter() - start
    _stdout, stderr = proc.communicate()
    if child_end is None:
        child_end = wall
    t_from = min(5.0, child_seconds / 3)
    t_to = min(child_end, child_seconds) - POLL_S
    cpu_rate, cpu_span = _slope(cpu, t_from, t_to)
    size_rate, _ = _slope(size, t_from, t_to)
    total_cpu = cpu[-1][1] if cpu else None
    final = rank_file.stat().st_size if rank_file.exists() else None
    rows = None
    try:
        from hpcml.observe.store import read_rank
        data = read_rank(rank_file)
        rows = {}
        for b in data.batches:
            for kind in b.column("kind").to_pylist():
                rows[kind] = rows.get(kind, 0) + 1
    except Exception as exc:  # noqa: BLE001
        rows = {"error": str(exc)}
    return {"interval": interval, "rc": proc.returncode, "wall_s": wall, "child_end_s": child_end,
            "steady_window_s": [t_from, t_to], "cpu_steady_span_s": cpu_span,
            "cpu_pct_steady": None if cpu_rate is None else 100 * cpu_rate,
            "cpu_total_s": total_cpu, "cpu_pct_total": None if total_cpu is None else 100 * total_cpu / wall,
            "cpu_at_window_start_s": next((c for t, c in cpu if t >= t_from), None),
            "bytes_per_s_steady": size_rate, "bytes_per_hour_steady": None if size_rate is None else size_rate * 3600,
            "file_bytes": final, "bytes_per_hour_whole": None if not final else final / child_end * 3600,
            "rows": rows, "cpu_samples": len(cpu), "stderr_tail": stderr.decode(errors="replace")[-1500:],
            "argv": argv}


# --------------------------------------------------------------------------- report

def _fmt(x: float | None, nd: int = 2) -> str:
    return "–" if x is None else f"{x:,.{nd}f}"


def _mb(x: float | None) -> str:
    return "–" if x is None else f"{x / 2**20:,.2f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100_000, help="timed calls per tool")
    ap.add_argument("--warmup", type=int, default=2_000, help="untimed calls first")
    ap.add_argument("--record-seconds", type=float, default=30, help="S: the recorded child sleeps S s")
    ap.add_argument("--api-seconds", type=float, default=60, help="length of the API-heavy recorded run")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--skip-recorder", action="store_true", help="part 1 only")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return

    t0 = time.perf_counter()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    tools = [t for t in args.tools.split(",") if t]
    if "hpcml" in tools:
        tools.insert(tools.index("hpcml") + 1, "hpcml-section")
    pythons: dict[str, str | None] = {}
    unavailable: dict[str, str] = {}
    for tool in tools:
        v = TOOL_VENV[tool]
        if v is None:
            pythons[tool] = sys.executable
            continue
        if v not in pythons:
            pythons[v], why = _venv_python(v)
            if why:
                unavailable[v] = why
        pythons[tool] = pythons[v]
        if pythons[tool] is None:
            unavailable[tool] = unavailable[v]

    # ---- part 1
    calls: dict[str, dict] = {}
    for tool in tools:
        if pythons[tool] is None:
            calls[tool] = {"status": "not available", "why": unavailable[tool]}
            print(f"{LABELS[tool]}: not available ({unavailable[tool]})", file=sys.stderr, flush=True)
            continue
        r = run_worker(tool, pythons[tool], args)
        calls[tool] = r
        if r["status"] == "ok":
            print(f"  {tool:14} median {r['median_us']:8.2f} us  p99 {r['p99_us']:9.2f} us  "
                  f"({r['process_wall_s']:.1f} s)", file=sys.stderr, flush=True)
        else:
            print(f"  {tool:14} failed rc={r['rc']}: {r['stderr'][-800:]}", file=sys.stderr, flush=True)

    # ---- parts 2 and 3
    rec: dict[str, dict] = {}
    if not args.skip_recorder:
        sleep = f"import time; time.sleep({args.record_seconds})"
        for name, interval, code, secs in (
                ("sleep-1s", 1.0, sleep, args.record_seconds),
                ("sleep-0.1s", 0.1, sleep, args.record_seconds),
                ("api-heavy-1s", 1.0, API_CHILD.format(seconds=args.api_seconds), args.api_seconds)):
            r = run_recorder(name, interval, code, secs)
            rec[name] = r
            print(f"  recorder {name:13} rc={r['rc']} cpu steady {_fmt(r['cpu_pct_steady'], 3)} %  "
                  f"total {_fmt(r['cpu_total_s'])} s / {r['wall_s']:.1f} s; "
                  f"{_mb(r['bytes_per_hour_steady'])}/h", file=sys.stderr, flush=True)

    # ---- tables
    hp = calls.get("hpcml", {})
    hp_med = hp.get("median_us") if hp.get("status") == "ok" else None
    lines = [(f"### per call: one training step of 3 scalars ({args.calls:,} timed calls after "
              f"{args.warmup:,} warm-up, fresh process per tool)"), "",
             ("| tool | median µs | p90 µs | p99 µs | p99.9 µs | max µs | reference median µs | "
              "median vs hpcml | close s |"),
             "|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, float | None] = {}
    for tool in tools:
        r = calls[tool]
        if r.get("status") != "ok":
            lines.append(f"| {LABELS[tool]} | {r.get('status')} | | | | | | | |")
            continue
        ref = REFERENCE_US.get(tool if tool != "tensorboardX" else "tensorboard")
        if tool.startswith("hpcml") or hp_med is None:
            cmp = "–"
        else:
            ratios[tool] = r["median_us"] / hp_med
            cmp = f"{ratios[tool]:,.0f}x slower"
        lines.append(f"| {LABELS[tool]} | {r['median_us']:,.2f} | {r['p90_us']:,.2f} | {r['p99_us']:,.2f} | "
                     f"{r['p999_us']:,.1f} | {r['max_us']:,.0f} | {_fmt(ref, 0) if ref else '–'} | {cmp} | "
                     f"{r['close_s']:.2f} |")
    floor = next((r["timer_floor_us"] for r in calls.values() if r.get("status") == "ok"), None)
    lines += ["", f"Timer floor (two back-to-back perf_counter_ns), not subtracted: {_fmt(floor, 3)} µs.",
              "Versions: " + "; ".join(f"{t} {calls[t]['version']}" for t in tools
                                       if calls[t].get("status") == "ok" and calls[t].get("version"))]
    if hp.get("status") == "ok":
        lines.append(f"hpcml store check: {hp.get('rows_in_store')} rows for {hp.get('expected_rows'):,} "
                     f"logged, problems {hp.get('problems')}.")
    lines.append("")

    if rec:
        lines += ["### recorder overhead and store size", "",
                  ("| run | interval s | recorder CPU, steady (% of a core) | recorder CPU, whole life | "
                   "rank file bytes per rank-hour (steady slope) | whole file / run length x 3600 | rows |"),
                  "|---|---|---|---|---|---|---|"]
        for name, r in rec.items():
            lines.append(f"| {name} (rc {r['rc']}) | {r['interval']} | {_fmt(r['cpu_pct_steady'], 3)} % | "
                         f"{_fmt(r['cpu_total_s'])} CPU-s / {r['wall_s']:.1f} s = {_fmt(r['cpu_pct_total'])} % | "
                         f"{_mb(r['bytes_per_hour_steady'])} | {_mb(r['bytes_per_hour_whole'])} | {r['rows']} |")
        host, api = rec.get("sleep-1s"), rec.get("api-heavy-1s")
        if host and api and host["bytes_per_hour_steady"] and api["bytes_per_hour_steady"]:
            diff = api["bytes_per_hour_steady"] - host["bytes_per_hour_steady"]
            lines += ["", (f"API part alone (3 scalars + 1 section per step, 10 steps/s): "
                           f"{_mb(diff)} per rank-hour ({diff / 3600 / 10:,.1f} bytes per step).")]
        lines.append("")

    goals = []
    med = hp_med
    goals.append({"goal": f"hpcml observe.log median < {GOAL_LOG_US:g} µs", "value": med,
                  "shown": f"{med:.2f} µs" if med is not None else "–",
                  "met": None if med is None else med < GOAL_LOG_US})
    w = ratios.get("wandb")
    goals.append({"goal": f"hpcml observe.log >= {GOAL_VS_WANDB:g}x faster than wandb offline (median)",
                  "value": w, "shown": f"{w:,.0f}x" if w is not None else "–",
                  "met": None if w is None else w >= GOAL_VS_WANDB})
    for name in ("sleep-1s", "sleep-0.1s"):
        r = rec.get(name)
        v = r.get("cpu_pct_steady") if r else None
        goals.append({"goal": f"recorder CPU < {GOAL_RECORDER_PCT:g} % of a core at --interval "
                              f"{'1' if name == 'sleep-1s' else '0.1'} (steady state)",
                      "value": v, "shown": f"{v:.3f} %" if v is not None else "–",
                      "met": None if v is None else v < GOAL_RECORDER_PCT})
    lines += ["### goals", "", "| goal | hpcml | status |", "|---|---|---|"]
    for g in goals:
        lines.append(f"| {g['goal']} | {g['shown']} | "
                     f"{ {True: 'met', False: '**not met**', None: 'n/a'}[g['met']] } |")
    print("\n".join(lines))

    versions = {}
    list_packages = ("import importlib.metadata as m, json; "
                     "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    for v in VENVS:
        if pythons.get(v):
            out = subprocess.run([pythons[v], "-c", list_packages], check=False, capture_output=True, text=True)
            versions[v] = json.loads(out.stdout) if out.stdout.strip() else None
    results_dir = ROOT / "benchmarks" / "results"
    results_dir.mkdir(exist_ok=True)
    payload = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": {"cpus": os.cpu_count(), "python": sys.version},
        "args": {k: v for k, v in vars(args).items() if k != "worker"}, "unavailable": unavailable,
        "venv_packages": versions, "reference_median_us": REFERENCE_US,
        "per_call": calls, "median_ratio_over_hpcml": ratios, "recorder": rec, "goals": goals,
        "total_benchmark_s": time.perf_counter() - t0,
    }
    (results_dir / "observe.json").write_text(json.dumps(payload, indent=1))
    print(f"\nwrote {(results_dir / 'observe.json').relative_to(ROOT)} "
          f"({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr)


if __name__ == "__main__":
    main()
