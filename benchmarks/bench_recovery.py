"""`hpcml run --max-restarts`: time from a fault to the first step of the resumed training,
beside the same job under plain srun and Slurm's requeue.

    python benchmarks/bench_recovery.py [--runs 3] [--default-hang]

On a local cluster of 4 virtual nodes of its own (root /tmp/hpcml-slurm-recoverybench, its
own ports), tests/run/resumable_ddp.py (torch CPU, gloo, hpcml.ckpt every 10 steps) on 3
nodes, the rank on n2 going wrong at step 30 of the first attempt:

1. **crash** (exits 3), ``hpcml run --max-restarts 1 --spare-nodes 1``: n2 out, the spare n4 in;
2. **hang** (sleeps before its all_reduce), the same with ``--hang-timeout 10s`` (and, with
   ``--default-hang``, the default timeout: at least 120 s, by design);
3. **requeue**, the baseline: ``srun python train.py || scontrol requeue $SLURM_JOB_ID`` in a
   ``--requeue`` batch job (the crash again; the job goes back through the queue and starts
   on the same nodes).

The time to resume is measured from the script's own file (each completed step appends
"attempt rank step time"): from the last step the faulty attempt completed to the first
step of the next. hpcml's own record (run.json's ``restart.resumed.split_s``) splits it into
detection, stop, vetting again, relaunch and the script's start-up (its interpreter, torch,
the rendezvous and the checkpoint load, up to its first step).

Writes benchmarks/results/recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tests" / "run" / "resumable_ddp.py"
STEPS = 60


def _env(cluster, work: Path, fault: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = cluster.client_env(base)
    env.update(PYTHONPATH=f"{ROOT / 'src'}:{ROOT}", PATH=f"{Path(sys.executable).parent}:{base.get('PATH', '')}",
               CKPT=str(work / "ckpt"), DONE=str(work / "done"), OUT=str(work / "final.pt"), FAULT=fault,
               FAULT_NODE="n2", STEPS=str(STEPS))
    return env


def _submit(script: str, work: Path, env: dict[str, str], *flags: str) -> str:
    (work / "job.sh").write_text("#!/bin/bash\n" + script)
    out = subprocess.run(["sbatch", "--parsable", "--ntasks-per-node=1", f"--output={work}/job.out",
                          f"--chdir={work}", *flags, str(work / "job.sh")], env=env, capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.strip().split(";")[0]


def _wait(job: str, env: dict[str, str], timeout: float = 900) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        q = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True, timeout=10)
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=env, timeout=10)
    raise TimeoutError(f"job {job} still running after {timeout} s")


def _resume_gap(done: Path) -> dict:
    """From the script's own steps: the last one of attempt 0, the first of attempt 1."""
    by: dict[int, list[tuple[int, float]]] = {}
    for line in done.read_text().splitlines():
        a, _, s, t = line.split()
        by.setdefault(int(a), []).append((int(s), float(t)))
    last0, first1 = max(t for _, t in by[0]), min(t for _, t in by[1])
    return {"resume_s": round(first1 - last0, 2), "steps_done_in_attempt_0": max(s for s, _ in by[0]),
            "resumed_at_step": min(s for s, _ in by[1])}


def hpcml_run(cluster, work: Path, fault: str, timeout: str) -> dict:
    env = _env(cluster, work, fault)
    job = _submit(f"hpcml run --max-restarts 1 --spare-nodes 1 --hang-timeout {timeout} --kill-grace 5 "
                  f"--no-report --dir job -- python {TASK}\n", work, env, "-N4", "-w", "n[1-4]")
    _wait(job, env)
    run = json.loads((work / "job" / "run.json").read_text())
    restart = run["attempts"][0]["restart"]
    out = {"tool": "hpcml run", "fault": fault, "hang_timeout": timeout, "exit_code": run["exit_code"],
           "nodes": [run["attempts"][0]["nodes"], run["nodes"]], **_resume_gap(work / "done"),
           "fault_to_first_step_s": restart["resumed"]["time_to_resume_s"], "split_s": restart["resumed"]["split_s"],
           "steps_lost": restart["resumed"]["steps_lost"]}
    return out


REQUEUE = """#SBATCH --requeue
#SBATCH --open-mode=append
export HPCML_RUN_ATTEMPT=${SLURM_RESTART_COUNT:-0} MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29400 + SLURM_RESTART_COUNT))
srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec python @TASK@' \\
  || { [ "${SLURM_RESTART_COUNT:-0}" -lt 2 ] && scontrol requeue $SLURM_JOB_ID; }
"""


def srun_requeue(cluster, work: Path) -> dict:
    env = _env(cluster, work, "crash")
    job = _submit(REQUEUE.replace("@TASK@", str(TASK)), work, env, "-N3", "-w", "n[1-3]")
    _wait(job, env)
    return {"tool": "srun + scontrol requeue", "fault": "crash", **_resume_gap(work / "done")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--default-hang", action="store_true", help="also one hang with the default timeout (~2.5 min)")
    args = ap.parse_args()
    from hpcml.testing.localslurm import LocalSlurm
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hpcml-bench-recovery-") as tmp, \
            LocalSlurm(Path("/tmp/hpcml-slurm-recoverybench"), nodes=4, ctld_port=7017,
                       first_slurmd_port=7021) as cluster:
        cases = [("crash", "10s"), ("hang", "10s"), ("requeue", "")] * args.runs
        cases += [("hang", "auto")] if args.default_hang else []
        for i, (fault, timeout) in enumerate(cases):
            work = Path(tmp) / f"{i}-{fault}"
            work.mkdir()
            row = srun_requeue(cluster, work) if fault == "requeue" else hpcml_run(cluster, work, fault, timeout)
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {}
    for key in sorted({(r["tool"], r["fault"], r.get("hang_timeout", "")) for r in rows}):
        sel = [r for r in rows if (r["tool"], r["fault"], r.get("hang_timeout", "")) == key]
        entry: dict = {"runs": len(sel), "resume_s_median": statistics.median(r["resume_s"] for r in sel)}
        if "split_s" in sel[0]:
            entry["split_s_median"] = {k: round(statistics.median(r["split_s"][k] or 0.0 for r in sel), 2)
                                       for k in sel[0]["split_s"]}
        summary[" / ".join(k for k in key if k)] = entry
    print(json.dumps(summary, indent=2))
    out = ROOT / "benchmarks" / "results" / "recovery.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary, "machine": os.uname().nodename,
                               "cpus": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
