"""``hpcml run --max-restarts`` in batch jobs on a 3-node local cluster of its own (n1..n3),
so that a spare exists and a node can be lost without touching the suite's cluster.

Faults are the training script's own (tests/run/resumable_ddp.py: a rank that hangs or
crashes on a chosen node) or real (a node's slurmd killed). What the user's script did is
counted from the file it appends to; the final weights are compared bitwise with a
fault-free run's; no process of the script may be left when the job has ended.
"""

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
from tests.run.test_recovery_local import RESUMABLE, no_process_left, reference, same_weights, steps_done, training
from tests.slurmjobs import submit, wait

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.torch]
__all__ = ["reference"]          # the fault-free run's weights, a fixture shared with the local tests

# fails vetting on every node but n1: the "bad" node n2 fails it again after its fault
ONLY_N1 = "name: only-n1\nevals:\n  - {name: on-n1, type: env, expected: {SLURMD_NODENAME: n1}}\n"


def recovery_cluster(shift: int, suffix: str) -> Iterator[LocalSlurm]:
    """A 3-node cluster of its own: root and ports the suite's cluster's, shifted; SlurmdTimeout
    and MessageTimeout of 5 s so a lost node is declared within ~8 s (~20 s with the 10 s
    default MessageTimeout: the controller's ping of a dead slurmd waits that long)."""
    port = int(os.environ.get("HPCML_SLURM_PORT", "6917")) + shift
    root = Path(os.environ.get("HPCML_SLURM_ROOT", "/tmp/hpcml-slurm") + suffix)
    c = LocalSlurm(root, nodes=3, ctld_port=port, first_slurmd_port=port + 4,
                   extra_conf="SlurmdTimeout=5\nMessageTimeout=5")
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[LocalSlurm]:
    yield from recovery_cluster(80, "-recovery")


@pytest.fixture
def env(cluster) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**cluster.client_env(base), "PYTHONPATH": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}:{base['PATH']}"}


def sbatch(tmp: Path, env: dict[str, str], script: str, nodes: int, *flags: str) -> str:
    return submit("#!/bin/bash\n" + script + "\necho run-rc=$?\n", tmp, env, nodes=nodes, extra=flags)


def finished(job: str, env: dict[str, str], tmp: Path) -> tuple[str, dict]:
    """The batch job has ended with hpcml run's exit 0: its output and run.json."""
    wait(job, env, timeout=300)
    out = (tmp / "job.out").read_text()
    assert "run-rc=0" in out, out
    return out, json.loads((tmp / "job" / "run.json").read_text())


def exports(values: dict[str, str]) -> str:
    return "".join(f"export {k}={v}\n" for k, v in values.items())


def gone(marker: str, cwd: Path, timeout: float = 30.0) -> list[str]:
    end = time.monotonic() + timeout
    while (left := no_process_left(marker, cwd)) and time.monotonic() < end:
        time.sleep(0.5)
    return left


def test_a_hung_rank_is_replaced_by_a_spare_and_training_ends_bitwise(cluster, env, tmp_path, reference):
    (tmp_path / "pass.yaml").write_text("name: quick\nevals:\n  - {name: memory, type: memory, "
                                        "min_available_fraction: 1%}\n")
    job = sbatch(tmp_path, env, exports(training(tmp_path, "job", FAULT="hang", FAULT_NODE="n2"))
                 + f"hpcml run --vet pass.yaml --max-restarts 2 --spare-nodes 1 --hang-timeout 5 --kill-grace 3 "
                   f"--dir job -- python {RESUMABLE}", 3, "-w", "n[1-3]")
    out, run = finished(job, env, tmp_path)
    assert "culprit rank 1 on n2" in out and "vetting n2 again" in out
    assert same_weights(reference, tmp_path / "job.pt")
    first, restart = run["attempts"][0], run["attempts"][0]["restart"]
    assert first["nodes"] == ["n1", "n2"] and run["nodes"] == ["n1", "n3"]
    assert restart["fault"]["kind"] == "hang" and restart["fault"]["nodes"] == ["n2"]
    assert restart["revet"]["passed"] == ["n2"] and restart["spares"] == ["n2"]   # cleared: the next spare
    resumed = restart["resumed"]["step"]
    done = steps_done(tmp_path / "job.done")
    assert {s for r, s in done[1] if r == 1} == set(range(resumed + 1, 50))
    assert {s for r, s in done[0] if r == 1} == set(range(30))
    assert gone(str(RESUMABLE), tmp_path) == []
    # the centre's summary: the hang the restart recovered still counts, its culprit named
    summary = _summary(tmp_path, 1)
    assert summary["outcome"] == "completed" and summary["hangs"] == 1
    assert [(c["node"], c["attempt"]) for c in summary["culprits"]] == [("n2", 0)]
    assert summary["crashed"] == [] and summary["lost"] == []


