"""``hpcml run`` in batch jobs on the real 2-node local cluster (n1, n2).

The bad node is made bad by a test plugin check (tests/plugins/testchecks.py) that reports
a slow value only on n2, so relative vetting marks n2 and the run shrinks to n1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.slurmjobs import job_processes, run_job, submit, wait

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "run" / "train_ddp.py"
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

SLOW_N2 = ("name: slow-n2\nmin_nodes: 1\nevals:\n"
           "  - {name: memory, type: memory, min_available_fraction: 1%}\n"
           "  - {name: speed, type: tests.plugins.testchecks.Value, value: 100, slow_factor: 2,"
           " nodes: [n2], min_relative: 0.8}\n")


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def _report(tmp_path: Path, env) -> dict:
    import subprocess
    p = subprocess.run([sys.executable, "-m", "hpcml", "report", str(tmp_path / "job"), "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_vet_shrinks_to_the_good_node_and_ddp_trains_there(env, tmp_path):
    (tmp_path / "p.yaml").write_text(SLOW_N2)
    out = run_job(f"""#!/bin/bash
hpcml run --vet p.yaml --min-nodes 1 --dir job -- python {EXAMPLE} --data {tmp_path}/data --samples 256 --epochs 1
echo "run-rc=$?"
""", tmp_path, env, timeout=240)
    assert "run-rc=0" in out, out
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["mode"] == "slurm" and run["nodes"] == ["n1"] and run["ntasks"] == 1
    assert list(run["excluded"]) == ["n2"] and run["excluded"]["n2"]
    assert "trained 4 steps on 1 ranks" in (tmp_path / "job" / "logs" / "rank-00000.out").read_text()
    rep = _report(tmp_path, env)
    excluded = next(f for f in rep["findings"] if f["kind"] == "excluded_nodes")
    assert "n2" in excluded["message"] and "speed" in excluded["message"]
    assert rep["observe"]["ranks_with_data"] == 1
    spans = {p["name"]: p for p in run["phases"]}
    assert {"start-up", "prepare", "vet.fan-out", "vet.gather", "rendezvous", "srun step", "watch", "report",
            "ranks started"} <= set(spans)
    # the vetting workers were started before the launcher had prepared its job directory
    assert spans["vet.fan-out"]["start"] < spans["prepare"]["start"] + spans["prepare"]["wall_s"]
    assert spans["ranks started"]["start"] == spans["srun step"]["start"] and spans["ranks started"]["wall_s"] > 0


def test_workers_started_early_are_stopped_when_the_run_does_not_vet(env, tmp_path):
    """--vet's workers start before the protocol is validated: a protocol that does not
    validate ends the run (exit 2, one line) and its workers with it, inside the job."""
    (tmp_path / "p.yaml").write_text(SLOW_N2 + "colour: blue\n")
    out = run_job(f"""#!/bin/bash
hpcml run --vet p.yaml --dir job -- touch {tmp_path}/started
echo "run-rc=$?"
sleep 1
echo "workers: $(python -m tests.slurmjobs $SLURM_JOB_ID hpcml.vet.worker)"
echo "steps: $(squeue -h -s -j $SLURM_JOB_ID | grep -v batch | wc -l)"
""", tmp_path, env, timeout=240)
    assert "run-rc=2" in out and "colour" in out, out
    assert "workers: 0" in out and "steps: 0" in out, out
    assert not (tmp_path / "started").exists()


def test_two_node_ddp_and_a_crashing_rank(env, tmp_path):
    out = run_job(f"""#!/bin/bash
hpcml run --dir job -- python {EXAMPLE} --data {tmp_path}/data --samples 256 --fail-rank 1 --fail-step 1
echo "run-rc=$?"
""", tmp_path, env, timeout=240)
    assert "run-rc=3" in out, out
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["nodes"] == ["n1", "n2"] and run["ntasks"] == 2 and run["launch"][0] == "srun"
    rep = _report(tmp_path, env)
    first = rep["ending"]["first_failure"]
    assert first["rank"] == 1 and first["node"] == "n2" and first["exit_code"] == 3
    assert any("injected failure" in line for line in first["stderr_tail"])


def test_abort_never_starts_the_command(env, tmp_path):
    (tmp_path / "p.yaml").write_text(SLOW_N2.replace("min_nodes: 1", "min_nodes: 2"))
    out = run_job(f"""#!/bin/bash
