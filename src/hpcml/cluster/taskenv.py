"""What a farm task sees of where it runs: a job of its own, one process, rank 0 of 1.

A worker runs inside an ``srun`` step (one agent per node), so it inherits that step's task
identity: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, PMI wire-up... Left in a task's
environment, everything that shards work by rank (``hpcml.data``'s reader, the
checkpointer, observe, torch.distributed, MPI) would take one single-process task for
rank k of the step's N: half the data, checkpoints waiting forever for the other rank.
``task_environment`` (built once per worker) removes it and keeps what the allocation
legitimately tells a task: its job (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_RESTART_COUNT),
its node (SLURMD_NODENAME, SLURM_CPUS_ON_NODE), the step it runs in (SLURM_STEP_ID: a
tool inside a task must not start an srun step of its own) and its GPU.

``current`` tells a process that it is a farm task (``hpcml run`` records there: the farm
directory's ``runs/ID.A``, read back by ``hpcml farm results``). It lives in ``cluster``
beside ``allocation`` (both answer "where am I running") and imports nothing of hpcml, so
every package may import it; the two farm directories a task is told about (``runs/``,
``observe/``) are named here, and ``hpcml.farm.model`` takes them from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: a farm's directories of its attempts' ``hpcml run`` job directories (``runs/ID.A``; not made
#: by ``farm create``: an older farm has none) and of their observe stores (``observe/ID.A``)
RUNS, OBSERVE = "runs", "observe"

#: srun's variables of one task within its step (its place, the step's shape, srun's own
#: wire-up); SLURM_NTASKS/SLURM_NNODES/... are also srun's input variables, so a nested
#: srun would inherit the step's shape
STEP_TASK = frozenset({
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_GTIDS", "SLURM_TASK_PID",
    "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
    "SLURM_NNODES", "SLURM_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST", "SLURM_DISTRIBUTION", "SLURM_SRUN_COMM_HOST",
    "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT", "SLURM_STEP_RESV_PORTS", "SLURM_LAUNCH_NODE_IPADDR",
})
#: what torchrun / ``hpcml run`` give each rank, and observe's pipe to a recorder
LAUNCHER = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "HPCML_OBSERVE_FD",
})
#: MPI/PMI wire-up of the step's tasks: without it an MPI program in a task is a singleton
#: (PALS_: Slurm's mpi/cray_shasta, what Cray PMI reads on HPE Cray EX)
PREFIXES = ("PMI_", "PMIX_", "PALS_", "OMPI_COMM_WORLD_", "TORCHELASTIC_")
#: GPU bindings of the whole step or job on this node: a GPU slot's task gets its one GPU
#: as CUDA_VISIBLE_DEVICES instead (hpcml's samplers read these first)
STEP_GPUS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL")

FARM_DIR, TASK_ID, ATTEMPT, OBSERVE_DIR = "HPCML_FARM_DIR", "HPCML_FARM_TASK_ID", "HPCML_FARM_ATTEMPT", "HPCML_OBSERVE_DIR"
#: the worker's Slurm job ("" outside Slurm): a job a task submits (sbatch exports the
#: environment by default) carries the farm's variables but another SLURM_JOB_ID, and is
#: not a farm task
FARM_JOB = "HPCML_FARM_JOB_ID"
#: the task's own directory (tasks/ID, its working directory by default) and the directory
#: ``hpcml farm run`` was started in (where tasks ran before they had their own)
TASK_DIR, WORKDIR = "HPCML_FARM_TASK_DIR", "HPCML_FARM_WORKDIR"
TASK_DIRS = "tasks"
#: the directory of ``hpcml run``'s sitecustomize (``hpcml.run.inject``), named by its path
#: (this module imports nothing of hpcml): first on a task's PYTHONPATH, it counts the task's
#: optimizer steps into its observe directory without a change to the script
INJECT = str(Path(__file__).resolve().parent.parent / "run" / "inject")
#: the sitecustomize's claims on a process's optimizer steps (hpcml run's and the farm's)
STEP_CLAIMS = ("HPCML_RUN_STEPS_PID", "HPCML_FARM_STEPS_PID")


def task_environment(env: Mapping[str, str], farm: Path, gpu: str | None) -> dict[str, str]:
    """The environment every task of one worker starts from (the worker adds its ids), with
    ``INJECT`` first on PYTHONPATH (``HPCML_RUN_OPTIMIZER_STEPS=0`` leaves steps uncounted)."""
    out = {k: v for k, v in env.items() if k not in STEP_TASK and k not in LAUNCHER and not k.startswith(PREFIXES)}
    out[FARM_DIR] = str(farm.absolute())
    out[FARM_JOB] = env.get("SLURM_JOB_ID", "")
    out[WORKDIR] = os.getcwd()
    for claim in STEP_CLAIMS:                  # a worker started inside a task or a rank: not this task's
        out.pop(claim, None)
    path = out.get("PYTHONPATH", "")             # kept as it is (an empty entry is the current directory)
    if path != INJECT and not path.startswith(INJECT + os.pathsep):
        out["PYTHONPATH"] = INJECT + (os.pathsep + path if path else "")
    if gpu is not None:
        for k in STEP_GPUS:
            out.pop(k, None)
        out["CUDA_VISIBLE_DEVICES"] = gpu
    return out


def attempt_environment(base: dict[str, str], tid: int, attempt: int) -> dict[str, str]:
    """One attempt's: its ids, its observe directory (observe/ID.A) and the task's own
    directory (tasks/ID, shared by its attempts: a retry resumes the task's own files)."""
    env = base.copy()
    env[TASK_ID] = str(tid)
    env[ATTEMPT] = str(attempt)
    env[OBSERVE_DIR] = f"{base[FARM_DIR]}/{OBSERVE}/{tid}.{attempt}"
    env[TASK_DIR] = f"{base[FARM_DIR]}/{TASK_DIRS}/{tid}"
    return env


@dataclass(frozen=True)
class FarmTask:
    """This process is (under) attempt ``attempt`` of task ``id`` of the farm at ``farm``."""

    farm: Path
    id: int
    attempt: int

    @property
    def run_dir(self) -> Path:
        """Where an ``hpcml run`` in this attempt keeps its job directory by default (the
        attempt's next runs: ``-1``, ``-2``... appended, ``hpcml.run.jobdir.default_dir``)."""
        return self.farm / RUNS / f"{self.id}.{self.attempt}"


def run_dirs(farm: Path, name: str) -> list[Path]:
    """The job directories of the ``hpcml run`` commands of attempt ``name`` (ID.A), first first."""
    base, found = farm / RUNS / name, list[Path]()
    while True:
        d = Path(f"{base}-{len(found)}") if found else base
        if not d.is_dir():
            return found
        found.append(d)


def current(env: Mapping[str, str] | None = None) -> FarmTask | None:
    """The farm task this process runs in, from the worker's variables; None outside one,
    and in a job that a task submitted (it inherited the variables, not the job)."""
    env = os.environ if env is None else env
    farm, tid, attempt = env.get(FARM_DIR), env.get(TASK_ID, ""), env.get(ATTEMPT, "")
    if not farm or not tid.isdigit() or not attempt.isdigit():
        return None
    if FARM_JOB in env and env[FARM_JOB] != env.get("SLURM_JOB_ID", ""):
        return None
    return FarmTask(Path(farm), int(tid), int(attempt))
