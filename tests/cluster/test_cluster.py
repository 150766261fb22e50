import pytest

from hpcml.cluster import allocation
from hpcml.cluster.hostlist import expand, fold
from hpcml.errors import UsageError


def test_hostlist_roundtrip():
    assert expand("n[1-3],gpu[007-008]") == ["n1", "n2", "n3", "gpu007", "gpu008"]     # Slurm's order
    assert fold(["n1", "n2", "n3", "n5"]) == "n[1-3,5]"
    assert fold([]) == "" and expand("") == []


def test_bad_hostlist_is_usage_error():
    with pytest.raises(UsageError):
        expand("n[1-")


def test_allocation_from_slurm_env():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "SLURMD_NODENAME": "n2",
           "SLURM_TASKS_PER_NODE": "2(x2),1", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
           "SLURM_NTASKS": "5", "SLURM_STEP_GPUS": "2,3"}
    a = allocation.current(env)
    assert a.job_id == "42" and a.nodes == ("n1", "n2", "n3") and a.node == "n2"
    assert a.tasks_per_node == (2, 2, 1) and a.rank == 3 and a.local_rank == 1
    assert a.world_size == 5 and a.gpus == ("2", "3") and a.under_slurm and a.node_index == 1


def test_gpus_fall_back_to_cuda_visible_devices():
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "SLURMD_NODENAME": "n1",
           "CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    assert allocation.current(env).gpus == ("GPU-aaaa", "GPU-bbbb")


def test_single_node_fallback_outside_slurm():
    a = allocation.current({"SLURMD_NODENAME": "here"})
    assert a.job_id is None and a.nodes == ("here",) and not a.under_slurm and a.world_size == 1


@pytest.mark.slurm
def test_job_state_running_gone_and_unknown(slurm_cluster, slurm_env, monkeypatch):
    """Against the local cluster: a running job is ALIVE, a job Slurm never had is "",
    and without a reachable Slurm the answer is None (cannot tell), not "gone"."""
    import subprocess

    from hpcml.cluster import slurm
    job = subprocess.run(["sbatch", "--parsable", "--nodes=1", "-o", "/dev/null", "--wrap", "sleep 300"],
                         capture_output=True, text=True, env=slurm_env, timeout=30, check=True).stdout.strip()
    try:
        state = slurm.job_state(job)
        assert state in slurm.ALIVE and state in ("PENDING", "CONFIGURING", "RUNNING")
        assert slurm.job_state("987654") == ""
        monkeypatch.setenv("PATH", "/nonexistent")
        assert slurm.job_state(job) is None
    finally:
        subprocess.run(["scancel", job], env=slurm_env, timeout=30)


def test_a_task_count_repeated_past_any_node_list_is_not_expanded():
    """``SLURM_TASKS_PER_NODE="1(x3000000000)"`` made a list of 3e9 (MemoryError): it is
    read as the fallback, one task a node, like any other value Slurm does not write."""
    from hpcml.cluster.allocation import tasks_per_node
    assert tasks_per_node("1(x3000000000)", 2) == (1, 1)
    assert tasks_per_node("2(x3),1", 4) == (2, 2, 2, 1)
