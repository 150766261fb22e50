"""``hpcml run --vet`` on 16 virtual nodes, two of them failing a site's check: the path
``benchmarks/bench_scale.py`` measures up to 256 nodes, kept in the suite so that it cannot
regress (hostlists, the srun fan-out, the verdict, the rendezvous, rank numbering).

The failing check is a site package's, found through the ``hpcml.checks`` entry point
(``hpcml.testing.siteplugin``), not a hook inside hpcml. What is checked is what the ranks
did: each appends ``RANK WORLD_SIZE NODE`` to one O_APPEND file.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcml.testing import siteplugin
from hpcml.testing.localslurm import LocalSlurm
from tests.slurmjobs import submit, wait

ROOT = Path(__file__).resolve().parents[2]
NODES = 16
BAD = ["n3", "n12"]
pytestmark = pytest.mark.slurm

TASK = """import os
line = f"{os.environ['RANK']} {os.environ['WORLD_SIZE']} {os.environ['SLURMD_NODENAME']}\\n"
fd = os.open(os.environ["SCALE_DONE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
"""


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[LocalSlurm]:
    """16 virtual nodes of one CPU, on a root and ports of their own (the suite's, shifted)."""
    port = int(os.environ.get("HPCML_SLURM_PORT", "6917")) + 100
    root = Path(os.environ.get("HPCML_SLURM_ROOT", "/tmp/hpcml-slurm") + "-scale")
    c = LocalSlurm(root, nodes=NODES, cpus_per_node=1, ctld_port=port, first_slurmd_port=port + 4)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_sixteen_nodes_two_bad_exactly_they_are_excluded_and_every_other_rank_runs(cluster, tmp_path):
    site = siteplugin.install(tmp_path / "site")
    (tmp_path / "bad.txt").write_text(" ".join(BAD))
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "scale.yaml").write_text(
        "name: scale\ndeadline: 2 min\nevals:\n"
        "  - {name: memory, type: memory, min_available_fraction: 1%, timeout: 20 s}\n"
        "  - {name: mounts, type: mounts, paths: [/proc], timeout: 20 s}\n"
        f"  - {{name: marked, type: {siteplugin.TYPE}, nodes_file: {tmp_path / 'bad.txt'}, timeout: 20 s}}\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = {**cluster.client_env(base), "PYTHONPATH": f"{site}:{ROOT}", "SCALE_DONE": str(tmp_path / "done.txt"),
           "PATH": f"{Path(sys.executable).parent}:{base['PATH']}"}
    job = submit(f"#!/bin/bash\nhpcml run --vet scale.yaml --min-nodes 14 --no-report --hang-timeout off --dir job "
                 f"-- python {tmp_path / 'task.py'}\necho run-rc=$?\n", tmp_path, env, nodes=NODES)
    wait(job, env, timeout=300)
    out = (tmp_path / "job.out").read_text()
    assert "run-rc=0" in out, out
    good = [n for n in cluster.node_names if n not in BAD]
    rows = sorted(line.split() for line in (tmp_path / "done.txt").read_text().splitlines())
    assert sorted(int(r[0]) for r in rows) == list(range(len(good)))
    assert {r[1] for r in rows} == {str(len(good))}
    assert sorted(r[2] for r in rows) == sorted(good)
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert sorted(run["excluded"]) == sorted(BAD) and all("marked bad" in why[0] for why in run["excluded"].values())
