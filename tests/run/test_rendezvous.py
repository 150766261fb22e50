"""``hpcml.run.rendezvous.task_env`` as a unit: the variables each srun task of a step gets.

The environments are what slurmstepd gives a task (SLURM_PROCID, SLURM_LOCALID,
SLURM_NODEID, SLURM_STEP_NUM_TASKS, SLURM_STEP_TASKS_PER_NODE in Slurm's compressed
form); the end-to-end runs are in test_run_slurm.py.
"""

from __future__ import annotations

from hpcml.cluster.ranks import ranks
from hpcml.run.rendezvous import task_env


def step(procid: int, localid: int, nodeid: int, per_node: str, ntasks: int) -> dict[str, str]:
    return {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid),
            "SLURM_NODEID": str(nodeid), "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_NTASKS": str(ntasks),
            "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_TASKS_PER_NODE": per_node}


def test_every_task_of_an_uneven_step_gets_its_own_node_s_local_world():
    """5 tasks on 2 nodes, block distribution: 3 on node 0, 2 on node 1."""
    layout = [(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 0, 1), (4, 1, 1)]
    envs = [task_env(step(p, loc, n, "3,2", 5)) for p, loc, n in layout]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3", "4"]
    assert {e["WORLD_SIZE"] for e in envs} == {"5"}
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["3", "3", "3", "2", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "0", "1"]


def test_compressed_counts_are_expanded():
    env = task_env(step(7, 1, 3, "2(x4)", 8))
    assert (env["LOCAL_WORLD_SIZE"], env["LOCAL_RANK"], env["RANK"]) == ("2", "1", "7")


def test_what_the_task_gets_is_the_rank_every_component_reads():
    env = step(4, 1, 1, "3,2", 5)
    inside = ranks({**env, **task_env(env)}, dist=False)
    assert (inside.rank, inside.world_size, inside.local_rank, inside.source) == (4, 5, 1, "RANK")
    assert ranks(env, dist=False).rank == inside.rank


def test_outside_an_srun_step_nothing_is_set():
    """In the batch script (no SLURM_STEP_ID) or outside Slurm the launcher sets everything."""
    assert task_env({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) == {}
    assert task_env({}) == {}


def test_each_vetting_worker_sends_a_port_its_node_has_free(monkeypatch):
    """Rank 0's rendezvous port comes from its node's vetting worker (no srun step of its
    own to ask the node while the launcher runs elsewhere, under salloc): each worker sends
    a port free on its node beside its results; the launcher keeps it with the node's
    report, and the vetting report itself does not carry it. The worker runs as the
    launcher starts it, here on this host in place of srun's node."""
    import json
    import socket
    import time

    from hpcml.vet.engine import _spec
    from hpcml.vet.launch import start_workers
    from hpcml.vet.protocol import loads
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    proto = loads("name: t\nevals:\n  - {name: e, type: env, absent: [HPCML_SURELY_UNSET]}\n")
    step = start_workers(["n1"], use_srun=False)
    step.send(_spec(proto, proto.evals, ["n1"], time.time() + 60, None))
    report = step.harvest(time.time() + 60).reports["n1"]
    assert isinstance(report.free_port, int) and 1024 <= report.free_port < 65536
    with socket.socket() as s:                            # free on the node: rank 0 can listen on it
        s.bind(("", report.free_port))
    assert "free_port" not in json.dumps(report.to_dict())
