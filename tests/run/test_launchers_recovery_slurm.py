"""A lost node under torchrun: ``hpcml run --max-restarts 1 --spare-nodes 1 -- torchrun
--nproc-per-node 2 ...`` on a 3-node local cluster of its own (n1..n3; the recovery tests'
settings: SlurmdTimeout and MessageTimeout of 5 s), one torchrun per node, 2 workers each.
n2's slurmd is killed mid-training: hpcml names the node lost, restarts the whole launch
on n1 and the spare n3, and every worker of the new world (4 ranks) resumes from the
checkpoint. Proven by the script's own step ledger (tests/run/resumable_ddp.py appends each
step a rank completed) and by no process of it left."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpcml.testing.localslurm import LocalSlurm
from tests.run.test_recovery_local import RESUMABLE, steps_done, training
from tests.run.test_recovery_slurm import env, exports, gone, recovery_cluster, sbatch
from tests.slurmjobs import wait

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
__all__ = ["env"]          # the recovery tests' fixture, for this cluster


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[LocalSlurm]:
    yield from recovery_cluster(120, "-launchers")


def test_a_lost_node_under_torchrun_is_replaced_and_every_worker_resumes(cluster, env, tmp_path):
    slow = training(tmp_path, "job", STEPS="300", STEP_S="0.2", STEP_S_AFTER="0.01", OMP_NUM_THREADS="1")
    torchrun = Path(sys.executable).parent / "torchrun"
    job = sbatch(tmp_path, env, exports(slow) + f"hpcml run --max-restarts 1 --spare-nodes 1 --kill-grace 3 "
                 f"--dir job -- {torchrun} --nproc-per-node 2 {RESUMABLE}", 3, "--no-kill", "-w", "n[1-3]")
    done = tmp_path / "job.done"
    end = time.monotonic() + 180
    while time.monotonic() < end and not (done.exists() and len(done.read_text().splitlines()) >= 60):
        time.sleep(0.2)
    slurmd = [p for p in psutil.process_iter(["cmdline"]) if (cmd := p.info["cmdline"] or [])
              and os.path.basename(cmd[0]) == "slurmd" and "n2" in cmd and str(cluster.conf) in cmd]
    assert len(slurmd) == 1, "the job never trained 15 steps on its 4 ranks"
    slurmd[0].kill()
    wait(job, env, timeout=300)
    out = (tmp_path / "job.out").read_text()
    assert "run-rc=0" in out, out
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    restart = run["attempts"][0]["restart"]
    assert restart["fault"]["kind"] == "node" and restart["fault"]["nodes"] == ["n2"], out
    assert run["nodes"] == ["n1", "n3"] and (run["world"], run["rank_launcher"]) == (4, "torchrun")
    resumed = restart["resumed"]["step"]
    steps = steps_done(done)
    assert {r for r, _ in steps[0]} == {0, 1, 2, 3}                 # every worker trained before the fault
    for rank in range(4):                                            # and every one of the new world after it
        assert {s for r, s in steps[1] if r == rank} == set(range(resumed + 1, 300)), rank
    assert not gone(str(RESUMABLE), tmp_path)
