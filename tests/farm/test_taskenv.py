"""A task's environment on a GPU slot: its one GPU is the binding every hpcml reader sees."""

from __future__ import annotations

from pathlib import Path

from hpcml.cluster.allocation import current, task_gpus
from hpcml.farm.taskenv import attempt_environment, task_environment
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
