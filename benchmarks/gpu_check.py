r"""GPU truth on one lent GPU (issue 67, item 5): one invocation, under 8 minutes, every part
in its own process with its own time limit, each failure recorded beside the others.

    python3 benchmarks/gpu_check.py --out DIR [--archive DIR.tar.gz] [--budget 420]
    python3 benchmarks/gpu_check.py --cpu-rehearsal --out /tmp/gpucheck --archive /tmp/gpucheck.tar.gz

Parts (the table at the end has one row each; ``DIR/gpu_check.json``, tagged
``hpcml.bench.gpu_check/1``, has everything measured; each part's files are in ``DIR/PART/``):

- ``env``: the machine (GPU, driver, torch, NCCL, the Python packages hpcml needs) and
  whether ``python -m hpcml version`` starts.
- ``fr``: a real NCCL Flight Recorder dump with timing (``TORCH_NCCL_ENABLE_TIMING=1``,
  ``TORCH_FR_BUFFER_SIZE=2000`` and the older ``TORCH_NCCL_TRACE_BUFFER_SIZE``), world size
  1 over a file:// store, the default group and three more (two NCCL, one gloo), a small DDP
  model stepping 20 times with all_reduce, broadcast, all_gather and barrier between steps.
  Saved raw as the recorder produced them: ``_dump_nccl_trace()`` (pickle),
  ``_dump_nccl_trace_json()``, once right after the work (the watchdog may not have
  filled ``duration_ms`` yet) and once 2 s later, and the generic recorder's
  ``_dump_fr_trace(True, False, False)`` (what hpcml run's sitecustomize dumps) and
  ``_dump_fr_trace_json()`` (gloo's entries). ``summary.json``: each dump's entries by
  group, operation and state, how many carry ``duration_ms``, and whether
  ``hpcml.observe.hang.load_dump`` reads the pickles.
- ``steps``: CUDA-event step timing of a small bf16 MLP under DDP (NCCL, world size 1): 50
  steps enqueued back to back (events around the step and around ``backward()``, and the
  CPU's own enqueue time), 10 steps synchronised each, and 20 steps with a comm hook that
  times each DDP bucket's all-reduce with CUDA events. ``steps.jsonl``: one line a step.
- ``sampler``: what hpcml's GPU sampler costs a rank: ``hpcml.samplers.choose.for_task``
  (the task wrapper's recorder opens it so: claim, then DCGM, GPM, NVML in turn) timed in
  fresh processes, 5 times for ``auto``, ``gpm`` and ``nvml``, with its first two samples
  and its close; and bare ``pynvml.nvmlInit()``. ``samples.json``: the rows a sampler
  produced, in the store's row format.
- ``selftest``: ``python -m hpcml score selftest --seconds 10`` (it has no ``--json``): its
  output and exit code, and ``hpcml score report --json`` of both recordings it made.
- ``run``: ``python -m hpcml run --ntasks 1`` (no Slurm: local tasks) of a small training
  script using CUDA and DDP over NCCL, unchanged (hpcml counts its optimizer steps); the job
  directory's run.json, the report as text, JSON and HTML, the summary for the centre, the
  rank's logs and recorder metadata, the Flight Recorder dump hpcml's own code takes in the
  rank, its latest periodic dump (every 5 s here) read as the arrivals read it, and the
  script's CUDA-event step times beside hpcml's.
- ``cost``: what hpcml run costs a GPU rank: the same script under torchrun, hpcml run, hpcml
  run without NCCL timing and without a GPU sampler, interleaved twice: launch to first step,
  the median step, and when the rank's sampler opened and what that took.

Every child runs in a process group of its own, killed (with every descendant) at its limit:
the parts share ``--budget`` seconds, each one capped, so a hang in one cannot eat the others'
time. ``--archive`` tars DIR at the end, whatever failed. Everything stays under DIR, at most
one folder down, a few MB in all (copied to tests/fixtures/gpu/ afterwards).

``--cpu-rehearsal`` runs the same code paths on a machine without a GPU: gloo instead of
NCCL, ``perf_counter`` instead of CUDA events, the sampler's rows replayed from the H100
recording (tests/fixtures/gpm) beside the honest "no GPU" of the real path; the selftest
says it needs a GPU.

On the lent GPU: the device tool's ``run`` from the repository root with ``carry: [".whl"]``
(typer 0.29, pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions,
rich, annotated-doc, orjson and py-spy as cp312 manylinux wheels; the image has torch and
the rest) and ``timeout_s`` 520; DIR outside $OUT, which brings back at most 8 files (here
four: the archive, the JSON, the table and the log). One line:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 || exit; \
    python3 benchmarks/gpu_check.py --out /tmp/gpu --archive $OUT/gpu.tar.gz 2>&1 | tee $OUT/gpu_check.log; \
    cp /tmp/gpu/gpu_check.json /tmp/gpu/table.txt $OUT/
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "hpcml.bench.gpu_check/1"
FR_ENTRIES = "2000"
FR_ENV = {"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_FR_BUFFER_SIZE": FR_ENTRIES, "TORCH_NCCL_TRACE_BUFFER_SIZE": FR_ENTRIES}
GPM_REPLAY = ROOT / "tests/fixtures/gpm/gpm-h100.jsonl"
MAX_HTML = 2 << 20           # report.html is kept up to this size
MAX_STORE = 3 << 20          # and the rank's observe store
PACKAGES = ("torch", "numpy", "pyarrow", "pydantic", "pydantic_core", "typer", "rich", "orjson", "psutil", "PyYAML",
            "jinja2", "MarkupSafe", "packaging", "prometheus_client", "threadpoolctl", "nvidia-ml-py", "py-spy",
            "typing_extensions", "annotated-types", "typing-inspection", "annotated-doc", "shellingham")
RESULT = "GPU_CHECK_RESULT "  # the line a child prints its result on


# ---------------------------------------------------------------------------------------
# The parent: parts, limits, the table


class Budget:
    """The seconds the parts share; each part gets at most its cap and leaves the parts after
    it ``reserve`` seconds each."""

    def __init__(self, total: float, reserve: float = 20.0) -> None:
        self.total, self.reserve, self.start = total, reserve, time.monotonic()

    def left(self) -> float:
        return self.total - (time.monotonic() - self.start)

    def limit(self, cap: float, after: int) -> float:
        return min(cap, self.left() - self.reserve * after)


def _kill_tree(pid: int) -> None:
    """SIGTERM to the child's process group and every descendant (ranks of hpcml run have
    groups of their own), SIGKILL to what is left 3 s later."""
    try:
        import psutil
        procs = psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - gone already, or no psutil
        procs = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in procs:
            try:
                os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            time.sleep(3)


def run_cmd(cmd: list[str], *, timeout: float, log: Path, env: dict[str, str] | None = None,
            cwd: Path | None = None, stdout_only: bool = False) -> dict[str, Any]:
    """Run ``cmd`` in a new session with stdout and stderr into ``log`` (``stdout_only``: stdout
    alone, as it printed it, stderr into ``log.err``); at ``timeout`` kill it with everything it
    started. The result: rc, seconds, timed_out, the output's tail (stderr's too) and the RESULT
    line a child of this script printed (parsed), if any."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timed_out = False
    err = log.with_name(log.name + ".err") if stdout_only else None
    with open(log, "wb") as out, open(err or os.devnull, "wb") as errf:
        if not stdout_only:
            out.write(("$ " + " ".join(cmd) + "\n").encode())
            out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=errf if stdout_only else subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc.pid)
            rc = proc.wait()
        _kill_tree_quiet(proc.pid)
    seconds = time.perf_counter() - t0
    text = log.read_text(errors="replace") + (err.read_text(errors="replace") if err else "")
    result = None
    for line in text.splitlines():
        if line.startswith(RESULT):
            try:
                result = json.loads(line[len(RESULT):])
            except ValueError:
                pass
    return {"rc": rc, "seconds": round(seconds, 3), "timed_out": timed_out, "tail": text[-2000:], "result": result}


