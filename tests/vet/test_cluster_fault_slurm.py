"""The cluster's faults are not the nodes' (issue 72), on a real Slurm cluster of its own
(4 nodes, its own root and ports: the suite's cluster stays sound): inside a 4-node
allocation, three nodes' slurmd are killed before ``hpcml vet`` starts its step, so srun
cannot launch on them ("Communication connection failure") and, as Slurm does, ends the
whole step: no node gives a result. hpcml retries with backoff, then fails closed in one
line, exit 1: no node is judged bad, no bad-nodes file names them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpcml.testing.localslurm import LocalSlurm
from tests.slurmjobs import own_cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[LocalSlurm]:
    with own_cluster("clusterfault", 90, nodes=4) as c:
        yield c


def test_most_nodes_failing_for_one_slurm_reason_fails_closed(cluster, tmp_path):
    env = {**cluster.client_env(), "PYTHONPATH": str(ROOT / "src"), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    script = (f"touch ready; while [ ! -f go ]; do sleep 0.1; done; "
              f"{sys.executable} -m hpcml vet {ROOT}/examples/vet/cpu.yaml --out vet; echo vet-rc=$? > rc")
    p = subprocess.Popen(["salloc", "-N4", "--no-kill", "--ntasks-per-node=1", "bash", "-c", script], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < end and p.poll() is None, "no allocation"
            time.sleep(0.1)
        killed = []
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd and os.path.basename(cmd[0]) == "slurmd" and str(cluster.conf) in cmd \
                    and any(n in cmd for n in ("n2", "n3", "n4")):
                proc.kill()
                killed.append(proc.pid)
        assert len(killed) == 3, killed
        (tmp_path / "go").touch()
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert (tmp_path / "rc").read_text().strip() == "vet-rc=1", out + err
    lines = [ln for ln in err.splitlines() if ln.startswith("hpcml vet")]
    fault = [ln for ln in lines if "the cluster failed, not the nodes" in ln]
    assert len(fault) == 1 and "4 of 4 nodes gave no result" in fault[0] and "no node is judged" in fault[0], err
    assert "Communication connection failure" in fault[0] and "still after 1 retry" in fault[0], err
    assert any("the nodes without a result again in 5 s" in ln for ln in lines), err
    assert not (tmp_path / "vet" / "bad-nodes").exists() or not (tmp_path / "vet" / "bad-nodes").read_text().strip()
