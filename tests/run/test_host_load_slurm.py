"""A load from outside the job is contention, never a rank's fault: a 2-node cluster of its
own (``n1`` pinned to CPU 0, ``n2`` to CPU 1: its slurmd's affinity, which Slurm's
``task/none`` passes on to the job's tasks), a 2-rank DDP job over gloo whose ranks do a
fixed amount of CPU work per step, one rank per node.

- Two busy processes outside the job pinned to ``n2``'s CPU: the rank there takes about 3x
  as long and the other waits for it in the all-reduce. Its threads wait for their CPU far
  more than the other rank's; the watch names it as contention while the job runs, and the
  report says contention too; no straggler either way.
- The same load on both nodes' CPUs: both ranks slow alike; no straggler, no contention.

The loads are real processes (``taskset``), the ranks' waits the kernel's own scheduler run
delay; nothing is mocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.slurmjobs import own_cluster, submit, wait

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "run" / "scripts" / "raw_ddp.py"
pytestmark = [pytest.mark.slurm, pytest.mark.torch]
HOG = "while True:\n    pass\n"


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs 2 CPUs (a node each)", pytrace=False)
    with own_cluster("hostload", 50, nodes=2) as c:
        pins = {}
        for i, name in enumerate(c.node_names):              # n1 on CPU 0, n2 on CPU 1
            pid = int((c.run_dir / f"slurmd-{name}.pid").read_text())
            pins[pid] = os.sched_getaffinity(pid)
            for t in psutil.Process(pid).threads():
                os.sched_setaffinity(t.id, {i})
        try:
            yield c
        finally:
            for pid, cpus in pins.items():
                try:
                    for t in psutil.Process(pid).threads():
                        os.sched_setaffinity(t.id, cpus)
                except (psutil.Error, OSError):
                    pass


@pytest.fixture
def env(cluster) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**cluster.client_env(base), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:{base['PATH']}"}


@contextmanager
def hogs(cpus: list[int]) -> Iterator[None]:
    """Two busy processes on each of ``cpus``, outside the job, stopped after."""
    procs = [subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", HOG]) for c in cpus for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _job(tmp_path: Path, env: dict[str, str]) -> tuple[str, dict, dict]:
    """(the job's output, run.json, the report as JSON) of 450 steps of fixed CPU work."""
    script = (f"#!/bin/bash\nexport STEPS=450 ACCUM=1 WORK=250000\n"
              f"hpcml run --dir job --no-report --straggler-window '10 s' -- python {SCRIPT}\necho run-rc=$?\n")
    wait(submit(script, tmp_path, env), env, timeout=300)
    out = (tmp_path / "job.out").read_text()
    assert "run-rc=0" in out, out
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    p = subprocess.run([sys.executable, "-m", "hpcml", "report", str(tmp_path / "job"), "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return out, run, json.loads(p.stdout)


def test_a_load_on_one_node_is_named_as_contention_not_a_straggler(env, tmp_path):
    with hogs([1]):
        out, run, rep = _job(tmp_path, env)
    assert [c["rank"] for c in run.get("contended") or []] == [1], (run.get("contended"), run["stragglers"], out)
    assert run["stragglers"] == [], run["stragglers"]
    c = run["contended"][0]
    assert c["node"] == "n2" and c["cpu_wait"] is not None and c["cpu_wait"] >= 0.4, c
    assert "contention: rank 1 on n2" in out and "waited for a CPU" in out, out
    kinds = [f["kind"] for f in rep["findings"]]
    assert "contention" in kinds and "chronic_straggler" not in kinds and "live_straggler" not in kinds, rep["findings"]


def test_a_load_on_every_node_names_no_one(env, tmp_path):
    with hogs([0, 1]):
        out, run, rep = _job(tmp_path, env)
    assert run["stragglers"] == [] and not run.get("contended"), (run["stragglers"], run.get("contended"), out)
    kinds = [f["kind"] for f in rep["findings"]]
    assert not {"contention", "chronic_straggler", "live_straggler", "collective_straggler"} & set(kinds), rep["findings"]