def _kill_tree_quiet(pid: int) -> None:
    """What a finished child left in its process group (nothing, normally)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _failure(r: dict[str, Any], what: str) -> str:
    if r["timed_out"]:
        return f"{what}: killed at its time limit after {r['seconds']:.0f} s"
    lines = [ln for ln in r["tail"].splitlines() if ln.strip() and not ln.startswith(RESULT)]
    return f"{what}: exit {r['rc']}: " + " | ".join(lines[-3:])[-400:]


def child(name: str, out: Path, ctx: Ctx, *extra: str) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", str(out), *extra]
    return argv + (["--cpu-rehearsal"] if ctx.cpu else [])


class Ctx:
    def __init__(self, out: Path, cpu: bool, budget: Budget, env: dict[str, str]) -> None:
        self.out, self.cpu, self.budget, self.env = out, cpu, budget, env
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))


def base_env() -> dict[str, str]:
    """This process's environment with PYTHONPATH made absolute and hpcml's src on it: the
    children, hpcml run's ranks and their own children run from other directories."""
    env = dict(os.environ)
    parts = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    src = str(ROOT / "src")
    if src not in parts:
        parts.append(src)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for k in (*FR_ENV, "HPCML_GPM_REPLAY", "HPCML_OBSERVE_NVML_REPLAY"):
        env.pop(k, None)                      # set per part, never inherited by accident
    return env