def _summary(tmp: Path, attempt: int) -> dict:
    return json.loads((tmp / "job" / "summary" / f"attempt-{attempt}.json").read_text())


def test_a_crashing_node_that_fails_vetting_again_is_left_out_and_the_job_shrinks(cluster, env, tmp_path):
    (tmp_path / "only-n1.yaml").write_text(ONLY_N1)
    job = sbatch(tmp_path, env, exports(training(tmp_path, "job", FAULT="crash", FAULT_NODE="n2"))
                 + f"hpcml run --max-restarts 1 --min-nodes 1 --revet only-n1.yaml --kill-grace 3 --dir job "
                   f"-- python {RESUMABLE}", 2, "-w", "n[1-2]")
    _, run = finished(job, env, tmp_path)
    restart = run["attempts"][0]["restart"]
    assert restart["fault"]["kind"] == "crash" and "injected crash at step 30" in restart["fault"]["what"]
    assert restart["revet"]["passed"] == [] and "failed vetting" in run["excluded"]["n2"][0]
    assert run["nodes"] == ["n1"] and run["ntasks"] == 1
    resumed = restart["resumed"]["step"]
    done = steps_done(tmp_path / "job.done")
    assert {s for r, s in done[1]} == set(range(resumed + 1, 50)) and {r for r, _ in done[1]} == {0}
    assert gone(str(RESUMABLE), tmp_path) == []
    summary = _summary(tmp_path, 1)        # crashed there, then excluded by vetting: both, distinct
    assert [(c["node"], c["attempt"]) for c in summary["crashed"]] == [("n2", 0)]
    assert [e["node"] for e in summary["excluded"]] == ["n2"] and summary["hangs"] == 0


def test_a_node_whose_slurmd_dies_is_left_out_and_the_job_goes_on(cluster, env, tmp_path):
    """Last in this module: n2 stays down until the module's cluster stops."""
    # slow until the fault (Slurm takes ~20 s to call a node lost here), quick after it
    slow = training(tmp_path, "job", STEPS="400", STEP_S="0.2", STEP_S_AFTER="0.01")
    job = sbatch(tmp_path, env, exports(slow) + f"hpcml run --max-restarts 1 --spare-nodes 1 --kill-grace 3 "
                 f"--dir job -- python {RESUMABLE}", 3, "--no-kill", "-w", "n[1-3]")
    done = tmp_path / "job.done"
    end = time.monotonic() + 120
    while time.monotonic() < end and not (done.exists() and len(done.read_text().splitlines()) >= 40):
        time.sleep(0.2)
    slurmd = [p for p in psutil.process_iter(["cmdline"]) if (cmd := p.info["cmdline"] or [])
              and os.path.basename(cmd[0]) == "slurmd" and "n2" in cmd and str(cluster.conf) in cmd]
    assert len(slurmd) == 1
    slurmd[0].kill()
    out, run = finished(job, env, tmp_path)
    restart = run["attempts"][0]["restart"]
    assert restart["fault"]["kind"] == "node" and restart["fault"]["nodes"] == ["n2"], out
    # timed from the node's last sign of life (its rank's last record) where that came before
    # Slurm's mark; here only slurmd dies, its rank beats on until the job is stopped
    fault = restart["fault"]
    assert fault["began"] <= fault["detected"], fault
    assert run["nodes"] == ["n1", "n3"] and "n2" in run["excluded"]
    resumed = restart["resumed"]["step"]
    steps = steps_done(done)
    assert {s for r, s in steps[1] if r == 1} == set(range(resumed + 1, 400))
    summary = _summary(tmp_path, 1)        # lost, not also excluded, nor crashed
    assert [e["node"] for e in summary["lost"]] == ["n2"]
    assert summary["excluded"] == [] and summary["crashed"] == []
