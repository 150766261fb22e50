"""The north star at scale: `hpcml run --vet` on N virtual nodes with a few bad ones.

    python benchmarks/bench_scale.py [--nodes 16,64,128,256] [--bad-fraction 0.02]
                                     [--no-extras]

For each N, a local Slurm cluster of N virtual nodes of one CPU each
(``hpcml.testing.localslurm``, its own root /tmp/hpcml-slurm-scale and ports 9017..) on
this one host, then:

1. **vet and launch**: one N-node batch job, ``hpcml run --vet scale.yaml -- python
   task.py``. ``scale.yaml`` is the CPU protocol's host checks (memory, load, disk,
   mounts, env; the GEMM is left out: N virtual nodes share two cores, so its rates would
   only measure the sharing) plus a site's plug-in check, installed the documented way (a
   distribution with an ``hpcml.checks`` entry point on PYTHONPATH:
   ``hpcml.testing.siteplugin``), that fails on the
   nodes listed in a file: ``max(1, round(N x bad_fraction))`` nodes chosen at random.
   Each rank appends ``RANK WORLD_SIZE NODE TIME`` to one O_APPEND file, so what is
   checked is what the ranks did: exactly the injected nodes excluded, every other node
   one rank, ranks 0..W-1 once each, WORLD_SIZE = W everywhere. Timed: the allocation's
   start (the batch script's first line) to the first and the last rank's start.
   The checks' timeouts and the protocol's deadline are multiplied by ``scale`` =
   max(1, N / 32): N workers start at once on two cores here, where a real cluster gives
   each node its own CPUs. The factor is printed and recorded.
2. **extras** (``benchmarks/scale_parts.py``): ``hpcml farm run`` with one agent per node
   (tasks/s, exactly once), the collector ingesting N vet reports, ``hpcml observe
   report`` over N x 4 ranks.
3. **per-node cost**, what a training node pays, measured apart on this host: CPU of one
   vet worker for scale.yaml, of one task wrapper with its recorder for ``true`` (start)
   and over 10 s of ``sleep`` (sampling).

Writes benchmarks/results/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import scale_parts  # noqa: E402 - beside this file
from measure import compile_sources  # noqa: E402 - beside this file
from scale_parts import wait_job  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_ROOT = Path("/tmp/hpcml-slurm-scale")
CTLD_PORT, FIRST_SLURMD_PORT = 9017, 9021
WORK = Path("/tmp/hpcml-bench-scale")
#: each virtual node's disk check writes in a directory of its own: hundreds of nodes
#: creating and fsyncing files in one /tmp directory would measure that directory's lock
DISK = Path("/tmp/hpcml-scale-disk")

TASK = '''import os, time
line = f"{os.environ['RANK']} {os.environ['WORLD_SIZE']} {os.environ.get('SLURMD_NODENAME')} {time.time():.3f}\\n"
fd = os.open(os.environ["SCALE_DONE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
'''
#: the CPU protocol's host checks, timeouts in seconds before scaling
CHECKS = [("memory", "type: memory, min_available_fraction: 5%", 5),
          ("load", "type: load, max_load_per_cpu: 1000, severity: warn", 5),
          ("tmp-disk", "type: disk, path: /tmp/hpcml-scale-disk/$SLURMD_NODENAME, min_free: 100 MB, "
                       "write_size: 1 MiB", 15),
          ("mounts", "type: mounts, paths: [/tmp, /proc]", 10),
          ("env", "type: env, absent: [HPCML_SCALE_SURELY_UNSET]", 5)]


def plugin_site(work: Path) -> Path:
    """The site package with the ``marked-bad`` check, installed the way pip would."""
    from hpcml.testing import siteplugin
    return siteplugin.install(work / "site")


def protocol(work: Path, scale: float) -> Path:
    lines = ["name: scale-host-checks", f"deadline: {60 * scale:g} s", "evals:"]
    for name, body, timeout in CHECKS:
        lines.append(f"  - {{name: {name}, {body}, timeout: {timeout * scale:g} s}}")
    lines.append(f"  - {{name: marked, type: marked-bad, nodes_file: {work / 'bad.txt'}, "
                 f"timeout: {5 * scale:g} s}}")
    path = work / "scale.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def job_env(cluster, work: Path, site: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = cluster.client_env(base)
    env.update(PYTHONPATH=f"{site}:{ROOT / 'src'}", SCALE_DONE=str(work / "done.txt"),
               PATH=f"{Path(sys.executable).parent}:{base.get('PATH', '')}")
    return env




def vet_and_launch(cluster, work: Path, n: int, bad_fraction: float, scale: float) -> dict:
    work.mkdir(parents=True)
    nodes = cluster.node_names
    bad = sorted(random.Random(n).sample(nodes, max(1, round(n * bad_fraction))), key=nodes.index)
    (work / "bad.txt").write_text("\n".join(bad) + "\n")
    site = plugin_site(work)
    proto = protocol(work, scale)
    env = job_env(cluster, work, site)
    (work / "job.sh").write_text(
        "#!/bin/bash\necho $(date +%s.%N) > alloc.txt\n"
        f"hpcml run --vet {proto} --min-nodes 1 --hang-timeout off --no-report --kill-grace 5 "
        f"--dir job -- python {work / 'task.py'}\necho $? > rc.txt\n")
    (work / "task.py").write_text(TASK)
    t0 = time.time()
    out = subprocess.run(["sbatch", "--parsable", f"-N{n}", "--ntasks-per-node=1", f"--output={work}/job.out",
                          f"--chdir={work}", str(work / "job.sh")], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    job = out.stdout.strip().split(";")[0]
    wait_job(job, env, timeout=900)
    wall = time.time() - t0
    alloc = float((work / "alloc.txt").read_text())
    rows = [ln.split() for ln in (work / "done.txt").read_text().splitlines()] if (work / "done.txt").exists() else []
    good = [x for x in nodes if x not in bad]
    world = len(good)
    ranks = sorted(int(r[0]) for r in rows)
    run = json.loads((work / "job" / "run.json").read_text())
    excluded = sorted(set(nodes) - set(run.get("nodes") or []), key=nodes.index)
    starts = [float(r[3]) for r in rows]
    correct = (excluded == bad and ranks == list(range(world)) and {r[1] for r in rows} == {str(world)}
               and sorted((r[2] for r in rows), key=nodes.index) == good)
    vet_took = (run.get("vet") or {}).get("duration_s")
    phases = launcher_phases(run, alloc)
    t1 = time.time()
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", str(work / "job")], env=env,
                         capture_output=True, text=True, timeout=600)
    report_s = time.time() - t1
    return {"nodes": n, "bad": bad, "excluded": excluded, "run_json_excluded": run.get("excluded"),
            "world_size": world, "ranks_seen": len(ranks),
            "correct": correct, "exit_code": (work / "rc.txt").read_text().strip() if (work / "rc.txt").exists()
            else None, "first_rank_s": round(min(starts) - alloc, 2) if starts else None,
            "last_rank_s": round(max(starts) - alloc, 2) if starts else None, "vet_s": vet_took,
            "job_wall_s": round(wall, 2), "report_s": round(report_s, 2), "report_rc": rep.returncode,
            "report_lines": len(rep.stdout.splitlines()), "scale": scale,
            "job_files": sum(len(f) for _, _, f in os.walk(work / "job")), "phases": phases}


def launcher_phases(run: dict, alloc: float) -> dict[str, dict[str, float]]:
    """run.json's ``phases`` (``hpcml.phases``), summed by name: the launcher's own wall and
    CPU per phase, and when each began after the allocation (``at_s``)."""
    out: dict[str, dict[str, float]] = {}
    for p in run.get("phases") or []:
        row = out.setdefault(p["name"], {"at_s": round(p["start"] - alloc, 3), "wall_s": 0.0, "cpu_s": 0.0})
        row["wall_s"] = round(row["wall_s"] + p["wall_s"], 4)
        row["cpu_s"] = round(row["cpu_s"] + p["cpu_s"], 4)
    return out


#: what the launcher does once per job, whose CPU grows with the node count on any cluster
SERIAL = ("start-up", "prepare", "vet.fan-out", "vet.gather", "vet.decide", "vet.write", "rendezvous", "srun step",
          "watch.first read", "report")


def fit(rows: list[dict], target: int) -> dict[str, dict[str, float]]:
    """Per phase, the launcher's CPU as ``a + b * n`` (least squares over the measured node
    counts) and as ``c * n ** k`` (k: the log-log slope between the smallest and the largest),
    each predicted at ``target`` nodes. k near 1 is linear; above 1.2 the phase grows faster."""
    import math
    out: dict[str, dict[str, float]] = {}
    names = [n for n in SERIAL + ("watch",) if any(n in (r.get("phases") or {}) for r in rows)]
    for name in names:
        pts = [(r["nodes"], r["phases"][name]["cpu_s"]) for r in rows if name in (r.get("phases") or {})]
        if len(pts) < 2:
            continue
        xs, ys = [float(x) for x, _ in pts], [y for _, y in pts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
        a = my - b * mx
        (x0, y0), (x1, y1) = min(pts), max(pts)
        k = math.log(y1 / y0) / math.log(x1 / x0) if y0 > 0 and y1 > 0 and x1 > x0 else float("nan")
        out[name] = {"a_s": round(a, 4), "b_ms_per_node": round(b * 1000, 4), "k": round(k, 2),
                     "linear_at_target_s": round(a + b * target, 3),
                     "power_at_target_s": round(y1 * (target / x1) ** k, 3) if k == k else float("nan")}
    return out


def _cpu_ms(cmd: list[str], env: dict[str, str], stdin: str = "", runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=120)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000)
    return round(sorted(times)[len(times) // 2], 1)


def _wrapper_rss_mb(cmd: list[str], env: dict[str, str]) -> float:
    """Resident memory of a rank's one helper process (the task wrapper, which records in
    process) while its rank runs, 2 s after its start: VmRSS from /proc."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2.0)
    status = Path(f"/proc/{proc.pid}/status").read_text()
    proc.wait(timeout=60)
    kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return round(kib / 1024, 1)