def source_state() -> dict[str, Any]:
    """The checkout's commit and whether it has changes (None where no .git travelled)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None}
    if head.returncode != 0:
        return {"commit": None}
    return {"commit": head.stdout.strip(), "changed_files": dirty.stdout.split()[1::2] if dirty.returncode == 0 else None}


def median(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


# --- part env --------------------------------------------------------------------------


def part_env(ctx: Ctx, limit: float) -> dict[str, Any]:
    d = ctx.out / "env"
    r = run_cmd(child("env", d, ctx), timeout=limit, log=d / "env.log", env=ctx.env)
    res: dict[str, Any] = dict(r["result"] or {})
    smi = shutil.which("nvidia-smi")
    if smi:
        s = run_cmd([smi, "--query-gpu=name,driver_version,memory.total,pstate,clocks.max.sm,power.limit",
                     "--format=csv"], timeout=20, log=d / "nvidia-smi.csv", env=ctx.env)
        res["nvidia_smi"] = s["tail"].splitlines()[1:]
    v = run_cmd([sys.executable, "-m", "hpcml", "version"], timeout=min(limit, 60), log=d / "hpcml-version.log", env=ctx.env)
    res["hpcml_version"] = {"rc": v["rc"], "seconds": v["seconds"], "output": v["tail"].splitlines()[1:][-3:]}
    gpu = res.get("gpu") or "no GPU"
    missing = [k for k, val in (res.get("packages") or {}).items() if val is None]
    status = "ok" if r["rc"] == 0 and v["rc"] == 0 else "failed"
    res.update(status=status, key=f"{gpu}; torch {res.get('torch')}; hpcml starts: {v['rc'] == 0}"
               + (f"; missing {', '.join(missing)}" if missing else ""))
    if r["rc"] != 0:
        res["error"] = _failure(r, "env probe")
    elif v["rc"] != 0:
        res["error"] = _failure(v, "python -m hpcml version")
    return res


# --- part fr ---------------------------------------------------------------------------


def fr_stats(doc: Any) -> dict[str, Any]:
    """What a Flight Recorder dump holds: entries by group, operation and state, timing."""
    if not isinstance(doc, dict):
        return {"error": f"not a dict: {type(doc).__name__}"}
    entries = [e for e in doc.get("entries") or [] if isinstance(e, dict)]

    def pg(e: dict) -> str:
        p = e.get("process_group")
        return "/".join(str(x) for x in p) if isinstance(p, (list, tuple)) else str(p if p is not None else e.get("pg_id"))
    return {
        "version": doc.get("version"), "nccl_version": doc.get("nccl_version"), "keys": sorted(map(str, doc)),
        "entries": len(entries), "by_group": dict(Counter(pg(e) for e in entries)),
        "by_op": dict(Counter(str(e.get("profiling_name")) for e in entries)),
        "states": dict(Counter(str(e.get("state")) for e in entries)),
        "with_duration_ms": sum(1 for e in entries if e.get("duration_ms") is not None),
        "with_time_started": sum(1 for e in entries if e.get("time_discovered_started_ns") is not None),
        "entry_keys": sorted(map(str, entries[0])) if entries else [],
        "durations_ms": [e.get("duration_ms") for e in entries][:200],
        "groups_configured": len(doc.get("pg_config") or {}),
    }


def read_dump(path: Path) -> tuple[Any, str]:
    """A dump as hpcml reads it (pickles through hang.load_dump's restricted unpickler; where
    that refuses, our own fresh dump through pickle, and the refusal said)."""
    if path.suffix == ".json":
        return json.loads(path.read_bytes()), "json"
    try:
        from hpcml.observe.hang import load_dump
        return load_dump(path), "hpcml.observe.hang.load_dump: read"
    except Exception as exc:  # noqa: BLE001 - recorded: the fixture is what the tests need
        with open(path, "rb") as f:
            return pickle.load(f), f"hpcml.observe.hang.load_dump refused it: {type(exc).__name__}: {exc}"  # noqa: S301 - our own dump


def part_fr(ctx: Ctx, limit: float) -> dict[str, Any]:
    d = ctx.out / "fr"
    env = {**ctx.env, **FR_ENV}
    r = run_cmd(child("fr", d, ctx), timeout=limit, log=d / "fr.log", env=env)
    res: dict[str, Any] = {"child": r["result"] or {}, "env": FR_ENV}
    dumps: dict[str, Any] = {}
    for f in sorted(d.glob("*_trace*")):
        try:
            doc, how = read_dump(f)
            dumps[f.name] = {"bytes": f.stat().st_size, "read": how, **fr_stats(doc)}
        except Exception as exc:  # noqa: BLE001
            dumps[f.name] = {"bytes": f.stat().st_size, "error": f"{type(exc).__name__}: {exc}"}
    res["dumps"] = dumps
    (d / "summary.json").write_text(json.dumps({"child": res["child"], "dumps": dumps}, indent=1, default=str))
    main = "nccl_trace.pickle" if not ctx.cpu else "fr_trace.pickle"
    got = dumps.get(main) or {}
    timed = (dumps.get("nccl_trace.json") or {}).get("with_duration_ms")
    early = (dumps.get("nccl_trace_early.json") or {}).get("with_duration_ms")
    generic = (dumps.get("fr_trace.pickle") or {}).get("entries")
    res["key"] = (f"{main}: {got.get('entries')} entries in {len(got.get('by_group') or {})} groups"
                  + (f", duration_ms {timed} (early {early})" if not ctx.cpu else "")
                  + f"; generic FR {generic}")
    ok = r["rc"] == 0 and bool(got.get("entries"))
    res["status"] = "ok" if ok else "failed"
    if not ok:
        res["error"] = _failure(r, "fr child") if r["rc"] != 0 else f"{main}: {got.get('error') or 'no entries'}"
    return res


# --- part steps ------------------------------------------------------------------------


def part_steps(ctx: Ctx, limit: float) -> dict[str, Any]:
    d = ctx.out / "steps"
    r = run_cmd(child("steps", d, ctx), timeout=limit, log=d / "steps.log", env=ctx.env)
    res: dict[str, Any] = {"child": r["result"] or {}}
    rows = [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines()] if (d / "steps.jsonl").exists() else []
    by: dict[str, list[dict]] = {}
    for row in rows:
        by.setdefault(row["phase"], []).append(row)
    for phase, rs in by.items():
        res[phase] = {"steps": len(rs), "cuda_ms_median": median([x.get("cuda_ms") for x in rs]),
                      "backward_ms_median": median([x.get("backward_ms") for x in rs]),
                      "wall_ms_median": median([x.get("wall_ms") for x in rs]),
                      "buckets_per_step": median([len(x.get("buckets_ms") or []) for x in rs]),
                      "bucket_ms_median": median([sum(x.get("buckets_ms") or [0]) for x in rs]) if phase == "hooked" else None}
    a, s = res.get("async") or {}, res.get("sync") or {}
    unit = "perf_counter ms" if ctx.cpu else "CUDA ms"
    res["key"] = (f"{len(rows)} steps; median {a.get('cuda_ms_median')} {unit}, enqueue {a.get('wall_ms_median')} ms; "
                  f"synced {s.get('cuda_ms_median')}/{s.get('wall_ms_median')} ms; "
                  f"buckets {(res.get('hooked') or {}).get('bucket_ms_median')} ms")
    ok = r["rc"] == 0 and len(by.get("async") or []) >= 50
    res["status"] = "ok" if ok else ("partial" if rows else "failed")
    if not ok:
        res["error"] = _failure(r, "steps child") if r["rc"] != 0 else f"only {len(rows)} step lines"
    return res


# --- part sampler ----------------------------------------------------------------------


def part_sampler(ctx: Ctx, limit: float, reps: int = 5) -> dict[str, Any]:
    d = ctx.out / "sampler"
    d.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + limit
    log = ctx.tmp / "sampler-logs"
    modes = ["auto", "gpm", "nvml"] + (["replay"] if ctx.cpu else [])
    runs: dict[str, list[dict]] = {m: [] for m in ["nvmlinit", *modes]}
    errors: list[str] = []
    for rep in range(reps):
        for mode in runs:
            left = deadline - time.monotonic()
            if left < 5:
                errors.append(f"out of time before {mode} repetition {rep + 1}")
                break
            env = dict(ctx.env)
            if mode == "replay":
                env["HPCML_GPM_REPLAY"] = str(GPM_REPLAY)
            extra = ["--mode", "gpm" if mode == "replay" else mode]
            if rep == 0 and mode in ("auto", "replay"):
                extra += ["--samples", str(d / ("samples.json" if mode == "auto" else "samples-replay.json"))]
            r = run_cmd(child("nvmlinit" if mode == "nvmlinit" else "sampler", d, ctx, *extra), timeout=min(30, left),
                        log=log / f"{mode}-{rep}.log", env=env)
            got = dict(r["result"] or {})
            got["process_s"] = r["seconds"]
            if r["rc"] != 0 or not r["result"]:
                got["error"] = _failure(r, f"{mode} #{rep + 1}")
                errors.append(got["error"])
            runs[mode].append(got)
    with open(d / "sampler.log", "w") as f:          # every child's output, one file
        for p in sorted(log.glob("*.log")):
            f.write(f"=== {p.name}\n{p.read_text(errors='replace')[-3000:]}\n")
    res: dict[str, Any] = {"runs": runs, "errors": errors[:20]}
    for mode, rs in runs.items():
        res[mode] = {k: median([x.get(k) for x in rs]) for k in
                     ("import_ms", "open_ms", "first_sample_ms", "second_sample_ms", "close_ms", "init_ms", "process_s")}
        res[mode]["kind"] = sorted({str(x.get("kind")) for x in rs})
        res[mode]["rows"] = [x.get("rows") for x in rs]
    auto, raw = res["auto"], res["nvmlinit"]
    kinds = auto["kind"]
    real = [k for k in kinds if k not in ("none", "None")]
    res["key"] = (f"auto -> {'/'.join(kinds)}: open {auto['open_ms']} ms, first sample {auto['first_sample_ms']} ms, "
                  f"import {auto['import_ms']} ms; nvmlInit {raw['init_ms']} ms"
                  + (f"; replay open {res['replay']['open_ms']} ms" if ctx.cpu else ""))
    if ctx.cpu:
        res["status"] = "no GPU" if not real and not errors else ("failed" if errors else "ok")
    else:
        res["status"] = "ok" if real and not errors else ("partial" if real else "failed")
    if errors:
        res["error"] = errors[0]
    elif not real:
        res["error"] = "no GPU sampler opened: " + str((runs["auto"] or [{}])[0].get("note"))
    return res


# --- part selftest ---------------------------------------------------------------------


def part_selftest(ctx: Ctx, limit: float) -> dict[str, Any]:
    d = ctx.out / "selftest"
    keep = ctx.tmp / "selftest"
    r = run_cmd([sys.executable, "-m", "hpcml", "score", "selftest", "--seconds", "10", "--dir", str(keep)],
                timeout=limit - 15, log=d / "selftest.txt", env=ctx.env)
    res: dict[str, Any] = {"rc": r["rc"], "timed_out": r["timed_out"], "seconds_run": r["seconds"],
                           "json": "hpcml score selftest has no --json option: its text output is kept"}
    lines = r["tail"].splitlines()
    res["verdict"] = next((ln for ln in lines if ln.startswith("selftest:")), None)
    res["workloads"] = [ln for ln in lines if ln.startswith(("compute:", "memory:"))]
    if ctx.cpu and not (keep / "compute").is_dir():       # the score report's path below, on replayed GPU rows
        for kind, phase in (("compute", "gemm_bf16"), ("memory", "copy_hbm")):
            env = {**ctx.env, "HPCML_GPM_REPLAY": str(GPM_REPLAY), "HPCML_GPM_REPLAY_PHASES": phase}
            run_cmd([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(keep / kind), "--interval", "0.5",
                     "--gpu-metrics", "gpm", "--", sys.executable, "-c", "import time; time.sleep(3)"],
                    timeout=30, log=ctx.tmp / f"replay-{kind}.log", env=env)
        res["replayed"] = "rehearsal: the score reports below are of the H100 GPM replay, not of the selftest"
    for kind in ("compute", "memory"):
        if (keep / kind).is_dir():
            s = run_cmd([sys.executable, "-m", "hpcml", "score", "report", str(keep / kind), "--json", "--no-html"],
                        timeout=30, log=ctx.tmp / f"score-{kind}.json", env=ctx.env, stdout_only=True)
            text = (ctx.tmp / f"score-{kind}.json").read_text()
            if s["rc"] == 0:
                (d / f"{kind}.score.json").write_text(text)
                try:
                    rep = json.loads(text)
                    res[kind] = {"score": rep.get("score"), "bound": rep.get("bound"), "breakdown": rep.get("breakdown")}
                except ValueError:
                    pass
            else:
                res[f"{kind}_report_error"] = _failure(s, f"score report {kind}")
    no_gpu = r["rc"] == 2 and "GPU" in r["tail"]
    res["status"] = "ok" if r["rc"] == 0 else ("no GPU" if ctx.cpu and no_gpu else "failed")
    res["key"] = f"exit {r['rc']}: {res['verdict'] or (lines[-1] if lines else '')}"[:160]
    if r["rc"] != 0:
        res["error"] = _failure(r, "hpcml score selftest")
    return res


# --- part run --------------------------------------------------------------------------

TRAIN = '''"""A small training job for gpu_check.py's ``hpcml run`` part: DDP over NCCL on the GPU
(gloo on the CPU rehearsal), a plain torch.optim loop that logs nothing itself (hpcml counts
its optimizer steps), each step timed with CUDA events into --out/train_steps.jsonl. At the
end the Flight Recorder is dumped the way hpcml's own sitecustomize does it for the watch
(``hpcml.run.inject.sitecustomize._dump``), and the entry counts of both recorders go into
--out/train_fr.json; when it started, when its first step ended and its steps' median times
go into --out/train_timing.json (the cost part compares launchers and settings by them)."""
import time
T0 = time.time()                       # before torch's import: the launcher's cost is after it
import argparse, json, os, pickle, statistics
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=20.0)
ap.add_argument("--out", required=True)
ap.add_argument("--cpu", action="store_true")
args = ap.parse_args()
cuda = not args.cpu
dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
if cuda:
    torch.cuda.set_device(dev)
dist.init_process_group("nccl" if cuda else "gloo")
width, batch = (2048, 4096) if cuda else (64, 64)
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                            torch.nn.Linear(4 * width, width))]).to(dev)
model = DDP(model, device_ids=[dev.index] if cuda else None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(batch, width, device=dev)
events, walls, t_end, step, first_end = [], [], time.time() + args.seconds, 0, None
while time.time() < t_end or step < 20:
    walls.append(time.perf_counter())
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
    else:
        a = time.perf_counter()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
        loss = model(x).float().square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if cuda:
        b.record()
    else:
        b = time.perf_counter()
    events.append((a, b))
    step += 1
    if step == 1:
        loss.item()                    # the first step done: what a launcher's start costs ends here
        first_end = time.time()
    if step % 10 == 0:
        loss.item()                    # keeps the CPU at most 10 steps ahead
if cuda:
    torch.cuda.synchronize()
with open(os.path.join(args.out, "train_steps.jsonl"), "w") as f:
    for i, (a, b) in enumerate(events, 1):
        ms = a.elapsed_time(b) if cuda else (b - a) * 1000
        f.write(json.dumps({"step": i, "cuda_ms" if cuda else "wall_ms": round(ms, 4)}) + "\\n")
ms = [a.elapsed_time(b) if cuda else (b - a) * 1000 for a, b in events][5:]
wall = [(b - a) * 1000 for a, b in zip(walls[5:], walls[6:])]
with open(os.path.join(args.out, "train_timing.json"), "w") as f:
    json.dump({"t0": T0, "first_step_end": first_end, "steps": step,
               "step_ms_median": round(statistics.median(ms), 4) if ms else None,
               "wall_ms_median": round(statistics.median(wall), 4) if wall else None,
               "env": {k: os.environ.get(k) for k in ("TORCH_NCCL_ENABLE_TIMING", "TORCH_FR_BUFFER_SIZE",
                                                     "HPCML_RUN_FR_EVERY")}}, f)
fr = {"steps": step}
c10d = torch._C._distributed_c10d
for name in ("_dump_fr_trace", "_dump_nccl_trace"):
    fn = getattr(c10d, name, None)
    try:
        fr[name] = None if fn is None else len(pickle.loads(fn(True, False, False)).get("entries") or [])
    except Exception as exc:
        fr[name] = f"{type(exc).__name__}: {exc}"
try:
    from hpcml.run.inject import sitecustomize as site
    if os.environ.get(site.ENV):
        site._dump(os.environ[site.ENV], 0)
        fr["hpcml_dump"] = "written"
    else:
        fr["hpcml_dump"] = "no " + site.ENV
except Exception as exc:
    fr["hpcml_dump"] = f"{type(exc).__name__}: {exc}"
with open(os.path.join(args.out, "train_fr.json"), "w") as f:
    json.dump(fr, f)
print(f"trained {step} steps, final loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
'''


def part_run(ctx: Ctx, limit: float) -> dict[str, Any]:
    d = ctx.out / "run"
    d.mkdir(parents=True, exist_ok=True)
    job = ctx.tmp / "job"
    script = d / "train_gpu.py"
    script.write_text(TRAIN)
    cmd = [sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--dir", str(job), "--",
           sys.executable, str(script), "--seconds", "8" if ctx.cpu else "20", "--out", str(d)]
    env = {**ctx.env, "HPCML_RUN_FR_EVERY": "5"}      # the live dumps the arrivals read, often enough to see some
    r = run_cmd(cmd + (["--cpu"] if ctx.cpu else []), timeout=limit - 20, log=d / "report.txt", env=env, cwd=ctx.tmp)
    res: dict[str, Any] = {"rc": r["rc"], "timed_out": r["timed_out"], "seconds_run": r["seconds"], "files": {}}
    copies = {"run.json": "run.json", "logs/rank-00000.out": "rank-00000.out", "logs/rank-00000.err": "rank-00000.err",
              "observe/flight-recorder/rank-00000": "fr-rank-00000.pickle",
              "observe/flight-recorder-live/rank-00000": "fr-live-rank-00000.pickle"}
    for p in sorted((job / "observe").glob("*.json")):
        copies[f"observe/{p.name}"] = f"observe-{p.name}"
    for p in sorted((job / "observe" / "beat").glob("*")):         # the heartbeat: GPU throttling as NVML said it
        if p.is_file() and p.stat().st_size <= 1 << 20:
            copies[f"observe/beat/{p.name}"] = f"beat-{p.name}"
    for p in sorted((job / "observe").glob("rank-*.arrows")):       # the store: GPU rows while it trained
        if p.stat().st_size <= MAX_STORE:
            copies[f"observe/{p.name}"] = f"observe-{p.name}"
    if (job / "report.html").is_file() and (job / "report.html").stat().st_size <= MAX_HTML:
        copies["report.html"] = "report.html"
    for src, dst in copies.items():
        if (job / src).is_file():
            shutil.copyfile(job / src, d / dst)
            res["files"][dst] = (d / dst).stat().st_size
    if (job / "run.json").is_file():
        rep = run_cmd([sys.executable, "-m", "hpcml", "report", str(job), "--json"], timeout=45,
                      log=ctx.tmp / "report.json", env=ctx.env, cwd=ctx.tmp, stdout_only=True)
        if rep["rc"] == 0:
            shutil.copyfile(ctx.tmp / "report.json", d / "report.json")
        else:
            res["report_json_error"] = _failure(rep, "hpcml report --json")
        s = run_cmd(child("summary", d, ctx, "--job", str(job)), timeout=45, log=ctx.tmp / "summary.log", env=ctx.env)
        if s["rc"] != 0:
            res["summary_error"] = _failure(s, "summary")
    if (d / "fr-rank-00000.pickle").is_file():
        try:
            doc, how = read_dump(d / "fr-rank-00000.pickle")
            res["hpcml_fr_dump"] = {"read": how, **{k: v for k, v in fr_stats(doc).items() if k != "durations_ms"}}
        except Exception as exc:  # noqa: BLE001
            res["hpcml_fr_dump"] = {"error": f"{type(exc).__name__}: {exc}"}
    if (d / "fr-live-rank-00000.pickle").is_file():
        res["live_dump"] = live_dump_stats(d / "fr-live-rank-00000.pickle")
    for name in ("train_fr.json", "train_timing.json"):
        if (d / name).is_file():
            res[name] = json.loads((d / name).read_text())
    if (d / "train_steps.jsonl").is_file():
        lines = [json.loads(x) for x in (d / "train_steps.jsonl").read_text().splitlines()]
        res["script_steps"] = len(lines)
        res["script_step_ms_median"] = median([x.get("cuda_ms", x.get("wall_ms")) for x in lines[5:]])
    for p in sorted(d.glob("beat-*")):
        try:
            doc = json.loads(p.read_bytes().rstrip(b" \x00"))
            res.setdefault("beats", {})[p.name] = {k: doc.get(k) for k in (
                "rank", "gpu_throttled_s", "gpu_throttle", "cpu_wait_s", "steal_s", "exit")}
        except ValueError as exc:
            res.setdefault("beats", {})[p.name] = {"error": str(exc)}
    key = _run_key(d)
    res.update(key)
    step_ms = round(key["hpcml_step_s"] * 1000, 3) if key.get("hpcml_step_s") is not None else None
    res["key"] = (f"exit {r['rc']}; {key.get('hpcml_steps')} steps counted ({res.get('script_steps')} run), "
                  f"mean {step_ms} ms (script's median {res.get('script_step_ms_median')} ms), "
                  f"collective wait {key.get('collective_wait_share')}; GPU score {key.get('gpu_score')} "
                  f"{key.get('gpu_bound') or ''}; sampler {key.get('gpu_sampler')}; "
                  f"live dump {(res.get('live_dump') or {}).get('collectives')} collectives, "
                  f"{(res.get('live_dump') or {}).get('timed')} timed")
    res["status"] = "ok" if r["rc"] == 0 and (d / "run.json").is_file() and (d / "report.json").is_file() else "failed"
    if r["rc"] != 0:
        res["error"] = _failure(r, "hpcml run")
    elif res["status"] != "ok":
        res["error"] = res.get("report_json_error") or "no run.json or report.json"
    return res


def live_dump_stats(path: Path) -> dict[str, Any]:
    """A rank's periodic dump as ``hpcml.observe.arrivals`` reads it: its collectives, how many
    carry the kernel's duration (``TORCH_NCCL_ENABLE_TIMING``, set by hpcml run), and the
    arrivals of the same dump read as two ranks whose second arrives 1 ms later in each: the
    measure it judged them by and the rank it names."""
    try:
        from hpcml.observe.arrivals import arrivals, reduce, straggler
        from hpcml.observe.hang import load_dump
        red = reduce(load_dump(path))
        times = [t for seqs in red["times"].values() for t in seqs.values()]
        out: dict[str, Any] = {"groups": len(red["times"]), "collectives": len(times),
                               "timed": sum(t[1] is not None for t in times)}
        # rank 1 enqueues 1 ms later, so rank 0 waits 1 ms longer in each collective
        waited = {pg: {q: (c, None if took is None else took + 0.001) for q, (c, took) in seqs.items()}
                  for pg, seqs in red["times"].items()}
        late = {pg: {q: (c + 0.001, took) for q, (c, took) in seqs.items()} for pg, seqs in red["times"].items()}
        config = {k: {**v, "ranks": "[0, 1]"} for k, v in red["pg_config"].items() if isinstance(v, dict)}
        scores = arrivals({0: {"pg_config": config, "times": waited}, 1: {"pg_config": config, "times": late}})
        top = straggler(scores)
        out.update(measure=scores[0].measure if scores else None, named=top.rank if top else None,
                   late_ms=round(top.late_s * 1000, 3) if top else None)
        return out
    except Exception as exc:  # noqa: BLE001 - recorded beside the rest
        return {"error": f"{type(exc).__name__}: {exc}"}


def _run_key(d: Path) -> dict[str, Any]:
    """The few figures of the job's report worth a glance: steps, step time, the time in
    collectives, the GPU score, the sampler the rank's recorder used."""
    out: dict[str, Any] = {}
    try:
        rep = json.loads((d / "report.json").read_text())
    except (OSError, ValueError):
        return out
    obs = rep.get("observe") or {}
    steps = (obs.get("progress") or {}).get("steps") or {}
    sections = obs.get("sections") or {}
    out["hpcml_steps"] = steps.get("count")
    out["hpcml_step_s"] = (sections.get("step") or {}).get("mean_s")
    out["collective_wait_share"] = (sections.get("collective_wait") or {}).get("share_of_step")
    out["throughput"] = {k: (obs.get("throughput") or {}).get(k) for k in ("median", "unit")}
    out["stragglers"] = len(obs.get("stragglers") or [])
    score = rep.get("score") or {}
    out["gpu_score"], out["gpu_bound"] = score.get("score"), score.get("bound")
    out["score_missing"] = rep.get("score_missing")
    out["findings"] = [f.get("message") for f in rep.get("findings") or [] if isinstance(f, dict)][:10]
    try:
        meta = json.loads((d / "observe-rank-00000.json").read_text())
        out["gpu_sampler"] = (meta.get("gpu_sampler") or {}).get("kind")
    except (OSError, ValueError):
        out["gpu_sampler"] = None
    return out


