"""``hpcml farm run``: one worker per slot on each node of the allocation.

Outside Slurm (or inside one srun task) this process is the node's agent: it starts one
worker per slot (each under a guard that kills it and its tasks' whole trees when the
agent dies: guard.py) and starts a new one for a worker that was killed. Under Slurm, in
the batch script, it is the coordinator: one ``srun`` step with one agent per node
(``hpcml farm agent``), each forking its node's slots.
Slots per node: ``slots``, else one per GPU (``gpus``, else the GPUs Slurm bound), else
the allocation's tasks per node (Slurm) or the CPU count (this machine). On a GPU slot
the worker sets CUDA_VISIBLE_DEVICES to that slot's one GPU.

The farm's state is only in the directory, so a run that dies is resumed by running
again, in this allocation or another, and several runs may share one farm at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcml.cluster import allocation, slurm
from hpcml.errors import HpcmlError, UsageError
from hpcml.farm import store
from hpcml.farm.worker import DONE, NODE_RETIRED, launch_argv
from hpcml.proctree import become_subreaper, die_with_parent, kill_orphans_while_alive

RESPAWNS_PER_SLOT = 3


@dataclass
class Plan:
    """Where the workers go."""

    mode: str                      # "local" or "slurm"
    nodes: tuple[str, ...]
    slots: tuple[int, ...]         # per node
    gpus: tuple[str, ...]          # per slot on a node (empty: no pinning)
    job: str | None


def gpu_list(gpus: int | None, env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The GPUs to pin, one per worker, as CUDA_VISIBLE_DEVICES values: ``gpus`` of them,
    else what this process sees (CUDA_VISIBLE_DEVICES: indices after Slurm's device
    cgroup renumbered them), else what Slurm bound (SLURM_STEP_GPUS, SLURM_JOB_GPUS)."""
    if gpus is not None:
        return tuple(str(i) for i in range(gpus))
    env = dict(os.environ) if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible.lower() not in ("none", "nodevfiles", "-1"):
        return tuple(v.strip() for v in visible.split(",") if v.strip())
    source, bound = allocation.gpu_binding(env)
    return _as_cuda(bound, source, env)


def _as_cuda(bound: tuple[str, ...], source: str | None, env: dict[str, str]) -> tuple[str, ...]:
    """Slurm's GPU numbers (``/dev/nvidiaN``'s N, not CUDA's ordinals: ``samplers.binding``)
    as UUIDs, which CUDA_VISIBLE_DEVICES takes as they are; without NVML here (or where it
    places none of them) the numbers stay, as on most nodes, where they agree."""
    from hpcml.samplers.binding import MINOR_SOURCES
    from hpcml.samplers.nvml import uuids_of
    if source not in MINOR_SOURCES or not bound:
        return bound
    try:
        uuids, _ = uuids_of(bound, source, env)
    except Exception:  # noqa: BLE001 - no driver or nvidia-ml-py: the numbers stay
        return bound
    if not any(uuids):
        return bound
    return tuple(u for u in uuids if u)          # a GPU NVML cannot place (lost) gets no slot


def plan(slots: int | None = None, gpus: int | None = None) -> Plan:
    alloc = allocation.current()
    bound = gpu_list(gpus)
    if slots is not None and slots < 1:
        raise UsageError("must be at least 1", key="slots")
    if alloc.under_slurm and alloc.step_id is None and slurm.available("srun"):
        per = tuple(slots or len(bound) or n for n in alloc.tasks_per_node)
        return Plan("slurm", alloc.nodes, per, bound, alloc.job_id)
    per_node = slots or len(bound) or os.cpu_count() or 1
    return Plan("local", (alloc.node,), (per_node,), bound, alloc.job_id)


Progress = Callable[[], None]
PROGRESS_S = 0.5


def run(path: str | os.PathLike, *, slots: int | None = None, gpus: int | None = None,
        overrides: dict[str, Any] | None = None, on_progress: Progress | None = None) -> Plan:
    """Run the farm until every task is final (or every node is retired); ``on_progress``
    is called every half second meanwhile (no thread: the caller's own loop)."""
    store.load(path, overrides)            # bad input ends here, before anything runs
    p = plan(slots, gpus)
    if p.mode == "slurm":
        _coordinate(Path(path), p, gpus, overrides or {}, on_progress)
    else:
        run_node(Path(path), p.slots[0], p.gpus, overrides, on_progress)
    return p


def _coordinate(path: Path, p: Plan, gpus: int | None, overrides: dict[str, Any],
                on_progress: Progress | None = None) -> None:
    argv = [sys.executable, "-m", "hpcml", "farm", "agent", str(path.absolute()),
            "--node-slots", ",".join(map(str, p.slots))]
    if gpus is not None:
        argv += ["--gpus", str(gpus)]
    for key, value in overrides.items():
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    cmd = slurm.srun_argv(argv, nodes=list(p.nodes), ntasks_per_node=1, extra=["--kill-on-bad-exit=0"])
    proc = subprocess.Popen(cmd, preexec_fn=die_with_parent)
    while on_progress is not None and proc.poll() is None:
        on_progress()
        time.sleep(PROGRESS_S)
    proc.wait()


def run_node(path: Path, slots: int, gpus: tuple[str, ...], overrides: dict[str, Any] | None = None,
             on_progress: Progress | None = None) -> int:
    """This node's agent: start ``slots`` workers and keep them going; 0 when they are done.

    The agent is a child subreaper (PR_SET_CHILD_SUBREAPER): should a worker's guard be
    killed on its own, what its task left behind is re-parented here and killed, group
    and all. A worker stopped by a full disk writes one line to a pipe; the first is
    raised here (once, not once per worker)."""
    store.load(path, overrides)
    node = allocation.this_node()
    job = allocation.current().job_id
    children: dict[int, int] = {}
    procs: dict[int, subprocess.Popen] = {}
    respawns = [0] * slots
    become_subreaper()
    report, report_w = os.pipe()

    def spawn(i: int) -> None:
        cfg = {"farm": str(path), "overrides": overrides or {}, "node": node, "job": job, "slot": i,
               "gpu": gpus[i % len(gpus)] if gpus else None, "report": report_w}
        proc = subprocess.Popen(launch_argv(cfg), preexec_fn=die_with_parent, pass_fds=(report_w,))
        children[proc.pid], procs[proc.pid] = i, proc

    for i in range(slots):
        spawn(i)
    results: list[int] = []
    while children:
        pid, status = os.waitpid(-1, 0 if on_progress is None else os.WNOHANG)
        if pid == 0 and on_progress is not None:
            on_progress()
            time.sleep(PROGRESS_S)
            continue
        i = children.pop(pid, -1)
        if i < 0:
            continue                       # an adopted orphan that ended
        procs.pop(pid).returncode = os.waitstatus_to_exitcode(status)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            kill_orphans_while_alive(set(children))    # a guard killed alone: its worker, its task
            if respawns[i] < RESPAWNS_PER_SLOT:   # killed: a new worker takes the slot
                respawns[i] += 1
                spawn(i)
                continue
        results.append(code)
    kill_orphans_while_alive(set())        # nothing adopted outlives the agent
    os.close(report_w)
    with os.fdopen(report, "rb") as f:
        lines = f.read().decode(errors="replace").splitlines()
    if lines:
        raise HpcmlError(lines[0])
    return DONE if all(c == DONE for c in results) else (NODE_RETIRED if NODE_RETIRED in results else 1)
