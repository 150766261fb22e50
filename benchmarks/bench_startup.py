"""The start-up floor: scanning one tiny file, hpcml against picklescan, alternated.

    python benchmarks/bench_startup.py [--runs 21]

A CI loop over thousands of small files, or a scan before every load, pays the start-up
each time. The input is one pickle of ``{'a': 1}`` (protocol 4, 20 bytes). Each run is the
whole command as a script sees it (interpreter, imports, scan, output), bytecode caches
warm (one warm-up each), the two tools alternated run after run. Also `hpcml version`
(the full Typer CLI) for reference. picklescan 1.0.5 is installed in its own venv under
benchmarks/.work/ (bench_scan.py's helper). Writes benchmarks/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scan import WORK, _venv_tool  # noqa: E402
from measure import compile_sources  # noqa: E402 - beside this file

ROOT = Path(__file__).resolve().parents[1]


def _timed(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    args = ap.parse_args()
    print(compile_sources())
    WORK.mkdir(parents=True, exist_ok=True)
    tiny = WORK / "tiny.pkl"
    tiny.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    picklescan, why = _venv_tool("picklescan")
    hpcml = [str(Path(sys.executable).parent / "hpcml")]
    cmds = {"hpcml scan": [*hpcml, "scan", str(tiny)], "hpcml version": [*hpcml, "version"]}
    if picklescan:
        cmds["picklescan 1.0.5"] = [*picklescan, "--path", str(tiny)]
    else:
        print(f"picklescan not measured: {why}", file=sys.stderr)
    for argv in cmds.values():
        _timed(argv)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(args.runs):
        for name, argv in cmds.items():
            times[name].append(_timed(argv))
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}
    for name, s in summary.items():
        print(f"{name:18} median {s['median']:.3f} s  min {s['min']:.3f}  max {s['max']:.3f}")
    if "picklescan 1.0.5" in summary:
        print(f"hpcml scan / picklescan median: {summary['hpcml scan']['median'] / summary['picklescan 1.0.5']['median']:.2f}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "startup.json").write_text(json.dumps({"summary": summary, "raw": times}, indent=1))


if __name__ == "__main__":
    main()
