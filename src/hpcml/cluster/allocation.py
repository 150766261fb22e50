"""The allocation this process runs in, as plain data.

Read from the variables Slurm sets for a job and its tasks; outside Slurm the local
machine is a one-node allocation, so every component runs the same code in both places.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hpcml.cluster.hostlist import MAX_HOSTS
from hpcml.cluster.ranks import slurm_ranks


@dataclass(frozen=True)
class Allocation:
    """Where this process runs: the job, its nodes, and this task's place in it."""

    job_id: str | None
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    node: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    gpus: tuple[str, ...] = field(default_factory=tuple)
    under_slurm: bool = False
    step_id: str | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def node_index(self) -> int:
        return self.nodes.index(self.node) if self.node in self.nodes else 0


def step_order(nodes: Iterable[str], job_nodes: Sequence[str]) -> list[str]:
    """``nodes`` in the job's order (SLURM_JOB_NODELIST's, slurmctld's node order): srun
    numbers a step's nodes in it whatever order ``--nodelist`` gives, so the first is rank
    0's. Nodes the job does not list keep their order, after the others."""
    index = {n: i for i, n in enumerate(job_nodes)}
    return sorted(nodes, key=lambda n: index.get(n, len(index)))


def tasks_per_node(spec: str | None, num_nodes: int) -> tuple[int, ...]:
    """Expand Slurm's compressed task counts: ``"2(x3),1"`` -> ``(2, 2, 2, 1)``."""
    if not spec:
        return tuple([1] * num_nodes)
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*([0-9]{1,9})(?:\(x([0-9]{1,9})\))?\s*", part)
        repeat = int(m.group(2) or 1) if m else 0
        if not m or len(counts) + repeat > MAX_HOSTS:     # "1(x3000000000)": no node list is that long
            return tuple([1] * num_nodes)
        counts += [int(m.group(1))] * repeat
    return tuple(counts)


GPU_BINDINGS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def gpu_binding(env: Mapping[str, str]) -> tuple[str | None, tuple[str, ...]]:
    """``(variable, GPUs)`` that bind GPUs to this task, most specific source first;
    ``(None, ())`` when nothing binds any (then every visible GPU is the task's).

    SLURM_STEP_GPUS / SLURM_JOB_GPUS are the physical indices Slurm bound; without them
    CUDA_VISIBLE_DEVICES (indices or UUIDs) is what the process will see.
    """
    for var in GPU_BINDINGS:
        value = env.get(var, "").strip()
        if value and value.lower() not in ("none", "nodevfiles"):
            return var, tuple(v.strip() for v in value.split(",") if v.strip())
    return None, ()


def task_gpus(env: Mapping[str, str]) -> tuple[str, ...]:
    """GPUs bound to this task (see ``gpu_binding``); empty when none is bound."""
    return gpu_binding(env)[1]


def this_node(env: Mapping[str, str] | None = None) -> str:
    """This node's Slurm name; SLURMD_NODENAME tells virtual nodes of one host apart."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def current(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation seen from this process's environment."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    node = this_node(env)
    if not job_id:
        return Allocation(job_id=None, nodes=(node,), tasks_per_node=(1,), node=node,
                          gpus=task_gpus(env))
    who = slurm_ranks(env)
    from hpcml.cluster.hostlist import expand  # Slurm's order: srun numbers nodes in it
    nodes = tuple(expand(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or node))
    tpn = tasks_per_node(env.get("SLURM_TASKS_PER_NODE")
                          or env.get("SLURM_JOB_CPUS_PER_NODE"), len(nodes))
    if "SLURM_TASKS_PER_NODE" not in env:
        tpn = tuple([1] * len(nodes))
    return Allocation(
        job_id=job_id,
        nodes=nodes,
        tasks_per_node=tpn,
        node=node,
        rank=who.rank,
        local_rank=who.local_rank,
        world_size=who.world_size,
        gpus=task_gpus(env),
        under_slurm=True,
        step_id=env.get("SLURM_STEP_ID"),
    )