def per_node_cost(work: Path) -> dict:
    """CPU of what hpcml starts on every node, measured apart on this host."""
    from hpcml.vet import protocol as proto_mod
    from hpcml.vet.engine import _spec
    from hpcml.vet.launch import _worker_command, preload_hint
    site = plugin_site(work / "cost")
    (work / "cost" / "bad.txt").write_text("")
    proto_path = protocol(work / "cost", 1.0)
    env = dict(os.environ, PYTHONPATH=f"{site}:{ROOT / 'src'}", SLURMD_NODENAME="n1")
    sys.path.insert(0, str(site))
    proto = proto_mod.load(proto_path)
    spec = json.dumps(_spec(proto, proto.evals, ["n1"], time.time() + 600, None)) + "\n"
    worker = dict(env, HPCML_VET_PRELOAD=",".join(preload_hint(proto_path)))
    task_env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT="29999")
    task = [sys.executable, "-m", "hpcml.run.task"]
    bare = _cpu_ms([sys.executable, "-S", "-c", "pass"], env)
    out = {"python_floor_ms": bare,
           "vet_worker_ms": _cpu_ms(_worker_command(sys.executable), worker, spec),
           "task_wrapper_and_recorder_start_ms": _cpu_ms(task + [str(work / "cost" / "t1"), "--", "true"], task_env)}
    out["task_wrapper_rss_mb"] = _wrapper_rss_mb(task + [str(work / "cost" / "t3"), "--", "sleep", "4"], task_env)
    # a rank that logs its steps (hpcml.observe) as real ones do: the wrapper's share is the
    # whole minus the same rank run alone (both: the rank's own CPU, its logging included)
    train = [sys.executable, str(ROOT / "examples" / "observe" / "train.py"), "--steps", "100"]
    alone = _cpu_ms(train, dict(task_env, HPCML_OBSERVE_DIR=str(work / "cost" / "alone")), runs=3)
    out["logging_rank_alone_ms"] = alone
    out["task_wrapper_around_logging_rank_ms"] = round(_cpu_ms(task + [str(work / "cost" / "t4"), "--", *train],
                                                               task_env, runs=3) - alone, 1)
    sampling = _cpu_ms(task + [str(work / "cost" / "t2"), "--", "sleep", "10"], task_env, runs=1)
    out["recorder_sampling_pct_of_core"] = round((sampling - out["task_wrapper_and_recorder_start_ms"]) / 10_000 * 100, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="16,64,128,256")
    ap.add_argument("--bad-fraction", type=float, default=0.02)
    ap.add_argument("--no-extras", action="store_true", help="only the vet-and-launch case")
    ap.add_argument("--target", type=int, default=2688, help="the node count the cost model predicts (Alps: 2,688)")
    args = ap.parse_args()
    print(compile_sources())
    from hpcml.testing.localslurm import LocalSlurm
    rows: list[dict] = []
    shutil.rmtree(WORK, ignore_errors=True)       # kept after a run, to read what went wrong
    WORK.mkdir(parents=True)
    for node in range(1, max(int(x) for x in args.nodes.split(",")) + 1):
        (DISK / f"n{node}").mkdir(parents=True, exist_ok=True)
    if True:
        tmp = str(WORK)
        cost = per_node_cost(Path(tmp))
        print(json.dumps({"per_node_cost": cost}), flush=True)
        for n in (int(x) for x in args.nodes.split(",")):
            work = Path(tmp) / f"n{n}"
            work.mkdir()
            t = time.time()
            with LocalSlurm(CLUSTER_ROOT, nodes=n, cpus_per_node=1, ctld_port=CTLD_PORT,
                            first_slurmd_port=FIRST_SLURMD_PORT) as cluster:
                started = round(time.time() - t, 1)
                row = {"cluster_start_s": started,
                       **vet_and_launch(cluster, work / "run", n, args.bad_fraction, max(1.0, n / 32))}
                if not args.no_extras:
                    row.update(extras(cluster, work, n))
            print(json.dumps(row), flush=True)
            rows.append(row)
    model = fit(rows, args.target) if len(rows) >= 2 else {}
    print_phases(rows, model, args.target)
    out = ROOT / "benchmarks" / "results" / "scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "per_node_cost": cost, "machine": os.uname().nodename,
                               "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                               "model": {"target_nodes": args.target, "launcher_cpu_by_phase": model}},
                              indent=2) + "\n")
    print(f"wrote {out}")


