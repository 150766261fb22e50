"""What pushing a job's series into a TSDB costs a node: hpcml's remote write beside the
scrape exporter hpcml already has and prometheus_client's Pushgateway push.

    python benchmarks/bench_remotewrite.py [--seconds 60] [--ranks 1024] [--procs 4]

A simulated node is 4 ranks of one GPU each, 1 sample/s per series: every second each rank
has the rows a recorder has (local rank 0: 9 host rows; each rank: 16 GPU rows for its GPU;
the application's batch of 10 steps: 10 ``step`` sections and 10 ``tokens_per_s``, as an
Arrow batch, as the copier hands it on). What is measured is the CPU time of the processes
that hold the node's sinks (``time.process_time`` over ``--seconds`` after a 10 s warm-up,
threads included), less the same loop with no sink (the rows cost the recorder nothing
extra: it has them anyway), in % of one core:

1. ``remote``: 4 RemoteWriters (one per rank, as each recorder has) pushing every 5 s to a
   real Prometheus with ``--web.enable-remote-write-receiver``.
2. ``scrape``: ``PromExporter`` (local rank 0) + 3 ``PromForwarder`` (UDP), scraped every 1 s.
3. ``pushgateway``: a registry per rank, ``push_to_gateway`` every 1 s (the gateway keeps only
   the last value, so 1 sample/s needs a push a second) to Debian's prometheus-pushgateway,
   scraped every 1 s.
4. ``remote`` at scale: ``--ranks`` ranks (256 nodes for 1,024) in ``--procs`` processes,
   into the same Prometheus, and its own baseline; the series that arrived are counted back
   with PromQL.

Writes benchmarks/results/remotewrite.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANKS_PER_NODE = 4
STEPS_PER_S = 10
GPU_NAMES = [f"field_{i:02d}" for i in range(16)]
HOST_NAMES = ["cpu_percent", "mem_used_bytes", "mem_available_bytes", "disk_read_bytes_per_s", "disk_write_bytes_per_s",
              "net_recv_bytes_per_s", "net_sent_bytes_per_s", "proc_cpu_percent", "proc_rss_bytes"]
WARMUP_S = 10


def rows_for(local_rank: int, ts: int) -> list[tuple]:
    rows = [(ts, "gpu", n, 50.0 + i, None, local_rank) for i, n in enumerate(GPU_NAMES)]
    if local_rank == 0:
        rows += [(ts, "host", n, 1e6 + i, None, None) for i, n in enumerate(HOST_NAMES)]
    return rows


def batch_for(rank: int, ts: int, step: int):
    from hpcml.observe.schema import to_batch
    rows = []
    for k in range(STEPS_PER_S):
        t = ts + k * 100_000_000
        rows += [(t, "section", "step", 0.1 + 0.001 * k, step + k, None), (t, "metric", "tokens_per_s", 4096.0, step + k, None)]
    return to_batch(rows, rank)


class PushgatewayRank:
    """One rank's registry pushed to a Pushgateway, as a user of prometheus_client would."""

    def __init__(self, gateway: str, job: str, node: str, rank: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge
        self.gateway, self.key = gateway, {"slurm_job": job, "node": node, "rank": str(rank)}
        self.reg = CollectorRegistry()
        self.host = Gauge("hpcml_host", "host", ["name"], registry=self.reg)
        self.gpu = Gauge("hpcml_gpu", "gpu", ["gpu", "name"], registry=self.reg)
        self.step = Gauge("hpcml_step_seconds", "step", registry=self.reg)
        self.tput = Gauge("hpcml_throughput", "throughput", registry=self.reg)

    def update(self, rows) -> None:
        for _ts, kind, name, value, _s, gpu in rows:
            if kind == "gpu":
                self.gpu.labels(str(gpu), name).set(value)
            elif kind == "host":
                self.host.labels(name).set(value)

    def update_batch(self, batch) -> None:
        cols = batch.to_pydict()
        for kind, value in zip(cols["kind"], cols["value"]):
            (self.step if kind == "section" else self.tput).set(value)

    def push(self) -> None:
        from prometheus_client import push_to_gateway
        try:
            push_to_gateway(self.gateway, job="hpcml", grouping_key=self.key, registry=self.reg, timeout=5)
        except OSError:
            pass

    def close(self) -> dict:
        return {}


def sinks(kind: str, node: int, target: str, job: str) -> list:
    """The 4 ranks' sinks of one simulated node (None: the baseline, no sink)."""
    name = f"b{node:04d}"
    if kind == "baseline":
        return [None] * RANKS_PER_NODE
    if kind == "remote":
        from hpcml.observe import remotewrite as rw
        cfg = rw.Config(target)
        return [rw.RemoteWriter(cfg, node=name, rank=node * RANKS_PER_NODE + lr, job=job, node_writer=lr == 0)
                for lr in range(RANKS_PER_NODE)]
    if kind == "scrape":
        from hpcml.observe.export import PromExporter, PromForwarder
        port = int(target)
        return [PromExporter(port, "127.0.0.1", job=job, rank=node * RANKS_PER_NODE, node=name),
                *(PromForwarder(port, rank=node * RANKS_PER_NODE + lr) for lr in range(1, RANKS_PER_NODE))]
    return [PushgatewayRank(target, job, name, node * RANKS_PER_NODE + lr) for lr in range(RANKS_PER_NODE)]


def worker(kind: str, first: int, nodes: int, target: str, job: str, seconds: int, out) -> None:
    """Feed ``nodes`` simulated nodes once a second; CPU time over the measured window."""
    import pyarrow  # noqa: F401 - imported before the window, as the recorder has it
    all_sinks = [sinks(kind, first + n, target, job) for n in range(nodes)]
    start = time.time() + 0.5
    cpu0 = None
    for tick in range(WARMUP_S + seconds):
        time.sleep(max(0.0, start + tick - time.time()))
        if tick == WARMUP_S:
            cpu0 = time.process_time()
        ts = time.time_ns()
        for n, node_sinks in enumerate(all_sinks):
            for lr, sink in enumerate(node_sinks):
                rank = (first + n) * RANKS_PER_NODE + lr
                rows, batch = rows_for(lr, ts), batch_for(rank, ts, tick * STEPS_PER_S)
                if sink is None:
                    continue
                sink.update(rows)
                sink.update_batch(batch)
                if kind == "pushgateway":
                    sink.push()
    cpu = time.process_time() - (cpu0 or 0.0)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(64) as pool:         # the flush at the end, all at once as on the nodes
        closed = list(pool.map(lambda s: s.close() or {}, [s for ns in all_sinks for s in ns if s is not None]))
    stats: dict[str, int] = {}
    for c in closed:
        for k, v in c.get("remote_write", {}).items():
            if isinstance(v, int):
                stats[k] = stats.get(k, 0) + v
            elif k == "problem" and v:
                stats[f"problem: {v}"] = stats.get(f"problem: {v}", 0) + 1
    out.put((cpu, stats))


def run_phase(kind: str, nodes: int, procs: int, target: str, job: str, seconds: int) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = [nodes // procs + (1 if i < nodes % procs else 0) for i in range(procs)]
    firsts = [sum(per[:i]) for i in range(procs)]
    ps = [ctx.Process(target=worker, args=(kind, f, n, target, job, seconds, q)) for f, n in zip(firsts, per) if n]
    for p in ps:
        p.start()
    cpu, stats = 0.0, Counter()
    for _ in ps:
        c, st = q.get(timeout=WARMUP_S + seconds + 300)
        cpu += c
        stats.update(st)
    for p in ps:
        p.join(60)
    return {"kind": kind, "nodes": nodes, "procs": len(ps), "seconds": seconds, "cpu_s": round(cpu, 3),
            "core_percent_per_node": 100 * cpu / seconds / nodes, "writers": dict(stats)}


def query(port: int, promql: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)["data"]["result"]


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not come up")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--procs", type=int, default=4)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from hpcml.ports import free_port
    work = Path(tempfile.mkdtemp(prefix="bench-rw-"))
    prom_port, export_port, gw_port = (free_port("127.0.0.1") for _ in range(3))
    (work / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: hpcml-export
    static_configs: [{{targets: ["127.0.0.1:{export_port}"]}}]
  - job_name: pushgateway
    honor_labels: true
    static_configs: [{{targets: ["127.0.0.1:{gw_port}"]}}]
""")
    procs = [subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}", "--web.enable-remote-write-receiver"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    gateway = shutil.which("prometheus-pushgateway")
    if gateway:
        procs.append(subprocess.Popen([gateway, f"--web.listen-address=127.0.0.1:{gw_port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{prom_port}/api/v1/write"
    results = []
    try:
        wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", procs[0])
        if gateway:
            wait_ready(f"http://127.0.0.1:{gw_port}/-/ready", procs[1])
        phases = [("baseline", 1, 1, "", "bench-base"), ("remote", 1, 1, url, "bench-node"),
                  ("scrape", 1, 1, str(export_port), "bench-scrape")]
        if gateway:
            phases.append(("pushgateway", 1, 1, f"127.0.0.1:{gw_port}", "bench-gw"))
        nodes = args.ranks // RANKS_PER_NODE
        phases += [("baseline", nodes, args.procs, "", "bench-base-scale"), ("remote", nodes, args.procs, url, "bench-scale")]
        for kind, n, p, target, job in phases:
            r = run_phase(kind, n, p, target, job, args.seconds)
            r["job"] = job
            results.append(r)
            print(f"{kind:12s} {n:4d} nodes: {r['core_percent_per_node']:.3f} % of a core per node (gross) {r['writers']}", flush=True)
        time.sleep(3)
        expected = nodes * (7 + RANKS_PER_NODE * 16) + nodes * RANKS_PER_NODE * 2
        window = f"{args.seconds + WARMUP_S + 30}s"
        got = query(prom_port, 'count({slurm_job="bench-scale"})')
        names = [f"hpcml_host_{n}" for n in HOST_NAMES[:7]] + [f"hpcml_gpu_{n}" for n in GPU_NAMES] + \
            ["hpcml_step_seconds", "hpcml_throughput"]
        samples = 0                 # per name: count_over_time drops it, and series would collide
        for name in names:
            r = query(prom_port, f'sum(count_over_time({name}{{slurm_job="bench-scale"}}[{window}]))')
            samples += int(float(r[0]["value"][1])) if r else 0
        arrived = {"series_expected": expected, "series": int(got[0]["value"][1]) if got else 0,
                   "samples": samples, "samples_expected": expected * (args.seconds + WARMUP_S)}
        for kind, job in (("scrape", "bench-scrape"), ("pushgateway", "bench-gw")):      # the others arrived too
            r = query(prom_port, f'count(count_over_time(hpcml_gpu{{slurm_job="{job}"}}[30m]))')
            arrived[f"{kind}_gpu_series"] = int(r[0]["value"][1]) if r else 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    base = {r["nodes"]: r["core_percent_per_node"] for r in results if r["kind"] == "baseline"}
    print("\n| sink | nodes (ranks) | processes | % of a core per node, net of the baseline | gross |")
    print("|---|---|---|---|---|")
    for r in results:
        if r["kind"] == "baseline":
            continue
        r["net_core_percent_per_node"] = r["core_percent_per_node"] - base.get(r["nodes"], base[1])
        print(f"| {r['kind']} | {r['nodes']} ({r['nodes'] * RANKS_PER_NODE}) | {r['procs']} | "
              f"{r['net_core_percent_per_node']:.3f} | {r['core_percent_per_node']:.3f} |")
    print(f"baseline (rows and Arrow batches, no sink): {base}")
    print(f"arrived: {arrived}")
    out = ROOT / "benchmarks" / "results" / "remotewrite.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": vars(args), "results": results,
                               "baseline": base, "arrived": arrived}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
