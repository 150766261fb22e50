"""The scale benchmark's extras: three of hpcml's tools at N nodes, each through its real CLI.

Called by ``benchmarks/bench_scale.py`` for N = 16, 64, 128, 256 virtual Slurm nodes on
one small host; usable alone (see the functions). Each returns a JSON-able dict of
figures with ``correct``, a boolean saying the tool did what it should; none asserts a
timing (two cores shared by N virtual nodes measure the sharing as much as the tool).

- ``farm_case``: ``hpcml farm run`` in one N-node batch job, one agent per node (one srun
  step), N x 20 short tasks. Measured: tasks/s over the whole command, timed in the batch
  script around it (queueing left out). Correct: every task wrote its id exactly once to
  one O_APPEND file -- counted in that file, not in hpcml's own records -- which is the
  farm's promise (never lost, never run twice) when N agents claim from one directory.
- ``collector_case``: ``hpcml centre serve`` (SQLite) taking N node reports, one POST each
  as N nodes' ``hpcml vet --report-to`` would send them. Measured: seconds from the first
  POST to the last answer (each 201 is a committed write). Correct: every POST stored and
  GET /v1/jobs/{job} lists exactly the N nodes.
- ``observe_case``: ``hpcml observe report`` over a job directory of N x 4 ranks written
  by ``hpcml.testing.synthetic_job`` (the store's own RankWriter, as the recorder writes:
  rank-NNNNN.arrows and .json, job.json), one chronic straggler injected. Measured:
  seconds of the command and the size of what it writes. Correct: the report counts
  every rank with data, none missing or damaged, and names the straggler.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HPCML = [sys.executable, "-m", "hpcml"]
CHECKS = ["gpu-count", "xid", "ecc", "pcie", "nvlink", "nic", "memory", "disk", "gemm", "nccl"]
SCALE_JOB = "scale-vet"

# --------------------------------------------------------------------------- farm


def _slurm_env(cluster) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = cluster.client_env(base)
    env.update(PYTHONPATH=f"{ROOT / 'src'}:{ROOT}", PATH=f"{Path(sys.executable).parent}:{base.get('PATH', '')}")
    return env


def wait_job(job: str, env: dict[str, str], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:   # the controller answers slowly while hundreds of virtual nodes start a step
            q = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            continue
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(2)
    subprocess.run(["scancel", job], env=env, timeout=30)
    raise TimeoutError(f"job {job} still running after {timeout} s")


def _count_ids(path: Path, n: int) -> dict:
    """Task ids in the tasks' own file: how many lines, ids missing, ids written more than once,
    lines that are no id of ours (torn or foreign writes)."""
    seen: dict[str, int] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        seen[line] = seen.get(line, 0) + 1
    ids = {str(i) for i in range(n)}
    missing = [i for i in range(n) if str(i) not in seen]
    return {"lines": len(lines), "missing": len(missing), "duplicated": sum(c > 1 for c in seen.values()),
            "unknown": sum(k not in ids for k in seen), "missing_first": missing[:10]}


def farm_case(cluster, work: Path, nodes: int, tasks_per_node: int = 20, timeout: float = 900) -> dict:
    """``hpcml farm run`` over ``nodes * tasks_per_node`` tasks in one ``nodes``-node job of
    ``cluster`` (a started LocalSlurm), one agent and one worker per node."""
    work.mkdir(parents=True, exist_ok=True)
    n = nodes * tasks_per_node
    done, farm = work / "done.txt", work / "farm"
    shutil.rmtree(farm, ignore_errors=True)          # a farm never reruns what it has done: start afresh
    for f in (done, work / "rc.txt", work / "t0.txt", work / "t1.txt"):
        f.unlink(missing_ok=True)
    (work / "tasks.txt").write_text("".join(f"echo {i} >> {done}\n" for i in range(n)))
    env = _slurm_env(cluster)
    subprocess.run([*HPCML, "farm", "create", str(farm), str(work / "tasks.txt")], env=env, check=True,
                   capture_output=True, timeout=300)
    (work / "job.sh").write_text(
        "#!/bin/bash\ndate +%s.%N > t0.txt\n"
        f"{' '.join(HPCML)} farm run {farm}\necho $? > rc.txt\ndate +%s.%N > t1.txt\n")
    out = subprocess.run(["sbatch", "--parsable", f"-N{nodes}", "--ntasks-per-node=1", f"--output={work}/job.out",
                          f"--chdir={work}", str(work / "job.sh")], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    job = out.stdout.strip().split(";")[0]
    try:
        wait_job(job, env, timeout)
    except BaseException:
        subprocess.run(["scancel", job], env=env, timeout=60)
        raise
    rc = (work / "rc.txt").read_text().strip() if (work / "rc.txt").exists() else None
    if rc is None:
        raise RuntimeError(f"the batch job ended before hpcml farm run did: {(work / 'job.out').read_text()[-1000:]}")
    wall = float((work / "t1.txt").read_text()) - float((work / "t0.txt").read_text())
    counts = _count_ids(done, n)
    once = counts["lines"] == n and not (counts["missing"] or counts["duplicated"] or counts["unknown"])
    ends = [json.loads(f.read_text()) for f in (farm / "ends").iterdir() if not f.name.startswith(".")]
    return {"nodes": nodes, "tasks": n, "exit_code": int(rc), "wall_s": round(wall, 2),
            "tasks_per_s": round(n / wall, 1), "nodes_used": len({e["node"] for e in ends}),
            "end_records": len(ends), **counts,
            "exactly_once": once, "correct": once and rc == "0"}


# --------------------------------------------------------------------------- collector


def synthetic_vet_reports(n_nodes: int, seed: int = 0) -> list[dict]:
    """``n_nodes`` node reports of one vetting run, as bench_collector.py posts them (10
    checks, ~2 % failing), nodes n1..nN of one job."""
    rng = random.Random(seed)
    now = time.time()
    out = []
    for i in range(1, n_nodes + 1):
        outcomes = ["fail" if rng.random() < 0.02 else "pass" for _ in CHECKS]
        out.append({"job_id": SCALE_JOB, "node": f"n{i}", "time": now, "protocol": "gpu-node-vetting",
                    "verdict": "bad" if "fail" in outcomes else "good",
                    "results": [{"name": c, "type": c, "outcome": o, "value": rng.uniform(1, 500), "unit": "GB/s",
                                 "message": "" if o == "pass" else f"{c} below threshold",
                                 "duration": rng.uniform(0.001, 2)} for c, o in zip(CHECKS, outcomes)]})
    return out


def _node_reports(reports: list[dict]) -> list[dict]:
    """Node reports as given, a whole ``hpcml vet`` report (vet/report.json) split per node."""
    from hpcml.centre.collector.schema import split_vet_report
    out: list[dict] = []
    for r in reports:
        out.extend(split_vet_report(r) if "nodes" in r and "schema" in r else [r])
    return out


def _serve(db: str, cwd: Path, token: str) -> tuple[subprocess.Popen, int]:
    with open(cwd / "serve.err", "w") as err:
        proc = subprocess.Popen([*HPCML, "centre", "serve", "--db", db, "--port", "0"], cwd=cwd,
                                env={**os.environ, "HPCML_VET_TOKEN": token}, stdout=subprocess.PIPE, stderr=err,
                                text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on"):
        _stop(proc)
        raise RuntimeError(f"collector did not start: {line!r} {(cwd / 'serve.err').read_text()[-500:]}")
    return proc, int(line.strip().rsplit(":", 1)[1])


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def _request(conn: http.client.HTTPConnection, method: str, path: str, token: str, body: bytes | None = None):
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {token}",
                                                   "Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def collector_case(work: Path, reports: list[dict]) -> dict:
    """``hpcml centre serve`` on a fresh SQLite store takes ``reports`` (node reports, or whole
    vet reports split per node), one POST each over one keep-alive connection."""
    work.mkdir(parents=True, exist_ok=True)
    nodes = _node_reports(reports)
    bodies = [json.dumps(r).encode() for r in nodes]
    db = work / "collector.db"
    for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        f.unlink(missing_ok=True)
    token = secrets.token_hex(16)
    proc, port = _serve(f"sqlite:///{db}", work, token)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        t0 = time.perf_counter()
        stored = sum(_request(conn, "POST", "/v1/reports", token, b)[0] == 201 for b in bodies)
        ingest = time.perf_counter() - t0
        t1 = time.perf_counter()
        listed: set[tuple[str, str]] = set()
        for job in sorted({str(r.get("job_id")) for r in nodes}):
            status, body = _request(conn, "GET", f"/v1/jobs/{job}", token)
            listed |= {(job, r["node"]) for r in body.get("reports", [])} if status == 200 else set()
        query = time.perf_counter() - t1
        conn.close()
    finally:
        _stop(proc)
    expected = {(str(r.get("job_id")), r["node"]) for r in nodes}
    return {"reports": len(nodes), "stored": stored, "ingest_s": round(ingest, 3),
            "reports_per_s": round(len(nodes) / ingest, 1), "job_query_s": round(query, 3),
            "nodes_listed": len(listed & expected), "server_rc": proc.returncode,
            "correct": stored == len(nodes) and listed == expected}


# --------------------------------------------------------------------------- observe report


def observe_case(work: Path, ranks: int, steps: int = 1000) -> dict:
    """``hpcml observe report --json`` over ``ranks`` ranks (4 per node) of ``steps`` steps,
    rank ranks // 2 a chronic straggler (x1.3)."""
    from hpcml.testing.synthetic_job import make_job
    work.mkdir(parents=True, exist_ok=True)
    job, slow = work / f"job-{ranks}x{steps}", ranks // 2
    shutil.rmtree(job, ignore_errors=True)
    t0 = time.perf_counter()
    make_job(job, n_ranks=ranks, n_steps=steps, slow_ranks={slow: 1.3})
    written = time.perf_counter() - t0
    html = work / "report.html"
    t1 = time.perf_counter()
    p = subprocess.run([*HPCML, "observe", "report", str(job), "--json", "--html", str(html)],
                       capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t1
    if p.returncode != 0:
        raise RuntimeError(f"hpcml observe report failed ({p.returncode}): {p.stderr[-1000:]}")
    rep = json.loads(p.stdout)
    all_ranks = (rep["ranks_expected"] == ranks and rep["ranks_with_data"] == ranks and not rep["missing_ranks"]
                 and not rep["damaged_ranks"])
    stragglers = [s["rank"] for s in rep["stragglers"]]
    return {"ranks": ranks, "steps": steps, "rows": rep["rows"], "write_s": round(written, 2),
            "report_s": round(took, 2), "json_bytes": len(p.stdout), "html_bytes": html.stat().st_size,
            "store_bytes": sum(f.stat().st_size for f in job.iterdir()), "ranks_with_data": rep["ranks_with_data"],
            "all_ranks": all_ranks, "stragglers": stragglers, "correct": all_ranks and stragglers == [slow]}
