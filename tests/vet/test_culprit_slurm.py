"""The culprit search on the real 2-node cluster (n1, n2): n2 is made slow by the
collective check's test-only slowdown (HPCML_VET_TEST_SLOW_NODES), which every group test
holding n2 inherits through srun's environment."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests import needs
from tests.slurmjobs import run_job

ROOT = Path(__file__).parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

PROTOCOL = """name: culprit
evals:
  - {name: memory, type: memory, min_available_fraction: 1%}
  - {name: allreduce, type: collective, payload: 4 MiB, iterations: 3, timeout: 60 s,
     min_bandwidth: 20 MB/s}
"""


@pytest.fixture
def env(slurm_env):
    needs.module("torch")
    return {**slurm_env, "PYTHONPATH": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def _vet(env, tmp_path, slow: str | None) -> tuple[str, dict]:
    (tmp_path / "p.yaml").write_text(PROTOCOL)
    export = (f"export HPCML_VET_TEST_SLOW_NODES={slow} HPCML_VET_TEST_SLOW_FACTOR=100\n"
              if slow else "")
    script = f"""#!/bin/bash
{export}{sys.executable} -m hpcml vet p.yaml --out vet --min-nodes 1; echo "vet-rc=$?"
"""
    out = run_job(script, tmp_path, env, timeout=240)
    return out, json.loads((tmp_path / "vet" / "report.json").read_text())


def _allreduce(rep: dict, node: str) -> dict:
    return {r["check"]: r for r in rep["nodes"][node]["results"]}["allreduce"]


def test_slow_node_is_found_marked_and_excluded(env, tmp_path):
    out, rep = _vet(env, tmp_path, "n2")
    assert "vet-rc=3" in out, out
    n1, n2 = _allreduce(rep, "n1"), _allreduce(rep, "n2")
    assert n2["outcome"] == "fail" and n2["message"].startswith("culprit: slow in 1 group tests"), n2
    assert n1["outcome"] == "pass" and n1["message"].startswith("cleared"), n1
    assert rep["verdict"]["decision"] == "shrink" and rep["verdict"]["good"] == "n1"
    assert (tmp_path / "vet" / "bad-nodes").read_text().strip() == "n2"
    note = next(n for n in rep["notes"] if n.startswith("culprit search for 'allreduce'"))
    rounds, seconds = re.search(r"\((\d+) rounds, \d+ tests, ([\d.]+) s\)", note).groups()
    assert int(rounds) == 1, note
    search = n1["details"]["culprit_search"] if "log" in n1["details"]["culprit_search"] \
        else n2["details"]["culprit_search"]
    (groups_bw,) = [r["bandwidths"] for r in search["log"]]
    assert search["log"][0]["groups"] == [["n1"], ["n2"]] and groups_bw[0] > groups_bw[1]
    print(f"\nculprit search: {note}; group bandwidths {groups_bw} B/s")


def test_no_search_without_a_slow_node(env, tmp_path):
    out, rep = _vet(env, tmp_path, None)
    assert "vet-rc=0" in out, out
    assert not any("culprit" in n for n in rep["notes"])
    for node in ("n1", "n2"):
        r = _allreduce(rep, node)
        assert r["outcome"] == "pass" and "culprit_search" not in r["details"]
