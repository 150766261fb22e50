"""The centre's avoid list on the real 2-node local cluster (n1, n2): n2 was named a hang
culprit by proven jobs of two users, so the next ``hpcml run --vet auto --collector`` takes
it out, says why, and the command runs on n1; with ``--time`` the model prices vetting by
the time Slurm gives the job."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hpcml.centre.collector.store import open_store
from tests.run.test_summary import TOKEN, Collector
from tests.run.test_vet_auto import _hurt
from tests.slurmjobs import submit, wait

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm


def test_an_avoided_node_is_left_out_and_the_job_runs_on_the_other(slurm_env, tmp_path):
    env = {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}",
           "HPCML_VET_TOKEN": TOKEN}
    c = Collector(tmp_path)
    store = open_store(f"sqlite:///{c.db}")
    try:
        _hurt(store, "n2", ["alice", "bob"], time.time())
    finally:
        store.close()
    c.start()
    try:
        job = submit(f"""#!/bin/bash
hpcml run --vet auto --collector {c.url} --min-nodes 1 --no-report --hang-timeout off --dir job -- \\
  python -c "import os; print('ran on', os.environ['SLURMD_NODENAME'])"
echo "run-rc=$?"
""", tmp_path, env, nodes=2, extra=("--time=30",))
        wait(job, env, timeout=240)
    finally:
        c.stop()
    out = (tmp_path / "job.out").read_text()
    assert "run-rc=0" in out, out
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["nodes"] == ["n1"] and run["vet"]["avoided"] == ["n2"], run
    why = run["vet"]["reasons"]["n2"][0]
    assert why.startswith("avoided: named a hang culprit or straggler by proven jobs of 2 users (2 jobs)")
    # advice, not a verdict: not bad, not excluded, so the centre counts this job against no node
    assert "n2" not in run["vet"]["bad"] and "n2" not in run.get("excluded", {})
    auto = run["vet"]["auto"]
    assert auto["nodes"] == 2 and auto["hours_source"].startswith("Slurm") and 0.4 < auto["hours"] <= 0.5
    assert auto["chosen"] == "none" and run["vet"]["decision"] == "skipped"     # 2 nodes for half an hour
    assert "ran on n1" in (tmp_path / "job" / "logs" / "rank-00000.out").read_text()
    import subprocess
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", str(tmp_path / "job"), "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert rep.returncode == 0, rep.stderr
    avoided = next(f for f in json.loads(rep.stdout)["findings"] if f["kind"] == "avoided_nodes")
    assert "left out 1 node: n2: avoided" in avoided["message"]
    text = subprocess.run([sys.executable, "-m", "hpcml", "report", str(tmp_path / "job")],
                          capture_output=True, text=True, env=env, timeout=120).stdout
    assert "vet: skipped, 1 good, 0 bad" in text and "vet auto: none (2 nodes" in text
