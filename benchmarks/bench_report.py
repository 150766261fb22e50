"""``hpcml observe report`` at scale: time and peak memory on synthetic jobs of known shape.

    python benchmarks/bench_report.py [--runs 3] [--shapes issue,metrics,long]

There is no outside tool that reports on a job store, so each run is set beside the
whole-table path that the command used before (``build(read_job(DIR))``: every rank's
rows in one Arrow table, grouped by (kind, name) over its strings). Both are alternated,
run after run, each in a fresh process measured by ``measure.py`` (wall time; peak RSS of
the process tree). The HTML is written in both. The shapes are written once by
``hpcml.testing.synthetic_job.make_job`` under ``benchmarks/.work/report-SHAPE`` (kept):

- ``issue``: 1,024 ranks x 10,000 steps, host and GPU samples every second, one chronic
  straggler (rank 300, x1.3) and a 30 s job-wide stall at step 5,000; no user metric and
  no data section: 16.8M rows. It is what
  ``python -m hpcml.testing.synthetic_job DIR --ranks 1024 --steps 10000 --slow 300 --stall 5000``
  writes (issue 20's input).
- ``metrics``: 512 ranks x 10,000 steps with a ``tokens_per_s`` metric and a ``dataload``
  section on every step (more series per rank), same straggler and stall.
- ``long``: 128 ranks x 60,000 steps: few ranks, long series.

Goal (issue 20): under 5 s and under 1.5 GB for ``issue``, and the same on the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import measure  # noqa: E402

WORK = Path(__file__).resolve().parent / ".work"
SHAPES = {
    "issue": dict(n_ranks=1024, n_steps=10_000, slow_ranks={300: 1.3}, stalls=[(5000, 30.0)],
                  dataload_share=None, throughput_metric=None),
    "metrics": dict(n_ranks=512, n_steps=10_000, slow_ranks={300: 1.3}, stalls=[(5000, 30.0)]),
    "long": dict(n_ranks=128, n_steps=60_000, slow_ranks={100: 1.3}, stalls=[(30_000, 30.0)],
                 dataload_share=None, throughput_metric=None),
}
BASELINE = ("import sys, pyarrow as pa; pa.set_memory_pool(pa.system_memory_pool());"
            "from hpcml.observe.report import build; from hpcml.observe.store import read_job;"
            "from hpcml.observe import html; r = build(read_job(sys.argv[1]));"
            "html.write(r, sys.argv[2]); print(len(r.stragglers), len(r.stalls))")


def job(shape: str) -> Path:
    d = WORK / f"report-{shape}"
    if not (d / "job.json").exists():
        from hpcml.testing.synthetic_job import make_job
        print(f"writing {d} ...", file=sys.stderr, flush=True)
        make_job(d, **SHAPES[shape])
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    results: dict[str, dict] = {}
    for shape in args.shapes.split(","):
        d = job(shape)
        rows = {"hpcml observe report": [sys.executable, "-m", "hpcml", "observe", "report", str(d), "--json",
                                         "--html", str(WORK / "report.html")],
                "whole table (before)": [sys.executable, "-c", BASELINE, str(d), str(WORK / "report-b.html")]}
        runs: dict[str, list[dict]] = {k: [] for k in rows}
        for _ in range(args.runs):
            for name, argv in rows.items():
                r = measure(argv, timeout=600)
                if r["rc"] != 0:
                    sys.exit(f"{name} failed on {shape}: {r['stderr'][-2000:]}")
                runs[name].append(r)
                print(f"  {shape:8} {name:22} {r['seconds']:6.2f} s  {r['peak_rss_mb']:7.0f} MB",
                      file=sys.stderr, flush=True)
        rep = json.loads(runs["hpcml observe report"][-1]["stdout"])
        results[shape] = {
            "rows": rep["rows"], "ranks": rep["ranks_with_data"],
            "stragglers": [s["rank"] for s in rep["stragglers"]], "stalls": len(rep["stalls"]),
            **{name: {"median_s": statistics.median(r["seconds"] for r in rs),
                      "min_s": min(r["seconds"] for r in rs), "max_s": max(r["seconds"] for r in rs),
                      "peak_mb": max(r["peak_rss_mb"] for r in rs)} for name, rs in runs.items()}}
    print("| shape | rows | tool | median s | min | max | peak MB |")
    print("|---|---|---|---|---|---|---|")
    for shape, r in results.items():
        for name in ("hpcml observe report", "whole table (before)"):
            m = r[name]
            print(f"| {shape} | {r['rows']:,} | {name} | {m['median_s']:.2f} | {m['min_s']:.2f} | "
                  f"{m['max_s']:.2f} | {m['peak_mb']:,.0f} |")
    out = Path(__file__).resolve().parent / "results" / "bench_report.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