# --- part cost -------------------------------------------------------------------------

# (name, launcher, extra environment, extra hpcml run flags): what hpcml run costs a GPU rank
# beside torchrun, and what its NCCL timing and its GPU sampler each cost
COSTS: list[tuple[str, str, dict[str, str], list[str]]] = [
    ("torchrun", "torchrun", {}, []),
    ("hpcml", "hpcml", {"HPCML_RUN_FR_EVERY": "5"}, []),
    ("hpcml-no-timing", "hpcml", {"HPCML_RUN_FR_EVERY": "5", "TORCH_NCCL_ENABLE_TIMING": "0"}, []),
    ("hpcml-no-sampler", "hpcml", {"HPCML_RUN_FR_EVERY": "5"}, ["--gpu-metrics", "none"]),
]


STORAGE_TRAIN = '''"""gpu_check.py's storage part: a model trained on the GPU (or the CPU in a rehearsal)
that saves a 1.6 GB state with torch.save every 150 steps, as a script does, for --steps
steps: the checkpoint's write burst and the throughput drop it causes, for hpcml's report."""
import argparse, os, time
import torch
ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=600)
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--out", required=True)
a = ap.parse_args()
dev = "cpu" if a.cpu else "cuda"
width = 256 if a.cpu else 2048
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
blob = torch.randn(400_000_000 if not a.cpu else 50_000_000, device=dev)      # state beside the model
for step in range(1, a.steps + 1):
    loss = model(torch.randn(256, width, device=dev)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    if step % 150 == 0:
        path = os.path.join(a.out, "ckpt.pt")
        t = time.perf_counter()
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "blob": blob}, path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        print(f"saved step {step} in {time.perf_counter() - t:.2f} s, {os.path.getsize(path)} bytes", flush=True)
        os.unlink(path)
'''


