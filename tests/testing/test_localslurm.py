"""The local Slurm cluster really runs jobs, and the wrappers in hpcml.cluster.slurm work on it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from hpcml.cluster import slurm
from hpcml.cluster.slurm import node_states
from hpcml.errors import SlurmError
from hpcml.testing import localslurm
from hpcml.testing.localslurm import LocalSlurm, SlurmNotInstalled


def scontrol_hostnames(hostlist: str) -> list[str]:
    """Slurm's own expansion, through the package's error-wrapping ``run``."""
    return slurm.run(["scontrol", "show", "hostnames", hostlist], timeout=10).stdout.split()

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def run(argv: list[str], env: dict[str, str], timeout: float = 30) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}: {proc.stderr}"
    return proc.stdout


def job_state(job_id: str, env: dict[str, str]) -> str:
    return run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], env, 10).strip()


def wait_job(job_id: str, env: dict[str, str], states: set[str], timeout: float = 60) -> str:
    """Poll squeue (never ``sbatch --wait``, which adds up to 10 s) until a state in ``states``."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = job_state(job_id, env)
        if state in states:
            return state
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still {state or 'unknown'} after {timeout} s")


@pytest.mark.slurm
def test_srun_runs_one_task_on_each_node(slurm_env: dict[str, str]) -> None:
    out = run(["srun", "-N2", "--ntasks-per-node=1", "sh", "-c", "echo $SLURMD_NODENAME"],
              slurm_env)
    assert sorted(out.split()) == ["n1", "n2"]


@pytest.mark.slurm
def test_sbatch_job_spans_both_nodes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N2 --ntasks-per-node=1\n"
                      "srun sh -c 'echo node=$SLURMD_NODENAME'\n")
    job_id = run(["sbatch", "--parsable", "-o", str(out), str(script)], slurm_env).strip()
    assert wait_job(job_id, slurm_env, TERMINAL) == "COMPLETED"
    assert sorted(out.read_text().split()) == ["node=n1", "node=n2"]


@pytest.mark.slurm
def test_drain_and_resume(slurm_cluster: LocalSlurm, slurm_env: dict[str, str]) -> None:
    run(["scontrol", "update", "nodename=n2", "state=drain", "reason=x"], slurm_env)
    try:
        assert "DRAIN" in node_states("n2")["n2"]
        assert "x" in run(["sinfo", "-h", "-R", "-o", "%E %N"], slurm_env).split()
    finally:
        run(["scontrol", "update", "nodename=n2", "state=resume"], slurm_env)
    # resume marks the node NOT_RESPONDING until the controller has pinged it again
    slurm_cluster.wait_idle(10)
    assert node_states("n2")["n2"] == "IDLE"


@pytest.mark.slurm
def test_wrappers_against_the_cluster(slurm_cluster: LocalSlurm) -> None:
    slurm_cluster.wait_idle(10)
    assert node_states() == {"n1": "IDLE", "n2": "IDLE"}
    assert scontrol_hostnames("n[1-2]") == ["n1", "n2"]
    proc = slurm.srun(["printenv", "SLURMD_NODENAME"], nodes=["n1", "n2"], ntasks_per_node=1)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["n1", "n2"]
    slurm.scontrol_update_node(["n1"], state="drain", reason="wrapper test")
    try:
        assert "DRAIN" in node_states("n1")["n1"]
    finally:
        slurm.scontrol_update_node(["n1"], state="resume")
    slurm_cluster.wait_idle(10)


@pytest.mark.slurm
def test_start_is_a_noop_when_up(slurm_cluster: LocalSlurm) -> None:
    before = slurm_cluster.status()
    slurm_cluster.start()
    after = slurm_cluster.status()
    assert before.up and after.up
    assert before.daemons == after.daemons
    assert all(pids for pids in after.daemons.values())


@pytest.mark.slurm
@pytest.mark.parametrize(("crash_controller", "script"), [
    (False, "srun sleep 300"), (True, "srun sleep 300"),
    (True, "for i in $(seq 400); do sleep 300 & done; wait")], ids=["running", "ctld-crashed", "ctld-crashed-forking"])
