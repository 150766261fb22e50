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


def test_a_port_probed_while_vetting_is_the_one_the_node_answered(monkeypatch):
    """``PortProbe`` asks rank 0's node in the background (its srun step is replaced here: the
    probe on the real cluster is in test_run_slurm.py, where the launcher runs under salloc);
    a failed probe is the step's own error, raised when the port is wanted."""
    import threading

    import pytest

    from hpcml.errors import SlurmError
    from hpcml.run.rendezvous import PortProbe
    go = threading.Event()

    def answer(node, python, timeout=60.0):
        go.wait(5)
        if node == "n9":
            raise SlurmError("srun on n9: no free port in its answer ('')")
        return 40001
    monkeypatch.setattr("hpcml.cluster.slurm.free_port_on", answer)
    probe, bad = PortProbe("n1", "python"), PortProbe("n9", "python")
    go.set()
    assert probe.port() == 40001 and probe.node == "n1"
    with pytest.raises(SlurmError, match="n9"):
        bad.port()
