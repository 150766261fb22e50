"""hpcml score against gssr 0.4.0 on the same 1,024-GPU x 1-hour recording, side by side.

    python benchmarks/bench_score.py [--gpus 1024] [--seconds 3600] [--runs 3]
                                     [--gssr-pdf] [--record-seconds 30] [--skip-gssr]

1. Analysis. benchmarks/gssr_fixture.py writes a format-exact gssr 0.4.0 profile
   directory (one JSON per task, one GPU per task, 1 s interval; cached under
   benchmarks/.work/score/). Each command runs in a fresh wrapper process
   (benchmarks/measure.py: wall time, and peak RSS as the larger of the kernel's
   ru_maxrss and psutil polling of the process tree):
   - gssr 0.4.0 ``gssr analyze -i DIR`` (its summary; installed from PyPI into
     benchmarks/.work/venv-gssr), and with ``--gssr-pdf`` also ``--report`` (its PDF);
   - ``hpcml score report DIR --json --no-html`` (import + score + JSON) and
     ``hpcml score report DIR --html F`` (plus the HTML report);
   - ``hpcml score report STORE --json --no-html`` on the same recording kept as an hpcml
     job directory (``hpcml score import``: 59 M rows in 256 rank files, as 256 nodes of
     4 GPUs would record it), the path of recordings made with ``hpcml score record``.
   Median of ``--runs`` runs each; ratios are gssr / hpcml, the HTML against gssr's PDF.
2. Recording overhead. No GPU here: the recorder runs with the DCGM fake that the tests
   use (tests/score/fake_dcgm, replaying recorded values for 8 GPUs) at 1 s, and its own
   CPU (utime + stime from /proc, children excluded) is compared with the same recorder
   without GPU sampling; the difference per GPU is the sampler's cost. On a GPU node the
   DCGM host engine does the sampling in its own process, so this is the client's share.

Prints Markdown tables and goal checks; writes benchmarks/results/score.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from measure import measure  # noqa: E402

ROOT = HERE.parent
WORK = HERE / ".work"
SCRATCH = WORK / "score"
GSSR_VENV = WORK / "venv-gssr"
GSSR_VERSION = "0.4.0"
GOAL_S, GOAL_MB, GOAL_HTML_S, GOAL_REC_PCT = 10.0, 1024.0, 30.0, 1.0


def _gssr() -> tuple[str | None, str]:
    exe = GSSR_VENV / "bin" / "gssr"
    py = GSSR_VENV / "bin" / "python"
    check = [str(py), "-c", f"import importlib.metadata as m; assert m.version('gssr') == '{GSSR_VERSION}'"]
    if not (exe.exists() and subprocess.run(check, capture_output=True).returncode == 0):
        print(f"installing gssr=={GSSR_VERSION} into {GSSR_VENV.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(GSSR_VENV)], check=True)
            subprocess.run([str(GSSR_VENV / "bin" / "pip"), "install", "-q", f"gssr=={GSSR_VERSION}"],
                           check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            return None, f"install failed: {(exc.stderr or '')[-400:]}"
    return str(exe), ""


def _fixture(gpus: int, seconds: int) -> Path:
    from gssr_fixture import write_gssr_json
    d = SCRATCH / f"gssr-{gpus}x{seconds}"
    done = d / ".complete"
    if not done.exists():
        print(f"writing the gssr recording {d.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        write_gssr_json(d, gpus=gpus, seconds=seconds, interval_ms=1000, seed=0)
        done.write_text(f"{time.perf_counter() - t0:.1f} s\n")
    return d


def _runs(argv: list[str], runs: int, timeout: float) -> dict:
    rs = [measure(argv, timeout, cwd=SCRATCH) for _ in range(runs)]
    ok = [r for r in rs if r["status"] == "ok" and r["rc"] == 0]
    out = {"argv": argv, "runs": len(rs), "ok": len(ok), "statuses": [r["status"] for r in rs],
           "rcs": [r["rc"] for r in rs], "stderr_tail": rs[-1]["stderr"][-1500:]}
    if ok:
        out.update(seconds=statistics.median(r["seconds"] for r in ok),
                   seconds_all=[round(r["seconds"], 2) for r in ok],
                   peak_rss_mb=max(r["peak_rss_mb"] for r in ok))
    return out


def analysis(args) -> dict:
    d = _fixture(args.gpus, args.seconds)
    size = sum(f.stat().st_size for f in d.rglob("*.json"))
    res: dict = {"recording": {"dir": str(d.relative_to(ROOT)), "gpus": args.gpus, "seconds": args.seconds,
                               "json_bytes": size}}
    hpcml = [sys.executable, "-m", "hpcml", "score", "report", str(d)]
    res["hpcml"] = _runs([*hpcml, "--json", "--no-html"], args.runs, 600)
    html = SCRATCH / "score.html"
    res["hpcml-html"] = _runs([*hpcml, "--html", str(html)], args.runs, 600)
    if html.exists():
        res["hpcml-html"]["html_bytes"] = html.stat().st_size
    store = SCRATCH / f"store-{args.gpus}x{args.seconds}"
    if not (store / "job.json").exists():                 # the same recording as an hpcml job directory
        import shutil
        shutil.rmtree(store, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "hpcml", "score", "import", str(d), "--dir", str(store)],
                       check=True, capture_output=True)
    res["hpcml-store"] = _runs([*hpcml[:-1], str(store), "--json", "--no-html"], args.runs, 600)
    if not args.skip_gssr:
        exe, why = _gssr()
        if exe is None:
            res["gssr"] = {"status": why}
        else:
            res["gssr"] = _runs([exe, "analyze", "-i", str(d)], 1 if args.runs < 3 else 2, 1800)
            if args.gssr_pdf:
                res["gssr-pdf"] = _runs([exe, "analyze", "-i", str(d), "--report"], 1, 3600)
    return res


FAKE_CHILD = "import time; time.sleep({seconds})"


def _fake_engine(gpus: int, ticks: int) -> Path:
    """A replay file for the DCGM fake: every field the sampler watches, per GPU and tick,
    each field stamped a few ms apart as DCGM does."""
    from hpcml.samplers.fields import FIELDS
    t0 = int(time.time() * 1e6)
    spec = {"reachable": True,
            "gpus": [{"gpuId": g, "nvmlIndex": g, "uuid": f"GPU-{g:08d}-0000-4000-8000-000000000000",
                      "name": "NVIDIA H100 80GB HBM3", "busId": f"00000000:{g + 16:02x}:00.0"} for g in range(gpus)],
            "history": [],
            "ticks": [[{"gpuId": g, "ts": t0 + k * 1_000_000 + j * 2000, "values": {str(f.id): 0.5}}
                       for g in range(gpus) for j, f in enumerate(FIELDS)] for k in range(ticks)]}
    path = SCRATCH / f"fake-dcgm-{gpus}.json"
    path.write_text(json.dumps(spec))
    return path


def recording(args) -> dict:
    from bench_observe import run_recorder
    gpus = 8
    env = {"DCGM_HOME": str(ROOT / "tests" / "score" / "fake_dcgm"),
           "HPCML_FAKE_DCGM": str(_fake_engine(gpus, int(args.record_seconds) + 30)),
           "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))), "SLURM_JOB_ID": "bench"}
    child = FAKE_CHILD.format(seconds=args.record_seconds)
    base = run_recorder("score-none", 1.0, child, args.record_seconds, command=("observe", "record", "--no-gpu"),
                        env=env, scratch=SCRATCH)
    with_gpus = run_recorder("score-dcgm-fake", 1.0, child, args.record_seconds,
                             command=("score", "record", "--gpu-metrics", "dcgm"), env=env, scratch=SCRATCH)
    per_gpu = None
    if base["cpu_pct_steady"] is not None and with_gpus["cpu_pct_steady"] is not None:
        per_gpu = (with_gpus["cpu_pct_steady"] - base["cpu_pct_steady"]) / gpus
    return {"gpus": gpus, "without_gpu": base, "dcgm_fake": with_gpus, "cpu_pct_per_gpu": per_gpu,
            "whole_recorder_pct_per_gpu": None if with_gpus["cpu_pct_steady"] is None
            else with_gpus["cpu_pct_steady"] / gpus}


def _s(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def report(res: dict) -> str:
    a = res.get("analysis", {})
    rec = a.get("recording", {})
    lines = [f"### Analysis of {rec.get('gpus')} GPUs x {rec.get('seconds')} s at 1 s "
             f"({rec.get('json_bytes', 0) / 1e9:.2f} GB of gssr JSON)", "",
             "| command | median s | peak RSS MB | gssr ÷ hpcml (time) | gssr ÷ hpcml (memory) |", "|---|---|---|---|---|"]
    base = a.get("gssr", {})
    for key, label in (("gssr", f"gssr {GSSR_VERSION} analyze (summary)"), ("gssr-pdf", f"gssr {GSSR_VERSION} analyze --report (PDF)"),
                       ("hpcml", "hpcml score report --json"), ("hpcml-html", "hpcml score report + HTML"),
                       ("hpcml-store", "hpcml score report --json, hpcml job directory")):
        r = a.get(key)
        if not r:
            continue
        if "seconds" not in r:
            lines.append(f"| {label} | {r.get('status') or r.get('statuses')} | | | |")
            continue
        tr = mr = ""
        ref = a.get("gssr-pdf", {}) if key == "hpcml-html" else base     # a report against a report
        if key.startswith("hpcml") and "seconds" in ref:
            tr = f"{ref['seconds'] / r['seconds']:.1f}x"
            mr = f"{ref['peak_rss_mb'] / r['peak_rss_mb']:.1f}x"
        lines.append(f"| {label} | {r['seconds']:.2f} | {r['peak_rss_mb']:,.0f} | {tr} | {mr} |")
    lines.append("")
    r = res.get("recording")
    if r:
        lines += ["### Recording overhead at 1 s (8 GPUs through the DCGM fake)", "",
                  "| recorder | CPU % of one core (steady) |", "|---|---|",
                  f"| without GPU sampling | {_s(r['without_gpu']['cpu_pct_steady'])} |",
                  f"| DCGM sampler, 8 GPUs | {_s(r['dcgm_fake']['cpu_pct_steady'])} |",
                  f"| difference per GPU | {_s(r['cpu_pct_per_gpu'])} |", ""]
    goals = []
    h, hh = a.get("hpcml", {}), a.get("hpcml-html", {})
    if "seconds" in h:
        goals.append(f"- analysis under {GOAL_S:.0f} s: {h['seconds']:.2f} s — {'met' if h['seconds'] < GOAL_S else 'NOT met'}")
        goals.append(f"- under {GOAL_MB:.0f} MB: {h['peak_rss_mb']:,.0f} MB — {'met' if h['peak_rss_mb'] < GOAL_MB else 'NOT met'}")
    if "seconds" in hh:
        goals.append(f"- with HTML under {GOAL_HTML_S:.0f} s: {hh['seconds']:.2f} s — "
                     f"{'met' if hh['seconds'] < GOAL_HTML_S else 'NOT met'} ({hh.get('html_bytes', 0) / 1e6:.1f} MB file, "
                     f"peak {hh['peak_rss_mb']:,.0f} MB)")
    if r and r["cpu_pct_per_gpu"] is not None:
        goals.append(f"- recording under {GOAL_REC_PCT:.0f} % of one core per GPU: {r['cpu_pct_per_gpu']:.3f} % — "
                     f"{'met' if r['cpu_pct_per_gpu'] < GOAL_REC_PCT else 'NOT met'}")
    return "\n".join(lines + ["Goals:", *goals, ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gssr-pdf", action="store_true", help="Also time gssr's PDF report (minutes).")
    ap.add_argument("--skip-gssr", action="store_true")
    ap.add_argument("--record-seconds", type=float, default=30.0)
    ap.add_argument("--skip-recording", action="store_true")
    args = ap.parse_args()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    res = {"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args), "analysis": analysis(args)}
    if not args.skip_recording:
        res["recording"] = recording(args)
    text = report(res)
    print(text)
    out = HERE / "results" / "score.json"
    out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
