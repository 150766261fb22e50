"""The launcher's backends (hpcml.run.backends): what each plans before its ranks start.

The rendezvous probe asks rank 0's node for a free port through ``cluster.slurm``; its
failure must be an error, never a port that is free on the launcher's node instead. Slurm
cannot be made to fail a step on demand, so ``srun`` here is a script on PATH that fails as
a lost node's step does (said where it is used); the probe's success path runs on the local
cluster in test_run_slurm and test_recovery_slurm.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType

import pytest

from hpcml.jobmodel import RunRecord
from hpcml.run.backends import BACKENDS, Local, NoRendezvous, Settings, Srun

SETTINGS = Settings(ntasks=None, ntasks_per_node=2, gpus_per_task=None, env=MappingProxyType({"HPCML_X": "1"}))


@dataclass
class Allocation:
    node: str = "login"
    job_id: str = "42"
    nodes: tuple[str, ...] = ("n1", "n2", "n3")


def record(mode: str = "slurm") -> RunRecord:
    return RunRecord(command=["python", "t.py"], mode=mode, started=0.0, attempt=1)


def fake_srun(tmp_path, monkeypatch, script: str) -> None:
    """A stand-in for srun (see the module docstring)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/sh\n" + script)
    (bin_ / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("script", ["echo 'srun: error: Nodes n2 are down' >&2; exit 1", "echo ''"])
def test_a_failed_rendezvous_probe_is_an_error_not_the_launchers_port(tmp_path, monkeypatch, script):
    fake_srun(tmp_path, monkeypatch, script)
    with pytest.raises(NoRendezvous, match="no rendezvous port on n2, rank 0's node"):
        Srun(SETTINGS, ["n2", "n3"], Allocation()).plan(["task"], record())


def test_srun_plans_rank_0_on_the_first_node_with_its_port(tmp_path, monkeypatch):
    fake_srun(tmp_path, monkeypatch, "echo 29500")
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
    plan = Srun(SETTINGS, ["n2", "n3"], Allocation()).plan(["task", "--", "python", "t.py"], record())
    assert plan.master.endswith(":29500") and (plan.ntasks, plan.ntasks_per_node) == (4, 2)
    assert plan.launch[0] == "srun" and "--nodelist=n[2-3]" in plan.launch and plan.launch[-3:] == ["--", "python", "t.py"]
    assert plan.env["HPCML_X"] == "1" and plan.env["TORCHELASTIC_RESTART_COUNT"] == "1"


def test_rank_0s_node_is_the_first_in_the_jobs_order_not_the_pools(tmp_path, monkeypatch):
    """srun numbers a step's nodes in the job's order (SLURM_JOB_NODELIST's) whatever order
    --nodelist has: a spare put back last (n1 here) can be rank 0's node."""
    fake_srun(tmp_path, monkeypatch, 'echo "$4" >> ' + str(tmp_path / "asked") + "; echo 29500")
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
    job = Allocation(nodes=("n3", "n1", "n2"))                 # slurm.conf (or topology) order
    plan = Srun(SETTINGS, ["n2", "n1"], job).plan(["task"], record())
    assert plan.nodes == ["n1", "n2"] and (tmp_path / "asked").read_text().split() == ["n1"]
    assert plan.env["MASTER_ADDR"] == "n1" and "--nodelist=n[1-2]" in plan.launch


def test_local_plans_its_tasks_here_without_slurms_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    plan = Local(Settings(3, None, None, MappingProxyType({})), ["here"], None).plan(["task"], record("local"))
    assert plan.nodes == ["here"] and plan.ntasks == 3 and plan.master.startswith("127.0.0.1:")
    assert "SLURM_JOB_ID" not in plan.env and plan.env["WORLD_SIZE"] == "3"


def test_every_mode_has_a_backend():
    assert set(BACKENDS) == {"slurm", "local"}


def test_an_attempt_whose_rendezvous_fails_ends_with_1_and_says_why(tmp_path, monkeypatch, capsys):
    """srun stands in for a step on a lost node (module docstring): the attempt is not
    started, and the launcher goes on to record its end (``ending.finish``)."""
    from hpcml.run.attempt import run_attempt
    from hpcml.run.config import Config, Options
    fake_srun(tmp_path, monkeypatch, "echo 'srun: error: Nodes n2 are down' >&2; exit 1")
    rec = record()
    cfg = Config.of(Options(cmd=["python", "t.py"]), nodes=2)
    assert run_attempt(cfg, tmp_path, rec, Srun(SETTINGS, ["n2", "n3"], Allocation()), []) == 1
    assert "attempt 1 not started: no rendezvous port on n2" in capsys.readouterr().err
    assert rec.launch is None


def _site_run(tmp_path, backend: str, *cmd: str):
    import subprocess
    import sys

    from hpcml.testing import siteplugin
    site = siteplugin.install(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])), HPCML_RUN_BACKEND=backend)
    return subprocess.run([sys.executable, "-m", "hpcml", "run", "--dir", str(tmp_path / "job"), "--no-report",
                           "--ntasks", "2", "--", *cmd], env=env, capture_output=True, text=True, timeout=120)


def test_a_backend_installed_as_a_site_package_runs_the_job_when_named(tmp_path):
    """CONTRIBUTING's recipe, followed exactly: one class in a site package, one entry point
    in ``hpcml.run_backends``; named by ``HPCML_RUN_BACKEND``, it runs the ranks (each
    appends to a file), says where in its own words, and is the run's mode."""
    import sys

    from hpcml.run.jobdir import read_run
    out = tmp_path / "ran"
    p = _site_run(tmp_path, "site-local", sys.executable, "-c", f"open({str(out)!r}, 'a').write('x')")
    assert p.returncode == 0, p.stderr
    assert out.read_text() == "xx"
    assert "hpcml run: 2 site tasks here, rendezvous" in p.stderr, p.stderr
    assert read_run(tmp_path / "job").mode == "site-local"


def test_an_unknown_backend_name_is_one_line_exit_2(tmp_path):
    p = _site_run(tmp_path, "flux-nope", "true")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "HPCML_RUN_BACKEND" in lines[0] and "flux-nope" in lines[0], p.stderr
