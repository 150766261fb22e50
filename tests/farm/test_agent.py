"""Where the workers go: slots per node and the GPUs they pin."""

from __future__ import annotations

from hpcml.farm.agent import gpu_list, plan


def test_gpus_to_pin_are_what_the_process_sees_first():
    assert gpu_list(2, {}) == ("0", "1")
    assert gpu_list(None, {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "2,3"}) == ("0", "1")
    assert gpu_list(None, {"SLURM_JOB_GPUS": "2,3"}) == ("2", "3")
    assert gpu_list(None, {}) == ()


def test_outside_slurm_one_node_with_one_slot_per_gpu_or_per_cpu(monkeypatch):
    for key in [k for k in __import__("os").environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    p = plan(gpus=3)
    assert p.mode == "local" and p.slots == (3,) and p.gpus == ("0", "1", "2")
    assert plan(slots=5).slots == (5,) and plan(slots=5).gpus == ()


def test_slurms_gpu_numbers_are_pinned_as_the_uuids_nvml_gives_them(monkeypatch):
    """SLURM_JOB_GPUS=0 is /dev/nvidia0, which need not be CUDA's device 0: a worker pinned
    with CUDA_VISIBLE_DEVICES=0 could run on another job's GPU. NVML here is the H100
    recording's replay with minor numbers out of NVML's order (no driver on this machine)."""
    from hpcml.samplers import nvml
    from tests.samplers.test_binding import Node
    nv = Node()
    monkeypatch.setattr(nvml, "nvml_library", lambda env=None: nv)
    uuids = [nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    assert gpu_list(None, {"SLURM_JOB_GPUS": "0,1"}) == (uuids[2], uuids[3])
    assert gpu_list(None, {"SLURM_JOB_GPUS": "0,7"}) == (uuids[2],)      # no /dev/nvidia7: no slot
    nv.lost = (0,)                  # another job's GPU lost: still this slot's own GPUs
    assert gpu_list(None, {"SLURM_JOB_GPUS": "0,1"}) == (uuids[2], uuids[3])
