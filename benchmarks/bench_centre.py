"""The centre's view at scale: job summaries into the collector, and the centre report.

    python benchmarks/bench_centre.py [--summaries 6000] [--jobs 100000] [--nodes 10000]

For each backend (SQLite, and PostgreSQL from Debian's packages with default settings, fsync
on), `hpcml centre serve` runs as its own process on loopback; a load generator (2 processes x
4 threads, one keep-alive connection each) POSTs one job summary per request, as
`hpcml run --collector` does at the end of each job -> summaries/s (goal >= 1,000 on
PostgreSQL). Then the store is filled to --jobs summaries over --nodes nodes (one job in
ten names a straggler, one in fifty a hang culprit, one in twenty an excluded node; every
node vetted every few days) and `hpcml centre report --since 30d --json` is timed as a
command (start-up included; goal < 10 s).

Side by side: the same node ranking (distinct jobs per node and role in the window) by
DuckDB over the summaries as JSON lines, which is what a centre without a collector would
run over the spooled summary files. Writes benchmarks/results/centre.json.
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
from benchmarks.bench_collector import serve  # noqa: E402
from tests.centre.jobdocs import event, proven, summary  # noqa: E402

TRUSTED = "bench-trusted-" + os.urandom(8).hex()   # summaries taken as sent, as a centre's import would

DAY = 86400.0


def make(rng: random.Random, i: int, nodes: int, now: float, prefix: str = "") -> dict:
    """A job of 1 to 64 nodes ended in the last 30 days, with its named nodes."""
    n = rng.choice((1, 2, 4, 8, 16, 64))
    first = rng.randrange(nodes)
    names = [f"nid{(first + k) % nodes:06d}" for k in range(n)]
    pick = rng.random()
    hours = rng.uniform(0.1, 24)
    return summary(f"{prefix}{i}", ended=now - rng.uniform(0, 30 * DAY), nodes=names, hours=hours,
                   user=f"u{rng.randrange(500)}", account=f"a{rng.randrange(60)}", score=round(rng.random(), 3),
                   stragglers=[event(rng.choice(names), 0)] if pick < 0.1 else [],
                   culprits=[event(rng.choice(names), 1)] if 0.1 <= pick < 0.12 else [],
                   excluded=[event(rng.choice(names), detail="gemm")] if 0.12 <= pick < 0.17 else [],
                   outcome="hung" if 0.1 <= pick < 0.12 else "completed",
                   time_lost_s=rng.uniform(60, min(3600, hours * 3600)) if pick < 0.12 else None)   # no more than it ran


def _poster(args) -> tuple[int, int, list[float], float, float]:
    port, count, seconds, seed, threads, token = args
    rng = random.Random(seed)
    now = time.time()
    bodies = [json.dumps(make(rng, i, 10_000, now, f"p{seed}-")).encode() for i in range(count)]
    lock = threading.Lock()
    state: dict = {"next": 0, "ok": 0, "bad": 0, "lat": []}
    stop_at = time.monotonic() + seconds

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while time.monotonic() < stop_at:
            with lock:
                i = state["next"]
                if i >= len(bodies):
                    break
                state["next"] += 1
            t0 = time.perf_counter()
            conn.request("POST", "/v1/jobs", body=bodies[i], headers=headers)
            resp = conn.getresponse()
            resp.read()
            with lock:
                state["ok" if resp.status == 201 else "bad"] += 1
                state["lat"].append(time.perf_counter() - t0)
        conn.close()

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    began = time.time()                      # after the bodies are built: only posting is timed
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return state["ok"], state["bad"], state["lat"], began, time.time()


def ingest(port: int, n: int, seconds: float, procs: int = 2, threads: int = 4) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        pool.map(abs, range(procs))
        t0 = time.perf_counter()
        out = pool.map(_poster, [(port, n // procs, seconds, s + int(time.time()), threads, TRUSTED)
                                  for s in range(procs)])
        wall = time.perf_counter() - t0
    ok, bad = sum(o[0] for o in out), sum(o[1] for o in out)
    if bad:
        raise RuntimeError(f"the collector refused {bad} of {ok + bad} summaries")
    lat = sorted(x for o in out for x in o[2])
    busy = max(o[4] for o in out) - min(o[3] for o in out)     # first post to last answer
    return {"summaries": ok, "refused": bad, "wall_s": round(wall, 2), "posting_s": round(busy, 2),
            "summaries_per_s": round(ok / busy, 1) if busy else None,
            "latency_ms_median": round(1000 * statistics.median(lat), 2),
            "latency_ms_p99": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2)}


def fill(url: str, jobs: int, nodes: int, jsonl: Path) -> dict:
    from hpcml.centre.collector.schema import NodeReport
    from hpcml.centre.collector.store import open_store
    store = open_store(url)
    rng = random.Random(7)
    now = time.time()
    t0 = time.perf_counter()
    with jsonl.open("w") as out:
        for start in range(0, jobs, 5000):
            docs = [make(rng, i, nodes, now, "f") for i in range(start, min(jobs, start + 5000))]
            store.add_jobs([proven(d) for d in docs])        # as if MUNGE and Slurm proved each
            out.writelines(json.dumps(d) + "\n" for d in docs)
    checks = ["gpu-count", "ecc", "gemm", "nccl", "disk"]
    for start in range(0, nodes * 3, 5000):                 # every node vetted 3 times in the window
        store.add([NodeReport.model_validate({
            "job_id": f"v{k}", "node": f"nid{k % nodes:06d}", "time": now - rng.uniform(0, 30 * DAY),
            "protocol": "gpu", "verdict": "good",
            "results": [{"name": c, "type": c, "outcome": "fail" if rng.random() < 0.01 else "pass"} for c in checks]})
            for k in range(start, min(nodes * 3, start + 5000))])
    counts = store.count()
    store.close()
    return {**counts, "seconds": round(time.perf_counter() - t0, 1)}


def report(url: str) -> dict:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "report", "--db", url, "--since", "30d",
                            "--json"], capture_output=True, text=True, timeout=600)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise RuntimeError(p.stderr)
    rep = json.loads(p.stdout)
    return {"seconds_median": round(statistics.median(times), 2), "jobs": rep["totals"]["jobs"],
            "top_node": rep["nodes"][0]["node"], "top_node_jobs": rep["nodes"][0]["jobs"]}


DUCK = """
WITH j AS (SELECT * FROM read_json('{path}', format='newline_delimited', maximum_object_size=16777216)
           WHERE ended >= epoch(now()) - 30 * 86400),