def part_storage(ctx: Ctx, limit: float) -> dict[str, Any]:
    """Storage beside throughput on real hardware (issue 71): ``hpcml run`` of a GPU job that
    checkpoints while it trains; the report's ``io`` (each rank's reads and writes, the I/O in
    each job-wide stall) and its findings (``io_burst``)."""
    d = ctx.out / "storage"
    d.mkdir(parents=True, exist_ok=True)
    job, scratch = ctx.tmp / "storage-job", ctx.tmp / "storage-out"
    scratch.mkdir(exist_ok=True)
    script = d / "train_storage.py"
    script.write_text(STORAGE_TRAIN)
    cmd = [sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--interval", "0.2", "--dir", str(job), "--no-report",
           "--", sys.executable, str(script), "--out", str(scratch), *(["--cpu", "--steps", "300"] if ctx.cpu else [])]
    r = run_cmd(cmd, timeout=limit - 30, log=d / "run.txt", env=ctx.env, cwd=ctx.tmp)
    res: dict[str, Any] = {"rc": r["rc"], "timed_out": r["timed_out"], "seconds_run": r["seconds"]}
    rep = run_cmd([sys.executable, "-m", "hpcml", "observe", "report", str(job / "observe"), "--json", "--min-stall",
                   "0.3"], timeout=45, log=d / "report.json", env=ctx.env, cwd=ctx.tmp, stdout_only=True)
    try:
        doc = json.loads((d / "report.json").read_text())
        res["io"] = doc.get("io")
        res["stalls"] = doc.get("stalls")
        res["findings"] = [f for f in doc.get("findings", []) if f.get("kind") in ("io_burst", "foreign_io",
                                                                                  "io_imbalance", "job_stall")]
        res["throughput"] = doc.get("throughput")
    except ValueError as exc:
        res["error"] = f"report: {exc}: {_failure(rep, 'hpcml observe report')}"
    store = d / "observe"                                          # the recording itself: the report is rebuilt from it
    store.mkdir(exist_ok=True)
    for f in sorted((job / "observe").glob("*")):
        if f.is_file() and (f.suffix == ".json" or (f.suffix == ".arrows" and f.stat().st_size <= MAX_STORE)):
            shutil.copyfile(f, store / f.name)
    out_log = job / "logs" / "rank-00000.out"                     # the rank's own output (hpcml run keeps it)
    if out_log.is_file():
        shutil.copyfile(out_log, d / "rank-00000.out")
    res["saves"] = [ln.strip() for ln in (out_log.read_text(errors="replace").splitlines() if out_log.is_file() else [])
                    if "saved step" in ln]
    burst = [f for f in res.get("findings", []) if f.get("kind") == "io_burst"]
    res["key"] = (f"exit {r['rc']}; {len(res['saves'])} saves; {len(res.get('stalls') or [])} stalls; "
                  + (burst[0]["message"] if burst else "no io_burst finding"))
    res["status"] = "ok" if r["rc"] == 0 and "io" in res else "failed"
    return res


