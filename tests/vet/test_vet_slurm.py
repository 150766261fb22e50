"""`hpcml vet` on the real 2-node local cluster (n1, n2): batch jobs, srun steps, verdicts.

The bad node is made bad by a per-node condition that only the tests apply: plugin checks
from tests/plugins/testchecks.py that misbehave only on the nodes they are given.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import needs
from tests.slurmjobs import run_job

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slurm


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def _alloc(cmd: str, env, tmp_path, timeout=120) -> subprocess.CompletedProcess:
    """Run ``cmd`` as a batch-like shell inside a 2-node allocation (salloc)."""
    return subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", "bash", "-c", cmd],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout)


def _report(path: Path) -> dict:
    return json.loads((path / "report.json").read_text())


def test_batch_job_vets_shrinks_and_runs_the_application_on_the_good_node(env, tmp_path):
    (tmp_path / "p.yaml").write_text(
        "name: slow-n2\nmin_nodes: 1\nevals:\n"
        "  - {name: memory, type: memory, min_available_fraction: 1%}\n"
        "  - {name: speed, type: tests.plugins.testchecks.Value, value: 100, slow_factor: 2,"
        " nodes: [n2], min_relative: 0.8}\n")
    script = f"""#!/bin/bash
{sys.executable} -m hpcml vet p.yaml --out vet; rc=$?
echo "vet-rc=$rc"
[ $rc -eq 4 ] && exit 1
n=$(scontrol show hostnames "$(cat vet/good-nodes)" | wc -l)
srun --nodes=$n --ntasks=$n --exclude="$(cat vet/bad-nodes)" bash -c 'echo app-on-$SLURMD_NODENAME'
"""
    out = run_job(script, tmp_path, env)
    assert "vet-rc=3" in out, out
    assert re.findall(r"app-on-(\w+)", out) == ["n1"], out
    assert (tmp_path / "vet" / "bad-nodes").read_text().strip() == "n2"
    rep = _report(tmp_path / "vet")
    assert rep["launcher"] == "srun" and rep["verdict"]["decision"] == "shrink"
    speed = {r["check"]: r for r in rep["nodes"]["n2"]["results"]}["speed"]
    assert speed["outcome"] == "fail" and "0.50x the median of the other nodes" in speed["message"]


def test_cpu_example_protocol_passes_on_both_nodes(env, tmp_path):
    p = _alloc(f"{sys.executable} -m hpcml vet {ROOT}/examples/vet/cpu.yaml --out vet --json", env, tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(p.stdout)
    assert set(rep["nodes"]) == {"n1", "n2"} and rep["verdict"]["decision"] == "continue"
    clock = {r["check"]: r for r in rep["nodes"]["n2"]["results"]}["clock"]
    assert clock["outcome"] == "pass" and abs(clock["value"]) < 1.0


def test_hanging_check_on_one_node_ends_as_error_by_its_timeout(env, tmp_path):
    (tmp_path / "p.yaml").write_text(
        "name: hang-n2\nmin_nodes: 1\ndeadline: 30 s\nevals:\n"
        "  - {name: hang, type: tests.plugins.testchecks.Hang, nodes: [n2], timeout: 2 s}\n"
        "  - {name: memory, type: memory, min_available_fraction: 1%}\n")
    start = time.monotonic()
    p = _alloc(f"{sys.executable} -m hpcml vet p.yaml --out vet", env, tmp_path)
    elapsed = time.monotonic() - start
    assert p.returncode == 3, p.stdout + p.stderr
    rep = _report(tmp_path / "vet")
    hang = {r["check"]: r for r in rep["nodes"]["n2"]["results"]}["hang"]
    assert hang["outcome"] == "error" and "timed out after 2 s" in hang["message"]
    assert rep["verdict"]["bad"] == "n2" and elapsed < 30


def test_run_ends_by_its_deadline_whatever_hangs(env, tmp_path):
    """n2's worker freezes itself (SIGSTOP): no timeout inside the node can fire, so only the
    launcher's deadline ends the run, and n2 is unreachable."""
    (tmp_path / "freeze.py").write_text(
        "import os, signal\nfrom tests.plugins.testchecks import Targeted\n"
        "from hpcml.vet.checks.base import Check, passed\n"
        "class Freeze(Check):\n    Params = Targeted\n"
        "    def run(self):\n        if self.ctx.node in self.params.nodes:\n"
        "            os.kill(os.getppid(), signal.SIGSTOP); os.kill(os.getpid(), signal.SIGSTOP)\n"
        "        return passed(0)\n")
    (tmp_path / "p.yaml").write_text(
        "name: freeze-n2\nmin_nodes: 1\ndeadline: 6 s\nevals:\n"
        "  - {name: freeze, type: freeze.Freeze, nodes: [n2], timeout: 60 s}\n")
    env = {**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"}
    start = time.monotonic()
    p = _alloc(f"{sys.executable} -m hpcml vet p.yaml --out vet", env, tmp_path)
    elapsed = time.monotonic() - start
    assert p.returncode == 3, p.stdout + p.stderr
    rep = _report(tmp_path / "vet")
    assert rep["nodes"]["n2"]["reachable"] is False
    assert "deadline" in rep["nodes"]["n2"]["message"]
    assert rep["nodes"]["n1"]["reachable"] is True and rep["verdict"]["good"] == "n1"
    assert rep["duration"] < 6 + 5 and elapsed < 30


def test_worker_that_dies_makes_its_node_unreachable(env, tmp_path):
    (tmp_path / "die.py").write_text(
        "import os, signal\nfrom tests.plugins.testchecks import Targeted\n"
        "from hpcml.vet.checks.base import Check, passed\n"
        "class Die(Check):\n    Params = Targeted\n"
        "    def run(self):\n        if self.ctx.node in self.params.nodes:\n"
        "            os.kill(os.getppid(), signal.SIGKILL)\n"
        "        return passed(0)\n")
    (tmp_path / "p.yaml").write_text(
        "name: die-n1\nmin_nodes: 1\nevals:\n  - {name: die, type: die.Die, nodes: [n1]}\n")
    env = {**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"}
    p = _alloc(f"{sys.executable} -m hpcml vet p.yaml --out vet", env, tmp_path)
    assert p.returncode == 3, p.stdout + p.stderr
    rep = _report(tmp_path / "vet")
    assert rep["nodes"]["n1"]["reachable"] is False and rep["verdict"]["bad"] == "n1"
    assert "no result" in rep["nodes"]["n1"]["message"]


def test_vetnode_protocol_file_runs(env, tmp_path, slurm_cluster):
    proto = ROOT / "tests" / "fixtures" / "vetnode" / "cpu-equivalent.yaml"
    text = proto.read_text().replace("port: 6917", f"port: {slurm_cluster.ctld_port}")
    (tmp_path / "vn.yaml").write_text(text)
    p = _alloc(f"{sys.executable} -m hpcml vet vn.yaml --out vet --json", env, tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(p.stdout)
    assert rep["protocol"]["vetnode"] is True
    for node in ("n1", "n2"):
        outcomes = {r["check"]: r["outcome"] for r in rep["nodes"][node]["results"]}
        assert outcomes == {"Environment": "pass", "Loopback TCP": "pass"}


def test_vetnode_protocol_fails_closed_where_vetnode_failed_open(env, tmp_path):
    """A TCP target that is down: vetnode 0.1.5 reports "Skipped" and exits 0; hpcml fails."""
    proto = ROOT / "tests" / "fixtures" / "vetnode" / "cpu-equivalent.yaml"
    (tmp_path / "vn.yaml").write_text(proto.read_text().replace("port: 6917", "port: 9"))
    p = _alloc(f"{sys.executable} -m hpcml vet vn.yaml --out vet --json", env, tmp_path)
    assert p.returncode == 4, p.stdout[-2000:] + p.stderr[-2000:]
    assert json.loads(p.stdout)["verdict"]["bad"] == "n[1-2]"


def test_collective_allreduce_across_the_allocation(env, tmp_path):
    needs.module("torch")
    (tmp_path / "p.yaml").write_text(
        "name: coll\nevals:\n  - {name: memory, type: memory, min_available_fraction: 1%}\n"
        "  - {name: allreduce, type: collective, payload: 4 MiB, iterations: 3, timeout: 90 s}\n")
    p = _alloc(f"{sys.executable} -m hpcml vet p.yaml --out vet --json", env, tmp_path, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads(p.stdout)
    for node in ("n1", "n2"):
        r = {x["check"]: x for x in rep["nodes"][node]["results"]}["allreduce"]
        assert r["outcome"] == "pass" and r["value"] > 0 and r["details"]["backend"] == "gloo"


def test_bad_protocol_in_an_allocation_is_one_line_exit_2_and_runs_nothing(env, tmp_path):
    """The workers start while the protocol is validated; on bad input they get no spec.
    "Nothing ran" is seen by what a check would have done: the TCP check's connection to a
    socket of this test's own (hermetic: nothing else on the machine can fail this, issue 61)."""
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        probe.listen(8)
        probe.setblocking(False)
        (tmp_path / "p.yaml").write_text(
            f"name: bad\nevals:\n  - {{name: probe, type: tcp, host: 127.0.0.1, port: {probe.getsockname()[1]}}}\n"
            f"  - name: d\n    type: disk\n    path: {tmp_path}\n    min_free: lots\n")
        p = _alloc(f"{sys.executable} -m hpcml vet p.yaml --out vet; echo rc=$?", env, tmp_path)
        assert "rc=2" in p.stdout
        errors = [line for line in p.stderr.splitlines() if not line.startswith("salloc:")]
        assert len(errors) == 1 and "p.yaml:7: key 'evals[1].min_free'" in errors[0], p.stderr
        assert not (tmp_path / "vet").exists()
        with pytest.raises(BlockingIOError):
            probe.accept()                             # no check connected: none ran


def test_kill_9_of_the_launcher_ends_the_workers_step(env, tmp_path):
    """hpcml vet (or hpcml run vetting suspects again) killed with SIGKILL: srun gets TERM
    from the kernel (its parent-death signal) and ends the workers' step, instead of leaving
    the checks to run until their own timeouts. The allocation outlives the launcher (as a
    batch script that goes on would), so its end is not what stops them. Looked for: the
    workers' processes."""
    import os
    import signal

    import psutil
    (tmp_path / "p.yaml").write_text(
        "name: hang-all\nmin_nodes: 1\ndeadline: 120 s\nevals:\n"
        "  - {name: hang, type: tests.plugins.testchecks.Hang, timeout: 100 s}\n")
    env = {**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"}    # marks the workers' command lines

    def workers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if "hpcml.vet.worker" in " ".join(p.info["cmdline"] or [])
                and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    job = subprocess.Popen(["salloc", "-N2", "--ntasks-per-node=1", "bash", "-c",
                            f"{sys.executable} -m hpcml vet p.yaml --out vet & echo $! > pid; wait; "
                            "until [ -e over ]; do sleep 0.2; done"],
                           env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and len(workers()) < 2:
            time.sleep(0.2)
        assert len(workers()) >= 2
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        end = time.monotonic() + 30
        while time.monotonic() < end and workers():
            time.sleep(0.2)
        assert workers() == []
    finally:
        (tmp_path / "over").touch()      # the allocation outlived the launcher: its end is not what ended them
        job.wait(timeout=60)
