"""hpcml scan against picklescan 1.0.5 and modelscan 0.8.8, side by side, on the same files.

    python benchmarks/bench_scan.py [--runs 3] [--tensor-mb 1024] [--size-mb 30] [--skip-large]
                                    [--timeout 600] [--mem-limit-mb 16384] [--tools hpcml,picklescan,modelscan]
                                    [--hpcml-cmd "python -m hpcml"]

Installs picklescan 1.0.5 and modelscan 0.8.8 each in its own venv under benchmarks/.work/
(created once, reused), generates the test files once into benchmarks/.work/files/ (again
when missing or when the options change their size), then times each tool on each file:

- ``state-dict-<N>mb.pt``: ``torch.save`` (zip format) of a state dict of 128 float32
  tensors, ``--tensor-mb`` in all (default 1024);
- ``numpy-arrays-<N>mb.pkl``: ``pickle.dump(protocol=4)`` of a dict of 64 float32 numpy
  arrays, half of ``--tensor-mb``; the arrays' bytes are inline in the pickle (BINBYTES);
- ``objects-<n>.pkl``: ``pickle.dump(protocol=4)`` of a list of n small dicts
  ``{"id": i, "name": f"item{i}", "ok": i % 2 == 0}``, n = 1,000,000 at the default
  ``--size-mb 30`` (28.8 MB, 11.0M opcodes; the brief's example dict with a float score and
  a 2-string tag list gives 46.6 MB and 18M opcodes, too far from the ~30 MB / ~10M aim);
- ``abc-dicts-1000000.pkl``: ``pickle.dump(protocol=4)`` of a list of 1,000,000 dicts
  ``{'a': i, 'b': str(i), 'c': [i, i+1]}`` (37.5 MB, 16.0M opcodes: issue 20's first shape);
- ``tuples-3000000.pkl``: ``pickle.dump(protocol=2)`` of a list of 3,000,000 tuples
  ``(i, float(i), 'x'*8)`` (65.9 MB, 15.0M opcodes: issue 20's second shape);
- ``objects-<10n>.pkl``: the same small dicts with 10x the count (288 MB, past the C fast
  path's 256 MiB limit, so walked in bounded memory; ``--skip-large`` omits it).

Goals: >= 30 MB/s on every object-heavy pickle; peak RSS of hpcml <= 2.3 GB on each (the
fast path's child is capped at 2 GiB of address space over the process, ``HPCML_SCAN_MEMORY``).

Each pickle's size and opcode count (pickletools.genops, counted once at generation) are
cached in a sidecar ``FILE.json``. Tools, each run as a whole command from
benchmarks/.work/ (so no stray modelscan-settings.toml is picked up):

- hpcml: ``sys.executable -m hpcml scan --json FILE`` (``--hpcml-cmd`` to run another);
  reported as "not available" while ``hpcml scan --help`` fails; clean = exit 0 and every
  "verdict" in its JSON output "safe";
- picklescan: ``picklescan --path FILE``; exit 0 = no dangerous global (suspicious ones do
  not change it), 1 = dangerous globals found, 2 = scan error or exception;
- modelscan: ``modelscan -p FILE``; picks its scanner by file extension (.pkl -> pickle,
  .pt -> pytorch, and for a zip it scans each member by its own extension, so a torch zip's
  ``<name>/data.pkl`` is scanned as a pickle); exit 0 = scanned, no issue, 1 = issues,
  2 = scan errors, 3 = no supported file scanned, 4 = usage error.

Per (tool, file): wall time of the whole command (best and median of ``--runs``, but one
run only once a run took over 60 s, and ``--timeout`` per run, recorded as "timeout"), peak
RSS of the process tree, MB/s = file size / median time (MB = 2**20 bytes throughout),
exit codes and whether the tool reported the file clean. Runs alternate between the tools,
with the file in the page cache. Prints Markdown tables, the speed ratios of hpcml to each
other tool and the goal checks; writes benchmarks/results/scan.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import MB  # noqa: E402
from measure import measure as _measure_cmd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / ".work"
FILES = WORK / "files"
SLOW_S = 60.0          # a (tool, file) whose first run takes longer is run once only

VENVS = {
    "picklescan": (WORK / "venv-picklescan", "picklescan", "1.0.5"),
    "modelscan": (WORK / "venv-modelscan", "modelscan", "0.8.8"),
}
LABELS = {"hpcml": "hpcml scan", "picklescan": "picklescan 1.0.5", "modelscan": "modelscan 0.8.8"}
TOOLS = ("hpcml", "picklescan", "modelscan")

GOAL_TENSOR_MBS = 200.0
GOAL_OBJECT_MBS = 30.0
GOAL_MEM_RATIO = 1.2
GOAL_PEAK_MB = 2048 + 256      # the fast path's default address-space cap + the walker's own


# --------------------------------------------------------------------------- measuring
# Time and peak memory of each run: benchmarks/measure.py (shared with bench_score.py),
# in benchmarks/.work/.


def measure(argv: list[str], timeout: float, mem_limit_mb: int) -> dict:
    return _measure_cmd(argv, timeout, mem_limit_mb, cwd=WORK)


# --------------------------------------------------------------------------- files

def _count_opcodes(stream) -> dict:
    import collections
    import pickletools
    counts: collections.Counter = collections.Counter()
    for op, _arg, _pos in pickletools.genops(stream):
        counts[op.name] += 1
    return {"opcodes": sum(counts.values()), "opcode_counts": dict(counts.most_common())}


def _generate(spec: dict) -> dict:
    """Runs in a child process (so its memory, ~6 GB for the 10x pickle, goes back at exit)."""
    import gc
    import pickle
    import zipfile
    path = Path(spec["path"])
    tmp = path.with_name(path.name + ".tmp")
    kind = spec["kind"]
    gc.disable()  # building millions of containers: the cyclic GC would rescan them all
    start = time.perf_counter()
    if kind == "torch":
        import numpy as np
        import torch
        rng = np.random.default_rng(0)
        n = spec["tensors"]
        per = spec["bytes"] // n // 4
        sd = {f"layers.{i}.weight": torch.from_numpy(rng.standard_normal(per, dtype=np.float32))
              for i in range(n)}
        torch.save(sd, tmp)  # zip format, the default since torch 1.6
        del sd
    elif kind == "numpy":
        import numpy as np
        rng = np.random.default_rng(1)
        n = spec["arrays"]
        per = spec["bytes"] // n // 4
        arrays = {f"layer{i}": rng.standard_normal(per, dtype=np.float32) for i in range(n)}
        with open(tmp, "wb") as f:
            pickle.dump(arrays, f, protocol=4)
        del arrays
    elif kind == "abc-dicts":
        data = [{"a": i, "b": str(i), "c": [i, i + 1]} for i in range(spec["dicts"])]
        with open(tmp, "wb") as f:
            pickle.dump(data, f, protocol=4)
        del data
    elif kind == "tuples":
        data = [(i, float(i), "x" * 8) for i in range(spec["tuples"])]
        with open(tmp, "wb") as f:
            pickle.dump(data, f, protocol=2)
        del data
    else:
        n = spec["dicts"]
        data = [{"id": i, "name": f"item{i}", "ok": i % 2 == 0} for i in range(n)]
        with open(tmp, "wb") as f:
            pickle.dump(data, f, protocol=4)
        del data
    generated_s = time.perf_counter() - start
    start = time.perf_counter()
    if kind == "torch":
        with zipfile.ZipFile(tmp) as z:
            member = next(m for m in z.namelist() if m.endswith("/data.pkl"))
            with z.open(member) as f:
                info = _count_opcodes(f)
            info["pickle_member"] = member.split("/", 1)[1]
            info["zip_members"] = len(z.namelist())
    else:
        with open(tmp, "rb") as f:
            info = _count_opcodes(f)
    info.update(bytes=tmp.stat().st_size, generated_s=generated_s,
                counted_s=time.perf_counter() - start, spec=spec)
    os.replace(tmp, path)
    Path(str(path) + ".json").write_text(json.dumps(info, indent=1))
    return info


def file_specs(args) -> list[dict]:
    n = round(1_000_000 * args.size_mb / 30)
    half = args.tensor_mb // 2
    specs = [
        {"key": "torch-zip", "kind": "torch", "tensors": 128, "bytes": args.tensor_mb * MB,
         "group": "tensor", "path": str(FILES / f"state-dict-{args.tensor_mb}mb.pt"),
         "title": "tensor-heavy: torch.save zip checkpoint, 128 float32 tensors"},
        {"key": "numpy-pickle", "kind": "numpy", "arrays": 64, "bytes": half * MB,
         "group": "tensor", "path": str(FILES / f"numpy-arrays-{half}mb.pkl"),
         "title": "tensor-heavy: pickle (protocol 4) of 64 float32 numpy arrays"},
        {"key": "objects", "kind": "objects", "dicts": n, "group": "object",
         "path": str(FILES / f"objects-{n}.pkl"),
         "title": f"object-heavy: pickle (protocol 4) of {n:,} small dicts"},
    ]
    specs += [
        {"key": "abc-dicts", "kind": "abc-dicts", "dicts": 1_000_000, "group": "object",
         "path": str(FILES / "abc-dicts-1000000.pkl"),
         "title": "object-heavy (issue 20): pickle (protocol 4) of 1,000,000 dicts {'a': i, 'b': str(i), 'c': [i, i+1]}"},
        {"key": "tuples", "kind": "tuples", "tuples": 3_000_000, "group": "object",
         "path": str(FILES / "tuples-3000000.pkl"),
         "title": "object-heavy (issue 20): pickle (protocol 2) of 3,000,000 tuples (i, float(i), 'x'*8)"},
    ]
    if not args.skip_large:
        specs.append({"key": "objects-10x", "kind": "objects", "dicts": 10 * n, "group": "object",
                      "path": str(FILES / f"objects-{10 * n}.pkl"),
                      "title": f"object-heavy 10x: pickle (protocol 4) of {10 * n:,} small dicts"})
    return specs


def ensure_file(spec: dict) -> dict:
    path = Path(spec["path"])
    side = Path(spec["path"] + ".json")
    gen = {k: v for k, v in spec.items() if k not in ("title", "group")}
    if path.exists() and side.exists():
        info = json.loads(side.read_text())
        if info.get("bytes") == path.stat().st_size and info.get("spec") == gen:
            return info
    FILES.mkdir(parents=True, exist_ok=True)
    print(f"generating {path.name} ...", file=sys.stderr, flush=True)
    out = subprocess.run([sys.executable, __file__, "--generate", json.dumps(gen)],
                         check=False, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"generating {path.name} failed: {out.stderr[-2000:]}")
    info = json.loads(side.read_text())
    print(f"  {info['bytes']:,} bytes, {info['opcodes']:,} opcodes "
          f"({info['generated_s']:.0f} s to write, {info['counted_s']:.0f} s to count)",
          file=sys.stderr, flush=True)
    return info


def warm_page_cache(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(16 * MB):
            pass


# --------------------------------------------------------------------------- tools

def _venv_tool(name: str) -> tuple[list[str] | None, str]:
    """The tool's executable, installing it in its own venv on first use."""
    venv, package, version = VENVS[name]
    exe = venv / "bin" / name
    py = venv / "bin" / "python"
    check = [str(py), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"]

    def installed() -> bool:
        return exe.exists() and subprocess.run(check, check=False, capture_output=True, text=True).stdout.strip() == version

    if not installed():
        print(f"installing {package}=={version} into {venv.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
        try:
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{package}=={version}"],
                           check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            return None, f"install failed: {(exc.stderr or '')[-500:]}"
    if not installed():
        return None, "install failed"
    return [str(exe)], ""


def _hpcml(base: list[str]) -> tuple[list[str] | None, str]:
    probe = subprocess.run([*base, "scan", "--help"], cwd=WORK,
                           check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        lines = [ln.strip(" │╭╮╰╯─") for ln in (probe.stderr + probe.stdout).splitlines()]
        why = next((ln for ln in lines if "scan" in ln.lower()), next((ln for ln in lines[::-1] if ln), ""))
        return None, f"`hpcml scan --help` exited {probe.returncode}: {why.strip()}"
    return base, ""


def tool_argv(tool: str, base: list[str], path: str) -> list[str]:
    if tool == "hpcml":
        return [*base, "scan", "--json", path]
    if tool == "picklescan":
        return [*base, "--path", path]
    return [*base, "-p", path]


def _num(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def _verdicts(obj) -> list[str]:
    if isinstance(obj, dict):
        found = [obj["verdict"]] if isinstance(obj.get("verdict"), str) else []
        return found + [v for x in obj.values() if isinstance(x, (dict, list)) for v in _verdicts(x)]
    if isinstance(obj, list):
        return [v for x in obj for v in _verdicts(x)]
    return []


def judge(tool: str, run: dict) -> dict:
    """Did the tool report the file clean? True / False / None (could not tell)."""
    out, rc = run["stdout"], run["rc"]
    if run["status"] != "ok":
        return {"clean": None}
    if tool == "picklescan":
        info = {"scanned_files": _num(r"Scanned files: (\d+)", out),
                "infected_files": _num(r"Infected files: (\d+)", out),
                "dangerous_globals": _num(r"Dangerous globals: (\d+)", out),
                "suspicious_globals": _num(r"Suspicious globals: (\d+)", out)}
        info["clean"] = rc == 0 and bool(info["scanned_files"]) and info["infected_files"] == 0
        return info
    if tool == "modelscan":
        info = {"issues": _num(r"Total Issues: (\d+)", out) or 0,
                "skipped": _num(r"Total skipped: (\d+)", out) or 0,
                "errors": len(re.findall(r"^Error \d+:", out, re.MULTILINE)),
                "scanned": re.findall(r"Scanning (\S+) using (\S+) model scan", out)}
        info["clean"] = rc == 0
        return info
    try:  # the JSON document, even if some text comes before it
        verdicts = _verdicts(json.JSONDecoder().raw_decode(out[out.index("{"):])[0])
    except ValueError:
        return {"clean": None, "note": "stdout has no JSON object"}
    return {"verdicts": sorted(set(verdicts)),
            "clean": (rc == 0 and all(v == "safe" for v in verdicts)) if verdicts else None}


# --------------------------------------------------------------------------- report

def _fmt(x: float | None, nd: int = 2) -> str:
    return "–" if x is None else f"{x:,.{nd}f}"


def summarise(tool: str, runs: list[dict], size: int) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    times = [r["seconds"] for r in ok]
    med = statistics.median(times) if times else None
    judged = [judge(tool, r) for r in runs]
    tail = runs[0]["stdout"][-1500:] if runs else ""
    return {"status": "ok" if len(ok) == len(runs) else runs[-1]["status"] if not ok else "partial",
            "runs": len(runs), "median_s": med, "best_s": min(times) if times else None,
            "times_s": [r["seconds"] for r in runs],
            "mb_per_s": size / MB / med if med else None,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "ru_maxrss_mb": max(r["ru_maxrss_mb"] for r in runs),
            "polled_peak_mb": max(r["polled_peak_mb"] for r in runs),
            "wrapper_rss_mb": max(r["wrapper_rss_mb"] for r in runs),
            "exit_codes": sorted({r["rc"] for r in runs}),
            "statuses": [r["status"] for r in runs],
            "clean": judged[0]["clean"] if len({j["clean"] for j in judged}) == 1 else None,
            "verdict_details": judged[0], "stdout_tail": tail,
            "stderr_tail": runs[0]["stderr"][-1500:] if runs else ""}


def ratio(hp: dict | None, other: dict | None, timeout: float) -> tuple[float | None, str]:
    """hpcml's speed relative to ``other``: other's median time / hpcml's."""
    if not hp or not other or hp.get("median_s") is None:
        return None, "n/a"
    if other.get("median_s") is None:
        if "timeout" in other.get("statuses", []):
            return None, f"> {timeout / hp['median_s']:.1f}x (timeout)"
        return None, "n/a"
    r = other["median_s"] / hp["median_s"]
    return r, f"{r:.1f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tensor-mb", type=int, default=1024, help="torch checkpoint size; numpy pickle is half")
    ap.add_argument("--size-mb", type=float, default=30,
                    help="object-heavy pickle size: 1,000,000 dicts per 30 (about 29 MB)")
    ap.add_argument("--skip-large", action="store_true", help="omit the 10x object-heavy pickle")
    ap.add_argument("--timeout", type=float, default=600, help="per run, seconds")
    ap.add_argument("--mem-limit-mb", type=int, default=16384, help="kill a run whose tree exceeds this RSS")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--hpcml-cmd", default=f"{shlex.quote(sys.executable)} -m hpcml",
                    help="how to run hpcml (default: this interpreter's -m hpcml); runs in benchmarks/.work/, "
                         "so give absolute paths")
    ap.add_argument("--generate", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        _generate(json.loads(args.generate))
        return

    t0 = time.perf_counter()
    WORK.mkdir(parents=True, exist_ok=True)
    tools = [t for t in args.tools.split(",") if t]
    hpcml_cmd = shlex.split(args.hpcml_cmd)
    bases: dict[str, list[str] | None] = {}
    unavailable: dict[str, str] = {}
    for tool in tools:
        base, why = _hpcml(hpcml_cmd) if tool == "hpcml" else _venv_tool(tool)
        bases[tool] = base
        if base is None:
            unavailable[tool] = why
            print(f"{LABELS[tool]}: not available ({why})", file=sys.stderr, flush=True)

    files = []
    for spec in file_specs(args):
        info = ensure_file(spec)
        files.append({**spec, **{k: v for k, v in info.items() if k != "spec"}})

    # hpcml's floor: interpreter + CLI start-up, included in every hpcml scan time.
    floor = [measure([*hpcml_cmd, "version"], 60, 0)["seconds"] for _ in range(3)]

    results: dict[str, dict[str, dict]] = {}
    for f in files:
        warm_page_cache(Path(f["path"]))
        runs: dict[str, list[dict]] = {t: [] for t in tools if bases[t]}
        active = list(runs)
        for i in range(args.runs):
            for tool in list(active):
                r = measure(tool_argv(tool, bases[tool], f["path"]), args.timeout, args.mem_limit_mb)
                runs[tool].append(r)
                print(f"  {Path(f['path']).name:28} {tool:10} run {i + 1}: {r['seconds']:8.2f} s "
                      f"rc={r['rc']} {r['status']} peak {r['peak_rss_mb']:,.0f} MB",
                      file=sys.stderr, flush=True)
                if r["status"] != "ok" or r["seconds"] > SLOW_S:
                    active.remove(tool)
        results[f["key"]] = {t: summarise(t, rs, f["bytes"]) for t, rs in runs.items()}
        for t, why in unavailable.items():
            results[f["key"]][t] = {"status": "not available", "why": why}

    # ---- tables
    lines = [(f"MB = 2^20 bytes; times are the whole command, best and median of up to {args.runs} "
              f"runs (1 when a run takes over {SLOW_S:.0f} s); timeout {args.timeout:.0f} s per run."), ""]
    ratios: dict[str, dict[str, float | None]] = {}
    for f in files:
        res = results[f["key"]]
        lines += [f"### {f['title']}",
                  "",
                  f"`{Path(f['path']).name}`: {f['bytes']:,} bytes ({f['bytes'] / MB:,.1f} MB), "
                  f"{f['opcodes']:,} pickle opcodes"
                  + (f" in `{f['pickle_member']}`" if f.get("pickle_member") else ""),
                  "",
                  "| tool | runs | median s | best s | MB/s | peak RSS MB | exit | clean | hpcml speed-up |",
                  "|---|---|---|---|---|---|---|---|---|"]
        hp = res.get("hpcml")
        hp_ok = hp if hp and hp.get("status") != "not available" else None
        ratios[f["key"]] = {}
        for tool in tools:
            s = res[tool]
            if s.get("status") == "not available":
                lines.append(f"| {LABELS[tool]} | – | not available | | | | | | |")
                continue
            if tool == "hpcml":
                cmp = "–"
            else:
                r, text = ratio(hp_ok, s, args.timeout)
                ratios[f["key"]][tool] = r
                cmp = f"hpcml {text} {tool}" if hp_ok else "n/a"
            clean = {True: "yes", False: "**no**", None: "?"}[s["clean"]]
            status = "" if s["status"] == "ok" else f" ({', '.join(sorted(set(s['statuses']) - {'ok'}))})"
            lines.append(f"| {LABELS[tool]} | {s['runs']} | {_fmt(s['median_s'])}{status} | "
                         f"{_fmt(s['best_s'])} | {_fmt(s['mb_per_s'], 1)} | {s['peak_rss_mb']:,.0f} | "
                         f"{','.join(map(str, s['exit_codes']))} | {clean} | {cmp} |")
        lines.append("")

    # ---- peak memory against file size
    by_key = {f["key"]: f for f in files}
    mem_ratio: dict[str, float | None] = {}
    if "objects-10x" in results:
        lines += ["### peak memory against file size (object-heavy pickles)", "",
                  (f"| tool | {by_key['objects']['bytes'] / MB:,.1f} MB file | "
                   f"{by_key['objects-10x']['bytes'] / MB:,.1f} MB file | ratio |"), "|---|---|---|---|"]
        for tool in tools:
            small, large = results["objects"][tool], results["objects-10x"][tool]
            if "peak_rss_mb" not in small or "peak_rss_mb" not in large:
                mem_ratio[tool] = None
                lines.append(f"| {LABELS[tool]} | not available | | |")
                continue
            mem_ratio[tool] = large["peak_rss_mb"] / small["peak_rss_mb"]
            killed = " (killed at limit)" if "memory limit" in large["statuses"] else ""
            lines.append(f"| {LABELS[tool]} | {small['peak_rss_mb']:,.0f} | {large['peak_rss_mb']:,.0f}{killed} | "
                         f"{mem_ratio[tool]:.2f}x |")
        lines.append("")

    # ---- goals
    def mbs(key: str) -> float | None:
        s = results.get(key, {}).get("hpcml", {})
        return s.get("mb_per_s")

    goals = []
    for key, target in (("torch-zip", GOAL_TENSOR_MBS), ("numpy-pickle", GOAL_TENSOR_MBS),
                        ("objects", GOAL_OBJECT_MBS), ("abc-dicts", GOAL_OBJECT_MBS), ("tuples", GOAL_OBJECT_MBS)):
        v = mbs(key)
        goals.append({"goal": f"hpcml >= {target:.0f} MB/s on {Path(by_key[key]['path']).name}",
                      "value": v, "shown": f"{v:,.1f} MB/s" if v is not None else "–",
                      "met": None if v is None else v >= target})
    peaks = [results[k]["hpcml"].get("peak_rss_mb") for k in ("objects", "abc-dicts", "tuples", "objects-10x")
             if "hpcml" in results.get(k, {})]
    if peaks and None not in peaks:
        goals.append({"goal": f"hpcml peak RSS <= {GOAL_PEAK_MB:,} MB on every object-heavy pickle",
                      "value": max(peaks), "shown": f"{max(peaks):,.0f} MB", "met": max(peaks) <= GOAL_PEAK_MB})
    if "objects-10x" in results:
        v = mem_ratio.get("hpcml")
        goals.append({"goal": f"(walked, past the fast path) peak RSS on the 10x object pickle <= {GOAL_MEM_RATIO}x its peak on the 1x",
                      "value": v, "shown": f"{v:.2f}x" if v is not None else "–",
                      "met": None if v is None else v <= GOAL_MEM_RATIO})
    else:
        goals.append({"goal": "hpcml peak RSS independent of file size", "value": None,
                      "shown": "–", "met": None, "why": "--skip-large"})
    lines += ["### goals", "", "| goal | hpcml | status |", "|---|---|---|"]
    for g in goals:
        status = {True: "met", False: "**not met**", None: "n/a"}[g["met"]]
        if g["met"] is None:
            status += f" ({g.get('why') or unavailable.get('hpcml') and 'hpcml scan not available' or 'no figure'})"
        lines.append(f"| {g['goal']} | {g['shown']} | {status} |")
    lines += ["", (f"hpcml start-up floor (`hpcml version`): median {statistics.median(floor):.2f} s, "
                   "included in each hpcml time above.")]
    print("\n".join(lines))

    versions = {}
    list_packages = ("import importlib.metadata as m, json; "
                     "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    for tool in tools:
        if tool in VENVS and bases.get(tool):
            py = VENVS[tool][0] / "bin" / "python"
            versions[tool] = subprocess.run([str(py), "-c", list_packages], check=False,
                                            capture_output=True, text=True).stdout.strip()
    results_dir = ROOT / "benchmarks" / "results"
    results_dir.mkdir(exist_ok=True)
    payload = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": {"cpus": os.cpu_count(), "python": sys.version},
        "args": {k: v for k, v in vars(args).items() if k not in ("measure", "generate")},
        "mb": MB, "unavailable": unavailable,
        "venv_packages": {k: json.loads(v) if v else None for k, v in versions.items()},
        "files": {f["key"]: {k: v for k, v in f.items() if k not in ("key",)} for f in files},
        "results": results, "speed_ratio_hpcml_over": ratios, "peak_rss_ratio_10x_over_1x": mem_ratio,
        "goals": goals, "hpcml_startup_floor_s": floor,
        "total_benchmark_s": time.perf_counter() - t0,
    }
    (results_dir / "scan.json").write_text(json.dumps(payload, indent=1))
    print(f"\nwrote {(results_dir / 'scan.json').relative_to(ROOT)} "
          f"({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr)


if __name__ == "__main__":
    main()
