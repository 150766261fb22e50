"""hpcml.ckpt against torch DCP ``async_save`` (thread mode) on the same CPU state, same run.

    python benchmarks/bench_ckpt.py [--gb 2] [--repeats 5] [--rate "500 MB/s"] [--dir benchmarks/.work/ckpt]

The state is ``--gb`` of float32 tensors (64 MiB each) plus an AdamW-like dict of step
counters. A CPU proxy training loop (a 384x384 float32 matmul chain on one thread,
~25 ms a step) runs in the main thread throughout. Per repeat, alternating the tools:

- baseline: the loop alone for 3 s;
- hpcml: ``Checkpointer.save`` (blocking time = the snapshot), then the loop runs until the
  background write is durable on disk (``wait`` returns), capped at ``--rate``;
- DCP: ``torch.distributed.checkpoint.async_save`` (blocking time = until it returns),
  then the loop runs until its future completes.

Reports blocking time, time to durable, the loop's step rate during the write as a share
of the baseline's (median over repeats), p50/p99 step time during and outside saves, and
hpcml's time to durable against size / cap. Writes benchmarks/results/ckpt.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def loop_until(done, a, b) -> list[float]:
    """Run proxy steps until ``done()``; their durations."""
    times = []
    while True:
        t = time.perf_counter()
        c = a @ b
        c = c @ b
        c = c @ b
        times.append(time.perf_counter() - t)
        if done():
            return times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rate", default="500 MB/s")
    ap.add_argument("--dir", default=str(HERE / ".work" / "ckpt"))
    args = ap.parse_args()
    import torch
    import torch.distributed.checkpoint as dcp

    from hpcml.ckpt import Checkpointer
    from hpcml.units import parse_rate
    torch.set_num_threads(1)
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n = max(1, int(args.gb * (1 << 30) / (64 << 20)))
    state = {f"layer{i}.weight": torch.randn(16 << 20) for i in range(n)}
    state["step"] = torch.tensor(0)
    size = sum(t.numel() * t.element_size() for t in state.values())
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    rate = parse_rate(args.rate)
    ck = Checkpointer(work / "hpcml", keep=1, max_write_rate=args.rate)
    rows: list[dict] = []
    for rep in range(args.repeats):
        t_end = time.perf_counter() + 3
        base = loop_until(lambda t_end=t_end: time.perf_counter() > t_end, a, b)
        row = {"repeat": rep, "baseline_steps_per_s": len(base) / sum(base), "baseline_p50": pct(base, .5),
               "baseline_p99": pct(base, .99)}
        for tool in ("hpcml", "dcp"):
            t0 = time.perf_counter()
            if tool == "hpcml":
                ck.save(state, rep)
                blocking = time.perf_counter() - t0
                steps = loop_until(lambda: ck._thread is None or not ck._thread.is_alive(), a, b)
                ck.wait()
            else:
                target = work / f"dcp-{rep}"
                fut = dcp.async_save(state, checkpoint_id=str(target))
                blocking = time.perf_counter() - t0
                steps = loop_until(fut.done, a, b)
                fut.result()
                shutil.rmtree(work / f"dcp-{rep - 1}", ignore_errors=True)
            durable = time.perf_counter() - t0
            row[tool] = {"blocking_s": blocking, "durable_s": durable,
                         "share_of_baseline": (len(steps) / sum(steps)) / row["baseline_steps_per_s"],
                         "p50": pct(steps, .5), "p99": pct(steps, .99)}
            print(f"repeat {rep} {tool:5s}: blocking {blocking:.2f} s, durable {durable:.2f} s, loop at "
                  f"{row[tool]['share_of_baseline']:.0%} of baseline", flush=True)
        rows.append(row)

    def med(tool: str, key: str) -> float:
        return statistics.median(r[tool][key] for r in rows)
    base50 = statistics.median(r["baseline_p50"] for r in rows)
    base99 = statistics.median(r["baseline_p99"] for r in rows)
    lines = [f"state {size / 1e9:.2f} GB ({n} x 64 MiB float32), cap {args.rate}, {args.repeats} repeats, medians", "",
             "| | blocking s | durable s | loop rate during write | step p50 / p99 ms during | outside |",
             "|---|---|---|---|---|---|"]
    for tool, label in (("hpcml", f"hpcml.ckpt ({args.rate})"), ("dcp", "DCP async_save (thread)")):
        lines.append(f"| {label} | {med(tool, 'blocking_s'):.2f} | {med(tool, 'durable_s'):.2f} | "
                     f"{med(tool, 'share_of_baseline'):.0%} | {med(tool, 'p50') * 1e3:.1f} / {med(tool, 'p99') * 1e3:.1f} | "
                     f"{base50 * 1e3:.1f} / {base99 * 1e3:.1f} |")
    ideal = size / rate
    lines += ["", f"hpcml time to durable / (size / cap) = {med('hpcml', 'durable_s'):.2f} / {ideal:.2f} = "
                  f"{med('hpcml', 'durable_s') / ideal:.2f} (goal <= 1.10)",
              f"blocking hpcml / DCP = {med('hpcml', 'blocking_s') / med('dcp', 'blocking_s'):.2f} (goal <= 1)",
              f"loop rate during the write: hpcml {med('hpcml', 'share_of_baseline'):.0%} (goal >= 95 %), "
              f"DCP {med('dcp', 'share_of_baseline'):.0%}"]
    print("\n".join(lines))
    out = HERE / "results" / "ckpt.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"size": size, "rate": args.rate, "rows": rows, "torch": torch.__version__,
                               "python": sys.version.split()[0]}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