e AS (SELECT job_id, unnest(stragglers).node AS node, 'straggler' AS role FROM j
      UNION ALL SELECT job_id, unnest(culprits).node, 'culprit' FROM j
      UNION ALL SELECT job_id, unnest(excluded).node, 'excluded' FROM j)  -- the data names no lost node
SELECT node, COUNT(DISTINCT job_id) AS jobs FROM e GROUP BY node ORDER BY jobs DESC, node LIMIT 20
"""


def duckdb_ranking(jsonl: Path) -> dict:
    import duckdb
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        rows = duckdb.connect().execute(DUCK.format(path=jsonl)).fetchall()
        times.append(time.perf_counter() - t0)
    return {"seconds_median": round(statistics.median(times), 2), "top_node": rows[0][0], "top_node_jobs": rows[0][1],
            "version": duckdb.__version__}


def bench(name: str, new_db, work: Path, args) -> dict:
    """``new_db(label)``: the URL of a new, empty database of this backend."""
    (work / "trusted").write_text(TRUSTED + "\n")
    proc, port = serve(new_db("ingest"), work, "--trusted-token-file", str(work / "trusted"),
                       "--threads", str(args.threads))
    try:
        print(f"[{name}] posting {args.summaries} job summaries...", flush=True)
        posted = ingest(port, args.summaries, args.seconds)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"[{name}] filling to {args.jobs:,} jobs over {args.nodes:,} nodes...", flush=True)
    url = new_db("centre")                  # the same jobs as the JSON lines DuckDB reads
    jsonl = work / f"{name}-summaries.jsonl"
    filled = fill(url, args.jobs, args.nodes, jsonl)
    print(f"[{name}] timing the centre report...", flush=True)
    return {"ingest": posted, "fill": filled, "report": report(url), "duckdb_jsonl": duckdb_ranking(jsonl)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--summaries", type=int, default=6000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=16, help="hpcml centre serve --threads")
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcml-bench-centre-"))
    out: dict = {"goals": {"summaries_per_s_postgres": 1000, "report_s_100k_jobs": 10},
                 "machine": {"cpus": os.cpu_count()}, "backends": {}}
    for name in args.backends.split(","):
        if name == "sqlite":
            out["backends"][name] = bench(name, lambda label: f"sqlite:///{work}/{label}.db", work, args)
        else:
            from tests.centre.pgcluster import PgCluster
            pg = PgCluster().start()
            try:
                out["backends"][name] = bench(name, pg.create_db, work, args)
            finally:
                pg.stop()
    print(f"\n{'backend':10} {'summaries/s':>12} {'p99 ms':>8} {'jobs':>8} {'report s':>9} {'duckdb s':>9} "
          f"{'ratio':>6} {'same top node':>14}")
    for name, r in out["backends"].items():
        rep, duck = r["report"], r["duckdb_jsonl"]
        same = (rep["top_node_jobs"] == duck["top_node_jobs"])
        print(f"{name:10} {r['ingest']['summaries_per_s']:>12} {r['ingest']['latency_ms_p99']:>8} {rep['jobs']:>8} "
              f"{rep['seconds_median']:>9} {duck['seconds_median']:>9} "
              f"{rep['seconds_median'] / duck['seconds_median']:>6.2f} {str(same):>14}")
    dest = ROOT / "benchmarks" / "results" / "centre.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
