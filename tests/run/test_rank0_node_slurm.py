"""MASTER_ADDR is the node Slurm gives rank 0, on a cluster whose slurm.conf does not list
its nodes alphabetically (n2 before n1).

srun numbers a step's nodes in slurmctld's node-table order, and SLURM_JOB_NODELIST lists
them in it: slurm.conf's order up to Slurm 21.08, the names' natural order from 22.05 on
(unless a topology plugin ranks the nodes, or for dynamic nodes). Whichever it is, rank 0's
node must be MASTER_ADDR and the run's nodes must be in the job's order.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcml.cluster.hostlist import expand
from hpcml.testing.localslurm import LocalSlurm
from tests.slurmjobs import own_cluster, submit, wait

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
SHOW = ("import os; print('rank', os.environ['RANK'], 'on', os.environ['SLURMD_NODENAME'], "
        "'master', os.environ['MASTER_ADDR'])")


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[LocalSlurm]:
    """n2 then n1 in slurm.conf, on a root and ports of their own (the suite's, shifted)."""
    with own_cluster("order", 60, node_names=["n2", "n1"]) as c:
        yield c


def test_master_addr_is_rank_0s_node_in_slurm_conf_order(cluster, tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = {**cluster.client_env(base), "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{base['PATH']}"}
    job = submit(f'#!/bin/bash\necho "nodelist=$SLURM_JOB_NODELIST"\n'
                 f'hpcml run --no-report --hang-timeout off --dir job -- python -c "{SHOW}"\necho run-rc=$?\n',
                 tmp_path, env, nodes=2)
    wait(job, env, timeout=180)
    out = (tmp_path / "job.out").read_text()
    assert "run-rc=0" in out, out
    order = expand(out.split("nodelist=", 1)[1].split()[0])           # Slurm's order, as Slurm says it
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["nodes"] == order and run["master"].startswith(f"{order[0]}:"), (order, run)
    logs = tmp_path / "job" / "logs"
    assert f"rank 0 on {order[0]} master {order[0]}" in (logs / "rank-00000.out").read_text()
    assert f"rank 1 on {order[1]} master {order[0]}" in (logs / "rank-00001.out").read_text()
