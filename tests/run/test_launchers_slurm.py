"""torchrun under ``hpcml run`` on the real 2-node local cluster: one torchrun per node
(``hpcml run`` starts one task per node), 2 workers each, the rendezvous hpcml gives
(``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``/``PORT``: the launch line says
none). Every worker is a rank of the watch: 4 ranks, each with its steps, on its node; a
worker stuck on the second node is named at the timeout and the job stopped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hpcml.observe.beat import read_beats
from hpcml.run.watch import HANG
from tests.run.test_inject_progress import SCRIPT, step_sections
from tests.slurmjobs import run_job

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.torch]
TORCHRUN = f"{Path(sys.executable).parent / 'torchrun'} --nproc-per-node 2 {SCRIPT}"


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def test_one_torchrun_per_node_two_workers_each_are_four_ranks(env, tmp_path):
    out = run_job(f"""#!/bin/bash
export STEPS=5 ACCUM=1 STEP_S=0.05 OMP_NUM_THREADS=1
hpcml run --dir job --no-report -- {TORCHRUN}
echo "run-rc=$?"
""", tmp_path, env, timeout=300)
    assert "run-rc=0" in out, out
    job = tmp_path / "job"
    run = json.loads((job / "run.json").read_text())
    assert (run["nodes"], run["ntasks"], run["world"], run["rank_launcher"]) == (["n1", "n2"], 2, 4, "torchrun")
    beats = read_beats(job / "observe")
    assert {r: (b.node, b.step, b.exit) for r, b in beats.items()} == {
        0: ("n1", 5, 0), 1: ("n1", 5, 0), 2: ("n2", 5, 0), 3: ("n2", 5, 0)}
    assert step_sections(job) == {r: list(range(1, 6)) for r in range(4)}
    for rank in range(4):                        # the script's own word: a world of 4
        assert f"rank {rank}: 5 optimizer steps" in (job / "logs" / f"rank-{rank:05d}.out").read_text()
    said = (job / "logs" / "launcher-00001.err").read_text()
    assert "PET_NNODES=2" in said and "PET_NODE_RANK=1" in said and "PET_MASTER_PORT=" in said


def test_a_stuck_worker_on_the_second_node_is_named_and_the_job_stopped(env, tmp_path):
    out = run_job(f"""#!/bin/bash
export STEPS=1000 STUCK_RANK=3 STUCK_AFTER=4 STEP_S=0.05 OMP_NUM_THREADS=1
hpcml run --dir job --no-report --hang-timeout 5s --kill-grace 3 -- {TORCHRUN}
echo "run-rc=$?"
""", tmp_path, env, timeout=300)
    assert f"run-rc={HANG}" in out, out
    hang = json.loads((tmp_path / "job" / "run.json").read_text())["hang"]
    culprits = hang["verdict"]["culprits"]
    assert [(c["rank"], c["node"]) for c in culprits] == [(3, "n2")], hang
    assert hang["action"] == "stop" and sorted(hang["verdict"]["blocked"]) == [0, 1, 2]
