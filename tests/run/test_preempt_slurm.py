"""A job preempted by another is told as a preemption: a 1-node cluster of its own whose
``high`` partition (PriorityTier 2) preempts ``debug`` jobs (``PreemptType=
preempt/partition_prio``, ``PreemptMode=CANCEL``, as a site's scavenger queue is set up).
``hpcml run`` in a ``debug`` batch job gets Slurm's TERM when a ``high`` job takes the node,
asks Slurm's state for it, keeps it in run.json and says it in the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurmjobs import own_cluster, submit, wait

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm]
SLEEPER = "import time\nfor _ in range(600):\n    time.sleep(1)\n"
PREEMPTION = ("PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n"
              "PartitionName=high Nodes=n1 PriorityTier=2 MaxTime=INFINITE State=UP")


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator:
    with own_cluster("preempt", 40, nodes=1, extra_conf=PREEMPTION) as c:
        yield c


@pytest.fixture
def env(cluster) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**cluster.client_env(base), "PYTHONPATH": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}:{base['PATH']}"}


def test_a_preempted_job_is_told_as_a_preemption(env, tmp_path):
    low, high = tmp_path / "low", tmp_path / "high"
    low.mkdir()
    high.mkdir()
    (low / "sleeper.py").write_text(SLEEPER)
    job = submit(f"#!/bin/bash\nexec hpcml run --no-report --dir job -- python {low}/sleeper.py\n", low, env,
                 nodes=1, extra=("-p", "debug"))
    end = time.monotonic() + 60
    while time.monotonic() < end and not (low / "job" / "run.json").exists():
        time.sleep(0.2)
    time.sleep(2)
    taker = submit("#!/bin/bash\nsleep 2\n", high, env, nodes=1, extra=("-p", "high", "--exclusive"))
    wait(job, env, timeout=120)
    wait(taker, env, timeout=120)
    run = json.loads((low / "job" / "run.json").read_text())
    assert run["ended"] is not None and run["signalled_at"] is not None, run
    assert run["slurm_state"] == "PREEMPTED", run
    p = subprocess.run([sys.executable, "-m", "hpcml", "report", str(low / "job"), "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    told = [f for f in rep["findings"] if f["kind"] == "interrupted"]
    assert told and "preemption by another job" in told[0]["message"], rep["findings"]