def test_stop_leaves_nothing_behind(slurm_cluster: LocalSlurm, crash_controller: bool, script: str) -> None:
    """A second, one-node cluster beside the session's: stop it with a job step running,
    and once with its slurmctld killed first, so that no scancel can clean up the steps;
    once with a batch script that forks all the while (a child made while the tasks are
    listed must not survive them: a CI run left a batch script's ``srun`` so)."""
    root = Path(tempfile.mkdtemp(prefix="hpcml-slurm-t", dir="/tmp"))
    cluster = LocalSlurm(root, nodes=1, ctld_port=6937, first_slurmd_port=6941)
    try:
        with cluster:
            env = cluster.client_env()
            job_id = run(["sbatch", "--parsable", "-o", "/dev/null",
                          "--wrap", script], env).strip()
            wait_job(job_id, env, {"RUNNING"})
            deadline = time.monotonic() + 20
            while not cluster._find("slurmstepd") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert cluster._find("slurmstepd"), "no slurmstepd for the running job"
            if crash_controller:
                for ctld in cluster._find("slurmctld"):
                    ctld.kill()
        assert not cluster.is_up()
        assert not any(cluster.status().daemons.values())
        assert not cluster._find("slurmstepd")
        # a killed job step may take a moment to be reaped on a loaded machine: not a leak
        deadline = time.monotonic() + 5
        while _processes_with_conf(cluster.conf) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _processes_with_conf(cluster.conf)
        assert slurm_cluster.is_up(), "stopping one cluster touched the other"
    finally:
        cluster.stop()
        for pid in _processes_with_conf(cluster.conf):      # what a failed stop left: not the next test's
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def _processes_with_conf(conf: Path) -> list[int]:
    pids = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE \
                    and proc.environ().get("SLURM_CONF") == str(conf):
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


# --- the wrappers without a cluster ---------------------------------------------------------

def test_wrapper_times_out_on_a_hanging_command(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    with pytest.raises(SlurmError, match=r"srun: no answer within 0\.5 s"):
        slurm.srun(["true"], timeout=0.5)
    assert time.monotonic() - started < 10


def test_wrapper_reports_a_missing_binary(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError, match="scontrol: Slurm is not installed"):
        scontrol_hostnames("n[1-2]")
    with pytest.raises(SlurmError, match="srun: Slurm is not installed"):
        slurm.srun(["true"])


def test_install_without_root_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localslurm, "find_binary", lambda name: None)
    monkeypatch.setattr(localslurm, "_deb_installed", lambda package: False)
    monkeypatch.setattr(localslurm.os, "geteuid", lambda: 1000)
    with pytest.raises(SlurmNotInstalled, match="only root can install.*apt-get install"):
        LocalSlurm().install()


def test_conf_has_one_port_per_node_and_the_extra_lines() -> None:
    conf = LocalSlurm(nodes=3, ctld_port=7000, first_slurmd_port=7010,
                      extra_conf="Prolog=/bin/true").render_conf()
    assert "SlurmctldPort=7000" in conf
    assert [line.split("Port=")[1].split()[0] for line in conf.splitlines()
            if line.startswith("NodeName=")] == ["7010", "7011", "7012"]
    assert "PartitionName=debug Nodes=n[1-3]" in conf
    assert conf.rstrip().endswith("Prolog=/bin/true")


@pytest.mark.parametrize(("nodes", "lines"), [(64, ["SlurmdTimeout=15"]), (256, ["SlurmdTimeout=15", "MessageTimeout=60"]),
                                              (1024, ["MessageTimeout=60", "SlurmdTimeout=300"])])
def test_conf_grows_with_the_virtual_nodes_on_one_host(nodes: int, lines: list[str]) -> None:
    """Many virtual nodes on two cores launch a step slowly: node messages get a minute, and
    past 256 nodes the step's credentials outlive a launch of minutes; munged gets threads."""
    cluster = LocalSlurm(nodes=nodes, ctld_port=7000, first_slurmd_port=7010)
    conf = cluster.render_conf().splitlines()
    assert [x for x in conf if x.startswith(("MessageTimeout", "SlurmdTimeout"))] == lines
    auth = next(x for x in conf if x.startswith("AuthInfo=")).split("=", 1)[1].split(",")
    assert auth[0] == f"socket={cluster.munge_socket}" and ("ttl=1800" in auth) == (nodes > 256)
    assert f"cred_expire={10 if nodes <= 64 else 600}" in auth
    assert cluster.munge_threads == min(64, max(2, nodes // 8))


@pytest.mark.slurm
def test_start_tries_once_more_after_a_failed_start(slurm_cluster: LocalSlurm,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A start whose slurmctld is lost at its first start (as once on a loaded machine:
    "slurmctld exited at start: no log") comes up on the second try. The first failure is
    injected by making the first slurmctld start raise after the daemon is up; a second
    failure still raises."""
    root = Path(tempfile.mkdtemp(prefix="hpcml-slurm-r", dir="/tmp"))
    cluster = LocalSlurm(root, nodes=1, ctld_port=6937, first_slurmd_port=6941)
    real = LocalSlurm._start_slurmctld
    calls: list[int] = []

    def flaky(self: LocalSlurm, deadline: float) -> None:
        calls.append(1)
        real(self, deadline)
        if len(calls) == 1:
            raise SlurmError("slurmctld exited at start: no log (injected)")
    monkeypatch.setattr(LocalSlurm, "_start_slurmctld", flaky)
    try:
        cluster.start()
        assert len(calls) == 2 and cluster.is_up()
        cluster.stop()
        monkeypatch.setattr(LocalSlurm, "_start_slurmctld",
                            lambda self, deadline: (_ for _ in ()).throw(SlurmError("always")))
        with pytest.raises(SlurmError, match="always"):
            cluster.start()
        assert not cluster.is_up() and not any(cluster.status().daemons.values())
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
