"""The vetting results collector (`hpcml centre serve`) under load, on SQLite and PostgreSQL.

    python benchmarks/bench_collector.py [--reports 6000] [--seconds 30] [--fill 1000000]

For each backend: starts `hpcml centre serve` as its own process on loopback (port 0); a load
generator (2 processes x 4 threads, one keep-alive connection each) posts node reports of
10 checks, bounded by count and time -> reports/s. Then fills the store to --fill results
directly through the store (bulk, for speed), and times GET /v1/nodes/{node}/history
(100 queries over random nodes, median and p99) and GET /v1/nodes/failing, and measures the
posting rate again on the full store. PostgreSQL is a private cluster from Debian's
packages (tests/centre/pgcluster.py), default settings (fsync on).
Goals: >= 1,000 reports/s; history < 50 ms at 1,000,000 results. Prints a table and
writes benchmarks/results/collector.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKEN = "bench-token-" + os.urandom(8).hex()
NODES = 1000
CHECKS = ["gpu-count", "xid", "ecc", "pcie", "nvlink", "nic", "memory", "disk", "gemm", "nccl"]
SERVE = "import sys; from hpcml.centre.cli import app; app(['serve', *sys.argv[1:]])"


def node_report(rng: random.Random, t: float, job: str) -> dict:
    node = f"nid{rng.randrange(NODES):06d}"
    outcomes = ["fail" if rng.random() < 0.02 else "pass" for _ in CHECKS]
    return {"job_id": job, "node": node, "time": t, "protocol": "gpu-node-vetting",
            "verdict": "bad" if "fail" in outcomes else "good",
            "results": [{"name": c, "type": c, "outcome": o, "value": rng.uniform(1, 500),
                         "unit": "GB/s", "message": "" if o == "pass" else f"{c} below threshold",
                         "duration": rng.uniform(0.001, 2)}
                        for c, o in zip(CHECKS, outcomes)]}


def _poster(args) -> tuple[int, int, list[float]]:
    """One load process: THREADS keep-alive connections posting until count or time is up."""
    port, count, seconds, seed, threads, token = args
    rng = random.Random(seed)
    bodies = [json.dumps(node_report(rng, time.time(), f"j{seed}-{i}")).encode()
              for i in range(200)]
    lock = threading.Lock()
    state = {"left": count, "ok": 0, "bad": 0, "lat": []}
    stop_at = time.monotonic() + seconds

    def worker(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        i = k
        while time.monotonic() < stop_at:
            with lock:
                if state["left"] <= 0:
                    break
                state["left"] -= 1
            t0 = time.perf_counter()
            conn.request("POST", "/v1/reports", body=bodies[i % len(bodies)], headers=headers)
            resp = conn.getresponse()
            resp.read()
            dt = time.perf_counter() - t0
            with lock:
                state["ok" if resp.status == 201 else "bad"] += 1
                state["lat"].append(dt)
            i += threads
        conn.close()

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return state["ok"], state["bad"], state["lat"]


def load(port: int, reports: int, seconds: float, procs: int = 2, threads: int = 4) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        pool.map(abs, range(procs))  # processes started before the clock
        t0 = time.perf_counter()
        out = pool.map(_poster, [(port, reports // procs, seconds, s, threads, TOKEN)
                                  for s in range(procs)])
        wall = time.perf_counter() - t0
    ok = sum(o[0] for o in out)
    if not ok:
        raise RuntimeError(f"the collector refused every report ({sum(o[1] for o in out)})")
    lat = sorted(x for o in out for x in o[2])
    return {"reports": ok, "refused": sum(o[1] for o in out), "seconds": round(wall, 3),
            "reports_per_s": round(ok / wall, 1),
            "latency_ms_median": round(1000 * statistics.median(lat), 2),
            "latency_ms_p99": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2),
            "clients": procs * threads}


def fill(url: str, target: int) -> dict:
    from hpcml.centre.collector.schema import NodeReport
    from hpcml.centre.collector.store import open_store
    store = open_store(url)
    have = store.count()["results"]
    rng = random.Random(1)
    t0 = time.perf_counter()
    now = time.time()
    n = 0
    while have + n < target:
        batch = [NodeReport.model_validate(node_report(rng, now - rng.uniform(0, 90 * 86400),
                                                       f"fill{(n // 10) // 64}"))
                 for _ in range(min(5000, (target - have - n) // len(CHECKS) or 1))]
        store.add(batch)
        n += len(batch) * len(CHECKS)
    counts = store.count()
    store.close()
    return {"results": counts["results"], "reports": counts["reports"],
            "seconds": round(time.perf_counter() - t0, 1)}


def queries(port: int, n: int = 100) -> dict:
    rng = random.Random(2)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def timed(path: str) -> tuple[float, dict]:
        t0 = time.perf_counter()
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 200, body
        return time.perf_counter() - t0, body

    timed("/v1/nodes/nid000000/history")  # warm-up
    hist, sizes = [], []
    for _ in range(n):
        dt, body = timed(f"/v1/nodes/nid{rng.randrange(NODES):06d}/history?limit=20")
        hist.append(dt)
        sizes.append(sum(len(r["results"]) for r in body["reports"]))
    failing = [timed("/v1/nodes/failing?since=24h&limit=20")[0] for _ in range(10)]
    conn.close()
    hist.sort()
    return {"history_ms_median": round(1000 * statistics.median(hist), 2),
            "history_ms_p99": round(1000 * hist[int(0.99 * (len(hist) - 1))], 2),
            "history_results_per_answer": statistics.median(sizes),
            "failing_24h_ms_median": round(1000 * statistics.median(failing), 2)}


def serve(url: str, cwd: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "--db", url, "--port", "0", *extra],
                            cwd=cwd, env={**os.environ, "HPCML_VET_TOKEN": TOKEN},
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on"):
        proc.kill()
        raise RuntimeError(f"collector did not start: {line!r}")
    return proc, int(line.strip().rsplit(":", 1)[1])


def bench(name: str, url: str, work: Path, args) -> dict:
    proc, port = serve(url, work, "--threads", str(args.threads))
    try:
        print(f"[{name}] posting {args.reports} reports...", flush=True)
        empty = load(port, args.reports, args.seconds)
        print(f"[{name}] filling to {args.fill:,} results...", flush=True)
        filled = fill(url, args.fill)
        print(f"[{name}] querying...", flush=True)
        q = queries(port)
        full = load(port, args.reports, args.seconds)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"post_empty_store": empty, "fill": filled, "queries": q, "post_full_store": full}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", type=int, default=6000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--fill", type=int, default=1_000_000)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--threads", type=int, default=16, help="hpcml centre serve --threads")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcml-bench-collector-"))
    out: dict = {"goals": {"reports_per_s": 1000, "history_ms_at_1M": 50},
                 "machine": {"cpus": os.cpu_count()}, "backends": {}}
    for name in args.backends.split(","):
        if name == "sqlite":
            out["backends"][name] = bench(name, f"sqlite:///{work}/bench.db", work, args)
        else:
            from tests.centre.pgcluster import PgCluster
            pg = PgCluster().start()
            try:
                out["backends"][name] = bench(name, pg.create_db("bench"), work, args)
            finally:
                pg.stop()
    print(f"\n{'backend':10} {'reports/s empty':>16} {'reports/s @1M':>14} {'p99 post ms':>12} "
          f"{'history med ms':>15} {'history p99 ms':>15} {'failing ms':>11} {'fill s':>7}")
    for name, r in out["backends"].items():
        print(f"{name:10} {r['post_empty_store']['reports_per_s']:>16} "
              f"{r['post_full_store']['reports_per_s']:>14} {r['post_full_store']['latency_ms_p99']:>12} "
              f"{r['queries']['history_ms_median']:>15} {r['queries']['history_ms_p99']:>15} "
              f"{r['queries']['failing_24h_ms_median']:>11} {r['fill']['seconds']:>7}")
    dest = ROOT / "benchmarks" / "results" / "collector.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
