"""A task's GPU binding placed on the GPUs NVML shows, as each producer writes it.

No GPU exists here. The samplers run against ``hpcml.samplers.replay`` (a real H100's
recording behind nvidia-ml-py's own structures and errors), changed in two ways the real
driver shows on real nodes and the recording cannot: device minor numbers that are not
the NVML index (PrincetonUniversity/jobstats#34), and another job's GPUs that NVML counts
but refuses to open inside a device cgroup (NVML_ERROR_NO_PERMISSION).
"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from hpcml.samplers import binding, nvml
from hpcml.samplers.binding import Device, choose
from hpcml.samplers.gpm import GpmSampler
from hpcml.samplers.replay import ReplayNvml

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "gpm" / "gpm-h100.jsonl"
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def gpu(index: int, minor: int, bus: str, name: str = H100) -> Device:
    return Device(index=index, uuid=f"GPU-{index:04d}aaaa-0000", minor=minor,
                  pci_bus_id=f"00000000:{bus}:00.0", name=name)


NODE = [gpu(0, 2, "07"), gpu(1, 3, "0F"), gpu(2, 0, "47"), gpu(3, 1, "4E")]


class Node(ReplayNvml):
    """The recording on four GPUs whose /dev/nvidiaN numbers are not NVML's order, some of
    them another job's (``refused``)."""

    minors = (2, 3, 0, 1)

    def __init__(self, refused: tuple[int, ...] = ()) -> None:
        other = ReplayNvml.from_file(RECORDING, gpus=4)
        super().__init__(other.rows, gpus=4)
        self.refused = refused

    lost: tuple[int, ...] = ()

    def nvmlDeviceGetHandleByIndex(self, index: int):
        if index in self.refused:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().nvmlDeviceGetHandleByIndex(index)

    def nvmlDeviceGetMinorNumber(self, handle) -> int:
        return self.minors[self._check(handle)]


def test_slurms_numbers_are_minor_numbers():
    got = choose(NODE, ["0", "1"], "SLURM_STEP_GPUS", {})
    assert [d.index for d in got.devices] == [2, 3] and not got.unmatched
    assert [d.index for d in choose(NODE, ["1"], "SLURM_JOB_GPUS", {}).devices] == [3]


def test_without_a_binding_numbers_are_nvml_indices():
    assert [d.index for d in choose(NODE, ["0"], None, {}).devices] == [0]
    assert [d.index for d in choose(NODE, [], None, {}).devices] == [0, 1, 2, 3]


def test_uuids_whole_without_prefix_or_as_a_unique_prefix():
    assert choose(NODE, ["GPU-0002aaaa-0000"], "CUDA_VISIBLE_DEVICES", {}).devices[0].index == 2
    assert choose(NODE, ["0002aaaa-0000"], "CUDA_VISIBLE_DEVICES", {}).devices[0].index == 2
    assert choose(NODE, ["gpu-0003aaaa"], "CUDA_VISIBLE_DEVICES", {}).devices[0].index == 3
    short = choose(NODE, ["GPU-000"], "CUDA_VISIBLE_DEVICES", {})        # names four GPUs
    assert short.devices == [] and short.unmatched == ["GPU-000"]
    assert choose(NODE, ["MIG-0002aaaa-0000"], "CUDA_VISIBLE_DEVICES", {}).unmatched


def test_cuda_ordinals_count_what_this_process_may_open_in_pci_bus_order():
    # a device cgroup: the job's two GPUs, renumbered 0 and 1 by the PCI bus, which here is
    # not NVML's order (index 1 sits on bus 4E, index 3 on bus 0F)
    mine = [gpu(1, 3, "4E"), gpu(3, 1, "0F")]
    got = choose(mine, ["1", "0"], "CUDA_VISIBLE_DEVICES", {})
    assert [d.index for d in got.devices] == [1, 3] and not got.notes
    assert choose(mine, ["2"], "CUDA_VISIBLE_DEVICES", {}).unmatched == ["2"]


