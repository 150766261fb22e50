"""``hpcml run`` owns its ranks under srun too: TERM, then SIGKILL after --kill-grace,
through srun's own signal handling (two INTs in a row kill the step), on the real 2-node
local cluster. The task's processes are found afterwards by their marker, on this host
(both virtual nodes run here)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.run.test_ownership import lines, nothing_left, rank_script
from tests.slurmjobs import run_job, wait

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


@pytest.mark.parametrize("sig,trap_term", [("TERM", True), ("TERM", False), ("INT", False)],
                         ids=["term-ranks-trap-it", "term-bash-ranks-with-a-child", "int-bash-ranks-with-a-child"])
def test_term_or_int_to_hpcml_run_under_srun_stops_every_rank_and_child(env, tmp_path, sig, trap_term):
    """srun alone would kill the step at once on TERM (no time to checkpoint) and only print
    its status on one INT; through hpcml run every rank gets the signal, and SIGKILL after
    --kill-grace. Started with ``&`` in the batch script, so INT comes in ignored."""
    marker, marks = f"hpcml-test-{uuid.uuid4().hex}", tmp_path / "marks"
    rank = " ".join(map(shlex.quote, rank_script(marks, marker, trap_term)))
    out = run_job(f"""#!/bin/bash
hpcml run --kill-grace 2 --dir job --no-report -- {rank} &
P=$!
for i in $(seq 1200); do [ "$(grep -c '^start-' {marks} 2>/dev/null)" = 2 ] && break; sleep 0.1; done
kill -{sig} $P
wait $P
echo "run-rc=$?"
""", tmp_path, env, timeout=240)
    nothing_left(marker, marks)
    assert lines(marks, "start-0") == 1 and lines(marks, "start-1") == 1, out
    assert "run-rc=0" not in out and "run-rc=" in out, out
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["mode"] == "slurm" and run["signals_forwarded"] == [f"SIG{sig}"], run
    if trap_term:
        assert lines(marks, "term-0") >= 1 and lines(marks, "term-1") >= 1, out
        assert run["killed_after_grace"] is True, out


def test_kill_9_of_hpcml_run_under_srun_ends_its_step(env, tmp_path):
    marker, marks = f"hpcml-test-{uuid.uuid4().hex}", tmp_path / "marks"
    rank = " ".join(map(shlex.quote, rank_script(marks, marker, True)))
    out = run_job(f"""#!/bin/bash
hpcml run --dir job --no-report -- {rank} &
P=$!
for i in $(seq 1200); do [ "$(grep -c '^start-' {marks} 2>/dev/null)" = 2 ] && break; sleep 0.1; done
kill -9 $P
wait $P
echo "run-rc=$?"
for i in $(seq 600); do squeue -h -s -j $SLURM_JOB_ID -o %j | grep -q hpcml-run || break; sleep 0.1; done
squeue -h -s -j $SLURM_JOB_ID -o "step-left %j"
""", tmp_path, env, timeout=240)
    assert "run-rc=137" in out and "step-left hpcml-run" not in out, out
    nothing_left(marker, marks)


def test_overwrite_never_replaces_a_job_running_on_another_host(env, tmp_path):
    """A job directory on a shared filesystem whose ``hpcml run`` runs on a compute node:
    ``--overwrite`` from a login node cannot see that pid, so it asks Slurm for the job's
    state; while the job runs the directory is refused, once it ended it is replaced.
    run.json is written as a launcher on another host would (its host named otherwise)."""
    job_id = subprocess.run(["sbatch", "--parsable", "--nodes=1", f"--output={tmp_path}/slurm.out",
                             "--wrap", "sleep 300"], capture_output=True, text=True, env=env,
                            timeout=30, check=True).stdout.strip().split(";")[0]
    d = tmp_path / "job"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({
        "schema": "hpcml.run/1", "command": ["python", "train.py"], "mode": "slurm", "job_id": job_id,
        "launcher": {"pid": 4242, "host": "compute-node-elsewhere", "created": 1.0}, "ended": None}))
    (d / "logs").mkdir()
    (d / "logs" / "rank-00000.out").write_text("the running job's log\n")
    client = {k: v for k, v in env.items() if k != "SLURM_JOB_ID"}

    def overwrite() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hpcml", "run", "--dir", str(d), "--overwrite", "--no-report",
                               "--", "true"], capture_output=True, text=True, env=client, timeout=120)
    try:
        p = overwrite()
        assert p.returncode == 2 and f"Slurm job {job_id}" in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert (d / "logs" / "rank-00000.out").read_text() == "the running job's log\n"
    finally:
        subprocess.run(["scancel", job_id], env=env, timeout=30)
    wait(job_id, env)
    p = overwrite()
    assert p.returncode == 0, p.stderr
    assert json.loads((d / "run.json").read_text())["command"] == ["true"]
