"""``hpcml run`` in batch jobs on the real 2-node local cluster (n1, n2).

The bad node is made bad by a test plugin check (tests/plugins/testchecks.py) that reports
a slow value only on n2, so relative vetting marks n2 and the run shrinks to n1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.slurmjobs import run_job

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
    assert "trained 4 steps on 1 ranks" in (tmp_path / "job" / "logs" / "rank-0.out").read_text()
    rep = _report(tmp_path, env)
    excluded = next(f for f in rep["findings"] if f["kind"] == "excluded_nodes")
    assert "n2" in excluded["message"] and "speed" in excluded["message"]
    assert rep["observe"]["ranks_with_data"] == 1


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