def test_cuda_ordinals_across_models_need_cuda_device_order():
    mixed = [gpu(0, 0, "B1"), gpu(1, 1, "3B", A100)]
    got = choose(mixed, ["0"], "CUDA_VISIBLE_DEVICES", {})
    assert got.devices == [] and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in got.notes[0]
    got = choose(mixed, ["0"], "CUDA_VISIBLE_DEVICES", {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [d.index for d in got.devices] == [1]
    # review finding: ordinals that count every GPU it can open name them all, in any order
    got = choose(mixed, ["1", "0"], "CUDA_VISIBLE_DEVICES", {})
    assert [d.index for d in got.devices] == [0, 1] and not got.unmatched and not got.notes


def test_amd_numbers_name_no_nvidia_gpu():
    got = choose(NODE, ["0"], "ROCR_VISIBLE_DEVICES", {})
    assert got.devices == [] and got.unmatched == ["0"] and "AMD" in got.notes[0]


def test_a_recording_without_minor_numbers_says_how_it_was_read():
    old = [Device(index=0, uuid="GPU-a"), Device(index=1, uuid="GPU-b")]
    got = choose(old, ["1"], "SLURM_STEP_GPUS", {})
    assert [d.index for d in got.devices] == [1] and "taken as NVML indices" in got.notes[0]


def test_source_is_the_environments_binding_only_for_its_own_entries():
    env = {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert binding.source_of(["1"], env) == "SLURM_STEP_GPUS"
    assert binding.source_of(["5"], env) is None                       # hpcml's own NVML list
    assert binding.source_of(["0"], {"CUDA_VISIBLE_DEVICES": "0"}) == "CUDA_VISIBLE_DEVICES"


def test_devices_skip_what_nvml_refuses_or_lost():
    found, unopened = binding.devices(Node(refused=(0, 1)))
    assert [d.index for d in found] == [2, 3] and unopened == [0, 1]
    assert [d.minor for d in found] == [0, 1]
    nv = Node()
    nv.lost = (1,)                  # review finding: one lost GPU hid every other GPU
    found, unopened = binding.devices(nv)
    assert [d.index for d in found] == [0, 2, 3] and unopened == [1]


@pytest.fixture
def node(monkeypatch):
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "HPCML_OBSERVE_NVML_REPLAY"):
        monkeypatch.delenv(var, raising=False)

    def use(nv: Node) -> Node:
        monkeypatch.setattr(nvml, "nvml_library", lambda env=None: nv)
        return nv
    return use


def test_the_nvml_sampler_samples_the_gpu_slurm_bound(node):
    node(Node())
    s = nvml.NvmlSampler(["0"], {"SLURM_STEP_GPUS": "0"})
    assert [i for i, _ in s.handles] == [2] and s.uuids == {"2": "GPU-00000000-0000-4000-8000-000000000002"}
    assert {row[-1] for row in s.sample(1)} == {2}
    s.close()


def test_the_nvml_sampler_inside_a_device_cgroup(node):
    """NVML refuses the node's other GPUs: before, the first refusal failed the sampler."""
    node(Node(refused=(0, 1, 3)))
    s = nvml.NvmlSampler(["0"], {"CUDA_VISIBLE_DEVICES": "0"})
    assert [i for i, _ in s.handles] == [2] and not s.notes
    s.close()
    s = nvml.NvmlSampler(["3"], {"SLURM_STEP_GPUS": "3"})             # minor 3 is NVML's 1: refused
    assert s.handles == [] and "not GPUs NVML shows here" in s.notes[0]
    s.close()


def test_the_gpm_sampler_samples_the_gpu_slurm_bound():
    s = GpmSampler(["1"], Node(), env={"SLURM_JOB_GPUS": "1"})
    assert [i for i, _ in s.gpus] == [3] and list(s.uuids) == ["3"]
    s.close()


def test_hpcmls_own_gpu_list_leaves_out_what_nvml_refuses(node):
    node(Node(refused=(1,)))
    assert nvml.visible_gpus({}) == (["0", "2", "3"], "NVML")
    lost = node(Node())
    lost.lost = (3,)
    assert nvml.visible_gpus({}) == (["0", "1", "2"], "NVML")
    node(Node(refused=(0, 1, 2, 3)))
    gpus, why = nvml.visible_gpus({})
    assert gpus == [] and "none of the 4 GPUs here can be opened" in why