def part_cost(ctx: Ctx, limit: float, reps: int = 2, seconds: float = 8.0) -> dict[str, Any]:
    """The training script of part run, ``seconds`` long, under each of ``COSTS``, interleaved
    ``reps`` times: the time from the launch to its first step's end, its median step (CUDA
    events, and the CPU's wall time between steps), and for hpcml run when the rank's GPU
    sampler opened (after the command started) and what the open took."""
    d = ctx.out / "cost"
    d.mkdir(parents=True, exist_ok=True)
    script = d / "train_gpu.py"
    script.write_text(TRAIN)
    deadline = time.monotonic() + limit - 5
    rows: list[dict[str, Any]] = []
    for rep in range(reps):
        for name, launcher, extra, flags in COSTS:
            left = deadline - time.monotonic()
            if left < seconds + 15:
                rows.append({"config": name, "rep": rep, "skipped": "out of time"})
                continue
            out = ctx.tmp / f"cost-{name}-{rep}"
            out.mkdir(parents=True, exist_ok=True)
            train = [sys.executable, str(script), "--seconds", str(seconds), "--out", str(out)] + (["--cpu"] if ctx.cpu else [])
            if launcher == "torchrun":
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *train[1:]]
            else:
                cmd = [sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--no-report", "--dir", str(out / "job"),
                       *flags, "--", *train]
            launched = time.time()
            r = run_cmd(cmd, timeout=min(left, seconds + 90), log=d / f"{name}-{rep}.log", env={**ctx.env, **extra}, cwd=out)
            row: dict[str, Any] = {"config": name, "rep": rep, "rc": r["rc"], "seconds": r["seconds"]}
            try:
                t = json.loads((out / "train_timing.json").read_text())
                row.update(to_script_s=round(t["t0"] - launched, 3),
                           to_first_step_s=round(t["first_step_end"] - launched, 3) if t.get("first_step_end") else None,
                           steps=t["steps"], step_ms=t["step_ms_median"], wall_ms=t["wall_ms_median"], env=t.get("env"))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                row["error"] = f"no train_timing.json: {exc}; " + _failure(r, name)
            meta = out / "job" / "observe" / "rank-00000.json"
            if meta.is_file():
                try:
                    m = json.loads(meta.read_text())
                    opened, started = m.get("gpu_sampler_opened"), m.get("command_started")
                    row.update(sampler=(m.get("gpu_sampler") or {}).get("kind"), sampler_open_s=m.get("gpu_sampler_open_s"),
                               sampler_opened_after_command_s=round(opened - started, 3)
                               if isinstance(opened, (int, float)) and isinstance(started, (int, float)) else None)
                except (OSError, ValueError):
                    pass
            rows.append(row)
            print(f"gpu_check: cost {name} #{rep}: {row}", flush=True)
    (d / "cost.json").write_text(json.dumps(rows, indent=1))
    by: dict[str, dict[str, Any]] = {}
    for name, *_ in COSTS:
        got = [x for x in rows if x["config"] == name and x.get("rc") == 0 and "error" not in x]
        by[name] = {k: median([x[k] for x in got if isinstance(x.get(k), (int, float))])
                    for k in ("to_script_s", "to_first_step_s", "step_ms", "wall_ms", "sampler_open_s",
                              "sampler_opened_after_command_s")}
        by[name]["runs"] = len(got)
    res: dict[str, Any] = {"rows": rows, "by_config": by, "seconds_each": seconds, "reps": reps}

    def f(name: str, k: str, unit: str = "") -> str:
        v = by.get(name, {}).get(k)
        return "?" if v is None else f"{v:.3g}{unit}"
    res["key"] = (f"first step {f('torchrun', 'to_first_step_s', ' s')} torchrun, {f('hpcml', 'to_first_step_s', ' s')} hpcml; "
                  f"step {f('torchrun', 'step_ms')}/{f('hpcml', 'step_ms')}/{f('hpcml-no-timing', 'step_ms')}/"
                  f"{f('hpcml-no-sampler', 'step_ms')} ms (torchrun/hpcml/no timing/no sampler); "
                  f"sampler open {f('hpcml', 'sampler_open_s', ' s')} at +{f('hpcml', 'sampler_opened_after_command_s', ' s')}")
    res["status"] = "ok" if all(v["runs"] == reps for v in by.values()) else "failed"
    if res["status"] != "ok":
        res["error"] = "; ".join(f"{x['config']}#{x['rep']}: {x.get('error') or x.get('skipped') or 'exit ' + str(x.get('rc'))}"
                                 for x in rows if x.get("rc") != 0 or "error" in x or "skipped" in x)[:600]
    return res


# --- the parent's main -----------------------------------------------------------------

PARTS: list[tuple[str, Callable[[Ctx, float], dict[str, Any]], float]] = [
    ("env", part_env, 45), ("fr", part_fr, 110), ("steps", part_steps, 100), ("sampler", part_sampler, 80),
    ("selftest", part_selftest, 130), ("run", part_run, 150), ("storage", part_storage, 150), ("cost", part_cost, 240)]

