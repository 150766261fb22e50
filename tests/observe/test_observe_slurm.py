"""``hpcml observe`` on the real 2-node local cluster: 4 ranks under srun, one slow, one
whose recorder is killed with SIGKILL mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.observe.store import read_job
from tests.observe.browser import assert_not_blank, render
from tests.observe.jobscores import from_job
from tests.slurmjobs import run_job

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slurm


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def _steps(job, rank: int) -> list[int]:
    t = job.table.to_pydict()
    return [s for r, k, n, s in zip(t["rank"], t["kind"], t["name"], t["step"])
            if r == rank and k == "section" and n == "step" and s is not None]


def test_four_ranks_one_straggler_one_killed_recorder(env, tmp_path):
    script = f"""#!/bin/bash
export HPCML_OBSERVE_FLUSH=0.2
srun {sys.executable} -m hpcml observe record --dir obs --interval 0.2 -- \\
    {sys.executable} {ROOT}/examples/observe/train.py --steps 80 --slow-rank 2 \\
    --kill-recorder-rank 1 --kill-at 50
echo "srun exit $?"
"""
    out = run_job(script, tmp_path, env, timeout=240, tasks_per_node=2)
    job = read_job(tmp_path / "obs")
    assert sorted(job.ranks) == [0, 1, 2, 3], out
    assert job.meta["ntasks"] == 4
    nodes = {r: job.meta["ranks"][str(r)]["node"] for r in range(4)}
    assert set(nodes.values()) == {"n1", "n2"}

    scores = from_job(job, section="compute", min_seconds=0.1)     # a few seconds: judged when asked
    assert scores[0].rank == 2 and scores[0].chronic, scores
    assert scores[0].node == nodes[2]
    assert not any(s.chronic for s in scores[1:])

    # rank 1's recorder was SIGKILLed at step 50, once it had read the rank's pipe: its file
    # is cut but reads up to its last write (the batch read last may not have reached it)
    rank1 = _steps(job, 1)
    assert rank1 and 35 <= max(rank1) <= 50 and sorted(rank1) == list(range(len(rank1)))
    assert "exit_code" not in json.loads((tmp_path / "obs" / "rank-00001.json").read_text())
    assert max(_steps(job, 0)) == 79

    # the report names the straggler and its node, and accounts for the killed recorder
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", "--json", "--min-straggler-s", "0.1",
                          str(tmp_path / "obs")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    worst = rep["stragglers"][0]
    assert worst["rank"] == 2 and worst["node"] == nodes[2]
    assert any("2" in f["message"] and nodes[2] in (f["message"] + f["advice"]) for f in rep["findings"])
    pixels, dom = render(tmp_path / "obs" / "report.html", tmp_path)
    assert_not_blank(pixels)
    assert f"rank 2 on {nodes[2]}" in dom
