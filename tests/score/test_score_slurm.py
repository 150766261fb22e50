"""``srun hpcml score record`` on the real 2-node local cluster, 2 tasks per node that all
see both GPUs of their node (as with SLURM_STEP_GPUS): every GPU is recorded once, by one
task of its node. DCGM cannot exist here (no GPU): the tasks use the recorded-data fake of
DCGM's bindings (tests/score/fake_dcgm), found through DCGM_HOME like a real install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurmjobs import run_job

ROOT = Path(__file__).parents[2]
FAKE = ROOT / "tests" / "score" / "fake_dcgm"
pytestmark = pytest.mark.slurm


def test_each_gpu_recorded_once_per_node_and_scored(slurm_env, tmp_path):
    env = {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}
    script = f"""#!/bin/bash
export DCGM_HOME={FAKE} HPCML_FAKE_DCGM={FAKE}/recorded.json CUDA_VISIBLE_DEVICES=2,3
srun {sys.executable} -m hpcml score record --gpu-metrics dcgm --dir score --interval 0.2 -- \\
    {sys.executable} -c "import time; time.sleep(2)"
echo "srun exit $?"
"""
    out = run_job(script, tmp_path, env, timeout=240, tasks_per_node=2)
    assert "srun exit 0" in out, out
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "score").glob("rank-*.json"))]
    assert len(ranks) == 4
    recorded = sorted((r["node"], g) for r in ranks for g in r["gpu_sampler"].get("gpus") or [])
    assert recorded == [("n1", "2"), ("n1", "3"), ("n2", "2"), ("n2", "3")], ranks
    p = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", "--json", "--no-html",
                        str(tmp_path / "score")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert sorted(g["gpu"] for g in rep["per_gpu"]) == ["n1:2", "n1:3", "n2:2", "n2:3"], (rep["notes"], recorded)
    assert not any("was recorded by ranks" in n for n in rep["notes"])      # never twice
    assert rep["temporal_only"] is False and rep["score"] is not None