README = """# gpu_check.py's recording ({mode}, {date})

Written by `benchmarks/gpu_check.py` (issue 67 item 5); everything measured is in
`gpu_check.json` (`{schema}`), the table in `table.txt`.

- `env/`: the machine: `env.log` (torch, CUDA, NCCL, packages), `nvidia-smi.csv`,
  `hpcml-version.log`.
- `fr/`: Flight Recorder dumps, raw as torch wrote them: `nccl_trace.pickle`
  (`_dump_nccl_trace()`), `nccl_trace.json` (`_dump_nccl_trace_json()`, 2 s after the
  work), `nccl_trace_early.json` (right after it), `fr_trace.pickle`
  (`_dump_fr_trace(True, False, False)`, what hpcml run's sitecustomize dumps),
  `fr_trace.json` (`_dump_fr_trace_json()`); `fr.log` (the child's output),
  `summary.json` (each dump's entries by group, operation and state; timing).
- `steps/`: `steps.jsonl`, one line a step: `phase` (async: enqueued back to back; sync:
  synchronised each; hooked: DDP's buckets timed by a comm hook), `cuda_ms`,
  `backward_ms`, `wall_ms` (the CPU's), `buckets_ms`.
- `sampler/`: `samples.json`, the rows of the GPU sampler `auto` chose (store rows:
  ts_ns, kind, name, value, tag, gpu) and its label; `sampler.log`, every child's output.
- `selftest/`: `selftest.txt` (`hpcml score selftest`'s output; its exit code is in
  gpu_check.json), `compute.score.json` and `memory.score.json` (`hpcml score report
  --json` of its two recordings).
- `run/`: `hpcml run --ntasks 1` of `train_gpu.py`: `report.txt` (its whole output, the
  report at the end), `report.json`, `report.html`, `run.json`, `summary.json`,
  `rank-00000.out` and `.err`, `observe-*.json` (the recorder's metadata),
  `observe-rank-00000.arrows` (the rank's observe store: host, GPU and step rows),
  `fr-rank-00000.pickle` (the dump hpcml's sitecustomize code wrote in the rank),
  `train_steps.jsonl` (the script's own step times), `train_fr.json`, `train_timing.json`,
  `fr-live-rank-00000.pickle` (the rank's latest periodic dump, every 5 s here: what the
  arrivals read while a job runs).
- `cost/`: the same script 8 s long under torchrun, hpcml run, hpcml run without NCCL timing
  (`TORCH_NCCL_ENABLE_TIMING=0`) and without a GPU sampler (`--gpu-metrics none`), twice each,
  interleaved: `cost.json` (per run: launch to the script's start and to its first step's end,
  median step in CUDA ms and wall ms, when the sampler opened and what that took) and each
  run's log.
"""


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [("part", "status", "key figure", "seconds")]
    for name, r in results.items():
        rows.append((name, str(r.get("status")), str(r.get("key") or r.get("error") or "")[:150], f"{r.get('seconds', 0):.1f}"))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    lines.insert(1, "-+-".join("-" * x for x in w))
    errors = [f"{n}: {r['error']}" for n, r in results.items() if r.get("error") and r.get("status") != "ok"]
    return "\n".join(lines + ([""] + ["errors:"] + errors if errors else [])) + "\n"


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def archive(out: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    os.replace(tmp, target)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="Where everything recorded goes (made empty first).")
    ap.add_argument("--archive", type=Path, help="Tar DIR into this .tar.gz at the end, whatever failed.")
    ap.add_argument("--cpu-rehearsal", action="store_true", help="No GPU: gloo, perf_counter, the sampler replayed.")
    ap.add_argument("--budget", type=float, default=420.0, help="Seconds all parts share (each also capped).")
    ap.add_argument("--parts", default=",".join(p[0] for p in PARTS), help="Which parts, comma-separated.")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args)
    t_start = time.monotonic()
    out = args.out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "gpu_check.json").exists():
        ap.error(f"--out {out} holds files that are not an earlier gpu_check's: give a new or empty folder")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    wanted = [p for p in args.parts.split(",") if p]
    ctx = Ctx(out, args.cpu_rehearsal, Budget(args.budget), base_env())
    doc: dict[str, Any] = {"schema": SCHEMA, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           "mode": "cpu-rehearsal" if ctx.cpu else "gpu", "argv": sys.argv,
                           "python": sys.version.split()[0], "source": source_state(), "budget_s": args.budget,
                           "parts": {}}
    results: dict[str, dict[str, Any]] = doc["parts"]
    todo = [p for p in PARTS if p[0] in wanted]
    try:
        for i, (name, fn, cap) in enumerate(todo):
            limit = ctx.budget.limit(cap, after=len(todo) - i - 1)
            print(f"gpu_check: {name} (limit {limit:.0f} s, {ctx.budget.left():.0f} s of the budget left)", flush=True)
            t0 = time.perf_counter()
            if limit < 10:
                results[name] = {"status": "skipped", "error": f"out of time ({ctx.budget.left():.0f} s of the budget left)"}
            else:
                try:
                    results[name] = fn(ctx, limit)
                except Exception as exc:  # noqa: BLE001 - one part failing never loses the others
                    results[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-3000:]}
            results[name]["seconds"] = round(time.perf_counter() - t0, 2)
            print(f"gpu_check: {name}: {results[name].get('status')}: {results[name].get('key') or results[name].get('error')}",
                  flush=True)
            doc["total_s"] = round(time.monotonic() - t_start, 2)
            write_json(out / "gpu_check.json", doc)
    finally:
        doc["total_s"] = round(time.monotonic() - t_start, 2)
        text = table(results)
        print("\n" + text, flush=True)
        try:
            (out / "table.txt").write_text(text)
            (out / "README.md").write_text(README.format(mode=doc["mode"], date=doc["date"], schema=SCHEMA))
            write_json(out / "gpu_check.json", doc)
        finally:
            shutil.rmtree(ctx.tmp, ignore_errors=True)
            if args.archive:
                archive(out, args.archive.resolve())
                print(f"gpu_check: {args.archive} ({args.archive.stat().st_size / 1e6:.2f} MB), "
                      f"{doc['total_s']:.0f} s in all", flush=True)
    return 0 if all(r.get("status") in ("ok", "no GPU") for r in results.values()) else 1


# ---------------------------------------------------------------------------------------
# The children: each runs in its own process, prints one RESULT line