def print_phases(rows: list[dict], model: dict, target: int) -> None:
    """One line per phase: wall and the launcher's CPU at each node count, then the model."""
    names = list(dict.fromkeys(k for r in rows for k in (r.get("phases") or {})))
    print("phase".ljust(18) + "".join(f"{r['nodes']:>8} nodes: wall / cpu s " for r in rows)
          + (f"  | cpu at {target}: linear / power (k)" if model else ""))
    for name in names:
        cells = "".join(f"{r['phases'][name]['wall_s']:>14.3f} / {r['phases'][name]['cpu_s']:<10.3f}"
                        if name in (r.get("phases") or {}) else " " * 27 for r in rows)
        m = model.get(name)
        tail = f"  | {m['linear_at_target_s']:.3f} / {m['power_at_target_s']:.3f} ({m['k']})" if m else ""
        print(name.ljust(18) + cells + tail)


def extras(cluster, work: Path, n: int) -> dict:
    out: dict = {}
    for name, call in (("farm", lambda: scale_parts.farm_case(cluster, work / "farm", n)),
                       ("collector", lambda: scale_parts.collector_case(
                           work / "collector", scale_parts.synthetic_vet_reports(n))),
                       ("observe_report", lambda: scale_parts.observe_case(work / "observe", n * 4))):
        (work / name.split("_")[0]).mkdir(exist_ok=True)
        try:
            out[name] = call()
        except Exception as exc:  # noqa: BLE001 - a benchmark row says what failed and goes on
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


if __name__ == "__main__":
    main()
