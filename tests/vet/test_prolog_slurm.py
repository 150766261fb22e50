"""`hpcml vet --prolog` as a real Slurm Prolog on the local cluster: a bad node is drained.

The cluster's prolog.sh runs ``ROOT/prolog/enabled`` only while this test has written it,
so other tests' jobs are unaffected. The protocol's env check expects SLURMD_NODENAME=n1,
which only n1's prolog has: n2 must end drained with hpcml's reason, the job requeued
without running on n2, and n1 still in service.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.testing.localslurm import LocalSlurm

BUDGET = 5.0
PROTOCOL = """\
name: prolog-test
evals:
  - name: memory
    type: memory
    min_available_fraction: 1%
  - name: on-n1
    type: env
    expected: {SLURMD_NODENAME: n1}
"""


def run(argv: list[str], env: dict[str, str], check: bool = True) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=15)
    assert not check or proc.returncode == 0, f"{argv}: exit {proc.returncode}: {proc.stderr}"
    return proc.stdout


def node(name: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show node`` as key=value pairs (Reason= runs to the end of its line)."""
    out = run(["scontrol", "show", "node", name], env)
    fields = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            fields["Reason"] = line[len("Reason="):]
            continue
        for word in line.split():
            key, _, value = word.partition("=")
            fields[key] = value
    return fields


def wait_for(what: str, probe, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not seen within {timeout:g} s: {what}")


@pytest.mark.slurm
def test_prolog_drains_the_bad_node_and_requeues_the_job(
        slurm_cluster: LocalSlurm, slurm_env: dict[str, str], tmp_path: Path) -> None:
    slurm_cluster.wait_idle(20)
    proto = tmp_path / "prolog.yaml"
    proto.write_text(PROTOCOL)
    log, err = slurm_cluster.prolog_dir / "hpcml.jsonl", slurm_cluster.prolog_dir / "hpcml.err"
    for path in (log, err):
        path.unlink(missing_ok=True)
    marker = slurm_cluster.prolog_dir / "enabled"
    # Slurm gives the prolog no PATH: the interpreter is named by absolute path
    marker.write_text(f"exec {sys.executable} -m hpcml vet --prolog --drain --budget {BUDGET:g} "
                      f"{proto} --json >>{log} 2>>{err}\n")
    out = tmp_path / "job.out"
    job = ""
    try:
        job = run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "-o", str(out),
                   "--wrap", "srun sh -c 'echo ran-on-$SLURMD_NODENAME'"], slurm_env).strip()
        n2 = wait_for("n2 drained", lambda: (s := node("n2", slurm_env))["State"].find("DRAIN") >= 0
                      and s)
        records = wait_for("both prolog records", lambda: len(lines := log.read_text().splitlines()) >= 2
                           and [json.loads(x) for x in lines] if log.exists() else None, 15)
        by_node = {r["node"]: r for r in records}
        assert set(by_node) == {"n1", "n2"}, records
        assert by_node["n1"]["healthy"] and by_node["n1"]["exit_code"] == 0
        bad = by_node["n2"]
        assert not bad["healthy"] and bad["exit_code"] == 1 and bad["job_id"] == job
        assert bad["bad"] == ["on-n1: SLURMD_NODENAME='n2', expected 'n1'"]
        # the node carries hpcml's reason, not Slurm's generic "Prolog error"
        assert bad["drained"] and n2["Reason"].startswith("hpcml: on-n1: SLURMD_NODENAME='n2'"), n2
        # generous bound only: the budget is what the mode enforces
        assert all(r["duration"] < BUDGET for r in records), records
        print(f"prolog durations: n1 {by_node['n1']['duration']} s, n2 {bad['duration']} s")
        state, reason = wait_for("job requeued", lambda: (q := run(
            ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T|%r"], slurm_env).strip())
            .startswith("PENDING|") and q.split("|"))
        assert "requeued" in reason or "held" in reason.lower(), reason
        # Slurm 22.05 starts the batch script once the batch host's prolog is done, so the
        # job may begin on n1 before n2's prolog fails; it never runs on n2
        assert not out.exists() or "ran-on-n2" not in out.read_text()
        assert "DRAIN" not in node("n1", slurm_env)["State"]
    finally:
        marker.unlink(missing_ok=True)
        if job:
            run(["scancel", job], slurm_env, check=False)
        run(["scontrol", "update", "nodename=n2", "state=resume"], slurm_env, check=False)
        slurm_cluster.wait_idle(20)