def run_child(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cpu = args.cpu_rehearsal
    fn = {"env": child_env, "fr": child_fr, "steps": child_steps, "sampler": child_sampler,
          "nvmlinit": child_nvmlinit, "summary": child_summary}[args.child]
    res: dict[str, Any] = {}
    try:
        fn(args, out, cpu, res)
        rc = 0
    except Exception as exc:  # noqa: BLE001 - said in the RESULT line, the parent records it
        res["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        rc = 1
    print(RESULT + json.dumps(res, default=str), flush=True)
    sys.stdout.flush()
    os._exit(rc)          # no interpreter teardown: NCCL's and CUDA's exit handlers cannot hang a child


def child_env(args: argparse.Namespace, out: Path, cpu: bool, res: dict[str, Any]) -> None:
    from importlib import metadata
    pk: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            pk[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pk[name] = None
    res["packages"] = pk
    res["python"] = sys.version
    res["executable"] = sys.executable
    import torch
    res["torch"] = torch.__version__
    res["torch_cuda"] = torch.version.cuda
    res["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        res["gpu"] = p.name
        res["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        res["multiprocessors"] = p.multi_processor_count
        res["gpus"] = torch.cuda.device_count()
        try:
            res["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001
            res["nccl"] = f"{type(exc).__name__}: {exc}"
    c10d = torch._C._distributed_c10d
    res["dump_functions"] = {n: (getattr(c10d, n).__doc__ or "").strip().split("\n")[0]
                             for n in dir(c10d) if "dump" in n.lower()}
    res["cpus"] = os.cpu_count()
    res["kernel"] = os.uname().release
    for k, v in res.items():
        print(f"{k}: {v}", flush=True)


class Clock:
    """CUDA events on the GPU, perf_counter on the CPU rehearsal: ``mark()`` and ``ms(a, b)``
    (read after ``sync()``)."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def ms(self, a: Any, b: Any) -> float:
        return round(a.elapsed_time(b) if self.cuda else (b - a) * 1000, 4)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def _init_dist(torch: Any, dist: Any, cpu: bool, tmp: str) -> Any:
    dev = torch.device("cpu" if cpu else "cuda:0")
    kw: dict[str, Any] = {"init_method": f"file://{tmp}", "rank": 0, "world_size": 1}
    if not cpu:
        torch.cuda.set_device(dev)
        try:
            dist.init_process_group("nccl", device_id=dev, **kw)
            return dev
        except TypeError:                       # a torch without device_id
            pass
    dist.init_process_group("gloo" if cpu else "nccl", **kw)
    return dev


def _new_group(dist: Any, desc: str, **kw: Any) -> Any:
    try:
        return dist.new_group([0], group_desc=desc, **kw)
    except TypeError:
        return dist.new_group([0], **kw)


def child_fr(args: argparse.Namespace, out: Path, cpu: bool, res: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    c10d = torch._C._distributed_c10d
    res.update(torch=torch.__version__, env={k: os.environ.get(k) for k in FR_ENV}, import_s=round(time.perf_counter() - t0, 3))
    res["dump_functions"] = sorted(n for n in dir(c10d) if "dump" in n.lower())
    store = tempfile.mktemp(prefix="gpu-check-store-")  # noqa: S306 - file:// needs a path that does not exist yet
    t1 = time.perf_counter()
    dev = _init_dist(torch, dist, cpu, store)
    if not cpu:
        try:
            res["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001
            res["nccl"] = f"{type(exc).__name__}: {exc}"
    a, b = _new_group(dist, "gpu_check_a"), _new_group(dist, "gpu_check_b")
    g = _new_group(dist, "gpu_check_gloo", backend="gloo")
    res["init_s"] = round(time.perf_counter() - t1, 3)
    res["backend"] = dist.get_backend()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).to(dev),
                device_ids=None if cpu else [0])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    issued: Counter[str] = Counter()
    t2 = time.perf_counter()
    for step in range(20):
        loss = model(torch.randn(64, 512, device=dev)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = torch.ones(4096, device=dev)
        dist.all_reduce(t, group=a)
        issued["a:all_reduce"] += 1
        if step % 5 == 0:
            dist.broadcast(t, src=0, group=b)
            got = [torch.empty_like(t)]
            dist.all_gather(got, t, group=a)
            issued.update(["b:broadcast", "a:all_gather"])
        if step % 10 == 9:
            dist.barrier()
            issued["default:barrier"] += 1
        dist.all_reduce(torch.ones(256), group=g)
        issued["gloo:all_reduce"] += 1
    if not cpu:
        torch.cuda.synchronize()
    res["steps_s"] = round(time.perf_counter() - t2, 3)
    res["issued"] = dict(issued)
    res["dumps"] = {}

    def dump(name: str, file: str | None, *args: Any) -> None:
        fn = getattr(c10d, name, None)
        if fn is None:
            res["dumps"][file or name] = "absent in this torch build"
            return
        t = time.perf_counter()
        try:
            data = fn(*args)
        except Exception as exc:  # noqa: BLE001
            res["dumps"][file or name] = f"{type(exc).__name__}: {exc}"
            return
        data = data if isinstance(data, bytes) else str(data).encode()
        res["dumps"][file or name] = {"bytes": len(data), "ms": round((time.perf_counter() - t) * 1000, 2),
                                      "args": list(args)}
        if file:
            (out / file).write_bytes(data)
    dump("_dump_nccl_trace_json", "nccl_trace_early.json")
    time.sleep(2.0)                     # the watchdog fills in duration_ms as it retires the work
    dump("_dump_nccl_trace", "nccl_trace.pickle")
    dump("_dump_nccl_trace_json", "nccl_trace.json")
    dump("_dump_nccl_trace_json", None, True, True)              # onlyActive: only its size
    dump("_dump_fr_trace", "fr_trace.pickle", True, False, False)  # what hpcml run's sitecustomize takes
    dump("_dump_fr_trace_json", "fr_trace.json")
    if "_dump_fr_trace_json" not in res["dump_functions"]:
        res["gloo_fr"] = "no _dump_fr_trace_json in this torch"
    print(RESULT + json.dumps(res, default=str), flush=True)      # kept should the teardown hang
    t3 = time.perf_counter()
    dist.destroy_process_group()
    res["destroy_s"] = round(time.perf_counter() - t3, 3)


def child_steps(args: argparse.Namespace, out: Path, cpu: bool, res: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    dev = _init_dist(torch, dist, cpu, tempfile.mktemp(prefix="gpu-check-store-"))  # noqa: S306
    clock = Clock(torch, not cpu)
    width, batch = (64, 64) if cpu else (2048, 4096)
    res.update(backend=dist.get_backend(), width=width, batch=batch, timer="perf_counter" if cpu else "cuda events")

    def build() -> tuple[Any, Any]:
        torch.manual_seed(0)
        layers = [m for _ in range(4) for m in (torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                  torch.nn.Linear(4 * width, width))]
        model = DDP(torch.nn.Sequential(*layers).to(dev), device_ids=None if cpu else [0])
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev)
    lines: list[dict[str, Any]] = []

    def steps(model: Any, opt: Any, phase: str, n: int, synced: bool, buckets: list | None = None) -> None:
        marks = []
        for i in range(n):
            w0 = time.perf_counter()
            s = clock.mark()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not cpu):
                loss = model(x).float().square().mean()
            opt.zero_grad(set_to_none=True)
            b0 = clock.mark()
            loss.backward()
            b1 = clock.mark()
            opt.step()
            e = clock.mark()
            if synced:
                clock.sync()
            marks.append((i, s, b0, b1, e, (time.perf_counter() - w0) * 1000, list(buckets or [])))
            if buckets is not None:
                buckets.clear()
        clock.sync()
        for i, s, b0, b1, e, wall, bk in marks:
            # cuda_ms: the step on the GPU's clock (perf_counter on the rehearsal); wall_ms: the
            # CPU's time to enqueue it (all of it when each step is synchronised)
            row = {"phase": phase, "step": i, "cuda_ms": clock.ms(s, e), "backward_ms": clock.ms(b0, b1),
                   "wall_ms": round(wall, 4)}
            if bk:
                row["buckets_ms"] = [clock.ms(a, b) for a, b in bk]
            lines.append(row)

    model, opt = build()
    steps(model, opt, "warmup", 5, False)
    t = time.perf_counter()
    steps(model, opt, "async", 50, False)
    res["async_s"] = round(time.perf_counter() - t, 3)
    steps(model, opt, "sync", 10, True)
    try:                                   # DDP's buckets timed by a comm hook (a model of its own)
        bucket_marks: list = []

        def timed_allreduce(state, bucket):      # no annotations: DDP checks them against GradBucket
            start = clock.mark()
            fut = default_hooks.allreduce_hook(state, bucket)

            def done(f):
                bucket_marks.append((start, clock.mark()))
                return f.value()                       # allreduce_hook's future yields the bucket itself
            return fut.then(done)
        hooked, hopt = build()
        hooked.register_comm_hook(None, timed_allreduce)
        steps(hooked, hopt, "hooked-warmup", 3, False, bucket_marks)
        steps(hooked, hopt, "hooked", 20, False, bucket_marks)
    except Exception as exc:  # noqa: BLE001 - the plain steps are kept
        res["hooked_error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    with open(out / "steps.jsonl", "w") as f:
        for row in lines:
            if not row["phase"].endswith("warmup"):
                f.write(json.dumps(row) + "\n")
    res["lines"] = sum(1 for row in lines if not row["phase"].endswith("warmup"))
    dist.destroy_process_group()


def child_sampler(args: argparse.Namespace, out: Path, cpu: bool, res: dict[str, Any]) -> None:
    """One cold open of the sampler as a rank's recorder does it (``for_task``), two samples
    ``interval`` apart as the recorder takes them (0.5 s here), and the close."""
    t0 = time.perf_counter()
    from hpcml.samplers.choose import for_task
    res["import_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    t1 = time.perf_counter()
    gpu = for_task(args.mode, [], 0.5)
    res["open_ms"] = round((time.perf_counter() - t1) * 1000, 3)
    label = gpu.meta.get("gpu_sampler") or {}
    res.update(mode=args.mode, kind=label.get("kind"), note=label.get("note"), meta=gpu.meta)
    rows: list[tuple] = []
    try:
        if gpu.sampler is not None:
            for n in ("first", "second"):
                time.sleep(0.5)
                t = time.perf_counter()
                got = gpu.sampler.sample(time.time_ns())
                res[f"{n}_sample_ms"] = round((time.perf_counter() - t) * 1000, 3)
                res[f"{n}_rows"] = len(got)
                rows += got
    finally:
        t2 = time.perf_counter()
        gpu.close()
        res["close_ms"] = round((time.perf_counter() - t2) * 1000, 3)
    res["rows"] = len(rows)
    if args.samples:
        args.samples.write_text(json.dumps({"mode": args.mode, "replay": os.environ.get("HPCML_GPM_REPLAY"),
                                            "meta": gpu.meta, "row_fields": ["ts_ns", "kind", "name", "value", "tag", "gpu"],
                                            "rows": rows}, indent=None, default=str))


def child_nvmlinit(args: argparse.Namespace, out: Path, cpu: bool, res: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    import pynvml
    res["import_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    t1 = time.perf_counter()
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver: said, not failed
        res["init_ms"] = None
        res["kind"] = "no GPU"
        res["note"] = f"nvmlInit: {type(exc).__name__}: {exc}"
        return
    res["init_ms"] = round((time.perf_counter() - t1) * 1000, 3)
    res["kind"] = "nvml"
    res["gpus"] = pynvml.nvmlDeviceGetCount()
    res["driver"] = pynvml.nvmlSystemGetDriverVersion()
    t2 = time.perf_counter()
    pynvml.nvmlShutdown()
    res["shutdown_ms"] = round((time.perf_counter() - t2) * 1000, 3)


def child_summary(args: argparse.Namespace, out: Path, cpu: bool, res: dict[str, Any]) -> None:
    from hpcml.jobmodel import dumps
    from hpcml.run.summary import build
    data = dumps(build(args.job))
    (out / "summary.json").write_bytes(data if isinstance(data, bytes) else str(data).encode())
    res["bytes"] = len(data)


if __name__ == "__main__":
    sys.exit(main())