hpcml run --vet p.yaml --dir job -- touch {tmp_path}/started
echo "run-rc=$?"
""", tmp_path, env, timeout=240)
    assert "run-rc=4" in out, out
    assert not (tmp_path / "started").exists()


HANG = "name: hang\ndeadline: 300 s\nevals:\n  - {name: hang, type: tests.plugins.testchecks.Hang, seconds: 600}\n"


def test_term_while_vetting_ends_the_run_said_so_and_leaves_nothing(env, tmp_path):
    """TERM to the batch step and every step (``scancel --signal=TERM --full``: a pre-emption's
    or the time limit's warning, a site's scancel) while the launcher waits for vetting workers
    whose check hangs: run.json records the TERM and exit 143, the report says the command
    never started (not a launcher killed without a word), nothing ran and no worker is left."""
    import subprocess
    import time
    (tmp_path / "p.yaml").write_text(HANG)
    job = submit(f"#!/bin/bash\nexec hpcml run --vet p.yaml --dir job -- touch {tmp_path}/started\n", tmp_path, env)
    end = time.monotonic() + 120
    while not (tmp_path / "job" / "vet").exists() and time.monotonic() < end:       # vetting began
        time.sleep(0.2)
    assert (tmp_path / "job" / "vet").exists(), (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    time.sleep(1.0)
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=env, timeout=30, check=True)
    wait(job, env, 120)
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["signals_forwarded"] == ["SIGTERM"] and run["exit_code"] == 143 and "launch" not in run, run
    assert not (tmp_path / "started").exists()
    rep = _report(tmp_path, env)
    assert rep["ending"]["before_command"] is True and rep["ending"]["interrupted"] == "SIGTERM"
    assert rep["ending"]["launcher_killed"] is False
    assert "SIGTERM before the command started: no rank ran; exit code 143" in rep["findings"][0]["message"]
    assert not job_processes(job, "hpcml.vet.worker")          # the workers and their forked checks


TRAIN_RESUME = """
import sys, time
import numpy as np
from hpcml import observe
from hpcml.ckpt import Checkpointer
# 30 ms steps: the default lead of 10 steps is 0.3 s, less than the signal's way to each rank
# (hpcml run, srun, the recorder) may take on a loaded 2-core host; 60 steps is 1.8 s
ck = Checkpointer(sys.argv[1], every=1, keep=2, max_write_rate="50 MB/s", requeue=True, stop_lead=60)
state, step = ck.load_latest()
start = 0 if state is None else step
print(f"resumed at {start}", flush=True)
for s in range(start + 1, 401):
    with observe.section("step", step=s):
        time.sleep(0.03)
    observe.log(step=s, loss=1.0 / s)
    ck.maybe_save({"step": s, "w": np.full(12800, float(s))}, s)
    if ck.stopping:
        print(f"stopped at {s} ({ck.stop_signal})", flush=True)
        sys.exit(0)
