"""A task's environment on a GPU slot: its one GPU is the binding every hpcml reader sees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.cluster.allocation import current, task_gpus
from hpcml.cluster.taskenv import INJECT, attempt_environment, task_environment
from hpcml.cluster.taskenv import current as farm_task
from hpcml.observe.recorder import Task


def test_a_gpu_slots_task_sees_its_one_gpu_and_rank_0_of_1(tmp_path: Path):
    step = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURMD_NODENAME": "n2", "SLURM_STEP_GPUS": "4,5,6,7", "SLURM_JOB_GPUS": "4,5,6,7",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PMIX_RANK": "1", "LOCAL_RANK": "0"}
    env = attempt_environment(task_environment(step, tmp_path, "2"), 3, 1)
    assert task_gpus(env) == ("2",)
    alloc = current(env)
    assert (alloc.job_id, alloc.node, alloc.rank, alloc.world_size, alloc.nodes) == ("42", "n2", 0, 1, ("n1", "n2"))
    rec = Task.from_env(env)                                   # what observe records for the task
    assert (rec.rank, rec.ntasks, rec.gpus, rec.job_id) == (0, 1, ("2",), "42")
    assert env["HPCML_OBSERVE_DIR"] == f"{tmp_path.absolute()}/observe/3.1"
    assert "SLURM_STEP_GPUS" not in task_environment(step, tmp_path, "2")
    assert task_environment(step, tmp_path, None)["SLURM_STEP_GPUS"] == "4,5,6,7"   # a CPU slot: untouched


def test_a_task_on_a_cray_step_is_an_mpi_singleton(tmp_path: Path):
    """Slurm's mpi/cray_shasta plugin (HPE Cray EX: MpiDefault=cray_shasta) gives each task of
    the farm's step its PALS rank and the step's layout file: Cray PMI (and scripts) read them,
    so a task that kept them would be rank 1 of the step and wait in MPI_Init for the others."""
    step = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "PMI_RANK": "1", "PMI_SIZE": "2",
            "PALS_RANKID": "1", "PALS_LOCAL_RANKID": "0", "PALS_NODEID": "1", "PALS_APID": "42.0",
            "PALS_APINFO": "/var/spool/slurmd/mpi_cray_shasta/42.0/apinfo", "PALS_SPOOL_DIR": "/var/spool/x"}
    env = task_environment(step, tmp_path, None)
    assert sorted(env) == ["HPCML_FARM_DIR", "HPCML_FARM_JOB_ID", "HPCML_FARM_WORKDIR", "PYTHONPATH", "SLURM_JOB_ID",
                           "SLURM_STEP_ID"]


def test_a_job_a_task_submits_is_not_a_farm_task(tmp_path: Path):
    """sbatch exports the submitter's environment by default: a 2-node job submitted from a
    task inherits HPCML_FARM_* but gets its own SLURM_JOB_ID, and an hpcml run there must
    launch across its own allocation, not as one local rank in the farm's runs/ID.A."""
    task = attempt_environment(task_environment({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}, tmp_path, None), 3, 1)
    assert farm_task(task) is not None and farm_task(task).id == 3
    assert farm_task({**task, "SLURM_JOB_ID": "43"}) is None                    # the submitted job
    local = attempt_environment(task_environment({}, tmp_path, None), 0, 0)     # a farm outside Slurm
    assert farm_task(local) is not None
    assert farm_task({**local, "SLURM_JOB_ID": "7"}) is None                     # sbatch from a local farm's task


def test_a_tasks_python_path_gets_hpcmls_sitecustomize_first_and_keeps_the_rest_as_it_was(tmp_path: Path):
    """An empty PYTHONPATH entry is the current directory: kept; a claim on optimizer steps
    the worker inherited (started inside a rank or a task) is not the task's."""
    from hpcml.run.inject import sitecustomize
    assert INJECT == os.path.dirname(os.path.abspath(sitecustomize.__file__))
    env = task_environment({"PYTHONPATH": ":/opt/site", "HPCML_FARM_STEPS_PID": "7", "HPCML_RUN_STEPS_PID": "8"},
                           tmp_path, None)
    assert env["PYTHONPATH"] == f"{INJECT}::/opt/site"
    assert "HPCML_FARM_STEPS_PID" not in env and "HPCML_RUN_STEPS_PID" not in env
    assert task_environment({}, tmp_path, None)["PYTHONPATH"] == INJECT
    assert task_environment({"PYTHONPATH": INJECT}, tmp_path, None)["PYTHONPATH"] == INJECT


STEPPER = """
import torch
net = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(3):
    net(torch.ones(1, 2)).sum().backward()
    opt.step()
"""


@pytest.mark.torch
@pytest.mark.parametrize("job, counted", [("42", True), ("43", False)])
def test_a_tasks_steps_are_counted_but_not_a_submitted_jobs(tmp_path: Path, job: str, counted: bool):
    """A farm task's plain torch loop: its optimizer steps land in its observe directory
    (rank files of the store); the same program in a job the task submitted with sbatch
    (the farm's variables inherited, another SLURM_JOB_ID) counts nothing there."""
    root = Path(__file__).resolve().parents[2]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_"))}
    base.update(SLURM_JOB_ID="42", PYTHONPATH=f"{root / 'src'}")
    env = attempt_environment(task_environment(base, tmp_path, None), 0, 1)
    env["SLURM_JOB_ID"] = job
    p = subprocess.run([sys.executable, "-c", STEPPER], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    written = list((tmp_path / "observe" / "0.1").glob("rank-*")) if (tmp_path / "observe" / "0.1").exists() else []
    assert bool(written) == counted, (written, p.stderr)
    if counted:
        from hpcml.observe.progress import summarise
        from hpcml.observe.series import from_table
        from hpcml.observe.store import read_job
        done = summarise(from_table(read_job(str(tmp_path / "observe" / "0.1")).table))
        assert done is not None and done["steps"]["count"] == 3