ck.wait()
print("done at 400", flush=True)
"""


def test_usr1_warning_checkpoints_requeues_and_the_job_resumes(env, tmp_path):
    """The pre-emption pattern end to end: the batch script ``exec``s hpcml run, so the
    batch-shell signal (``--signal=B:USR1@T``; here ``scancel --signal=USR1 --batch``) goes
    to hpcml run, which passes it to srun, which passes it to every task's recorder, which
    passes it to the training process. Its Checkpointer saves, requeues the job and exits 0;
    the requeued job starts again from the top, continues in the same job directory as
    attempt 1 and resumes at the saved step on both ranks. The record and the report say
    "checkpointed at step N and requeued", not a crash; both attempts' records survive, the
    first attempt's logs too, and the time between the attempts is a requeue, not a stall."""
    import subprocess
    import time
    (tmp_path / "train.py").write_text(TRAIN_RESUME)
    script = f"""#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
echo "start ${{SLURM_RESTART_COUNT:-0}}"
exec hpcml run --no-report --dir job -- python {tmp_path}/train.py ckpt
"""
    job = submit(script, tmp_path, env)
    def saved() -> int:
        return max((int(p.name.split("-")[1]) for p in tmp_path.glob("ckpt/step-*")), default=0)
    end = time.monotonic() + 120          # trained long enough that the requeue's gap is not most of the job
    while time.monotonic() < end and saved() < 120:
        time.sleep(0.2)
    assert saved() >= 120, (tmp_path / "job.out").read_text()
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=env, check=True, timeout=30)
    wait(job, env, timeout=360)
    out = (tmp_path / "job.out").read_text()
    assert "start 0" in out and "start 1" in out, out             # the first attempt's batch log survived
    assert "crash:" not in out, out                               # the requeue's TERM stopped the ranks
    logs = [(tmp_path / "job" / "logs" / f"rank-{r:05d}.out").read_text() for r in range(2)]
    split = [log.partition("--- hpcml run: attempt 1, ") for log in logs]
    assert all(sep for _, sep, _ in split), logs                  # one log per rank, both attempts in it
    stopped = {int(line.split()[2]) for first, _, _ in split for line in first.splitlines()
               if line.startswith("stopped at")}
    # every rank gets USR1 from srun; one may learn of the stop from its peer first ("peer")
    assert len(stopped) == 1 and any("(SIGUSR1)" in first for first, _, _ in split), logs
    assert all("(SIGUSR1)" in first or "(peer)" in first for first, _, _ in split), logs
    at = next(iter(stopped))
    assert at > 0 and all(f"resumed at {at}" in second and "done at 400" in second for _, _, second in split), logs
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["attempt"] == 1 and run["exit_code"] == 0 and run["requeued"] is None, run
    first = run["attempts"][0]
    assert first["attempt"] == 0 and first["exit_code"] == 0 and first["first_failure"] is None, first
    assert first["requeued"]["by"] == "hpcml ckpt" and first["requeued"]["step"] == at, first
    assert first.get("end_recorded_by_next_attempt") or first["signals_forwarded"][0] == "SIGUSR1", first
    for store in (tmp_path / "job" / "observe", tmp_path / "job" / "attempts" / "1" / "observe"):
        assert sorted(p.name for p in store.glob("rank-*.arrows")) == ["rank-00000.arrows", "rank-00001.arrows"]
    rep = _report(tmp_path, env)
    kinds = [f["kind"] for f in rep["findings"]]
    requeued = next(f for f in rep["findings"] if f["kind"] == "requeued")
    assert f"attempt 0 checkpointed at step {at} and requeued (SIGUSR1)" in requeued["message"], rep["findings"]
    assert "failed_rank" not in kinds and "job_stall" not in kinds, rep["findings"]
    assert not any("job_stall" == f["kind"] for a in rep["attempts"] for f in a["observe"]["findings"])
    assert rep["attempts"][0]["requeue_gap_s"] > 0 and rep["ending"]["exit_code"] == 0
    assert rep["observe"]["ranks_with_data"] == 2 and rep["attempts"][0]["observe"]["ranks_with_data"] == 2


def test_under_salloc_every_rank_gets_the_port_found_free_on_rank_0s_node(env, tmp_path):
    """Under salloc the launcher runs off the allocation's nodes: rank 0's port is the one
    n1's vetting worker found free there (no step of its own), and every rank gets that one
    port."""
    import subprocess
    (tmp_path / "p.yaml").write_text("name: mem\nevals:\n  - {name: memory, type: memory, min_available_fraction: 1%}\n")
    show = "import os; print(os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], os.environ['RANK'])"
    p = subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "hpcml", "run", "--vet", "p.yaml",
                        "--dir", "job", "--no-report", "--", sys.executable, "-c", show],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    addr, port = run["master"].rsplit(":", 1)
    seen = sorted((tmp_path / "job" / "logs" / f"rank-0000{r}.out").read_text().split() for r in (0, 1))
    assert seen == [[addr, port, "0"], [addr, port, "1"]] and addr == "n1"
