"""Which GPUs a rank uses, as NVML sees it (``hpcml.samplers.gpuuse``), and a GPU lost (fallen
off the bus) said as such by the samplers, on a stand-in for NVML that raises nvidia-ml-py's own
errors (no GPU here). The processes are real: this test's and a child of it, matched through
/proc as on a node."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from hpcml.samplers.gpuuse import LOST, UsedGpu, UseTracker, one_gpu
from hpcml.samplers.nvml import read_device

LOST_ERROR = pynvml.NVML_ERROR_GPU_IS_LOST


class FakeNvml:
    """GPUs 0..n-1: ``procs[i]`` the pids on GPU i (an int: the NVML error it raises instead),
    ``reasons[i]`` its clocks event reasons (an int error code in ``lost`` raises instead)."""

    def __init__(self, procs: dict[int, list[int] | int], reasons: dict[int, int]) -> None:
        self.procs, self.reasons = procs, reasons
        self.lost: set[int] = set()
        self.shut = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "NVMLError")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _check(self, h: int) -> int:
        if h in self.lost:
            raise pynvml.NVMLError(LOST_ERROR)
        return h

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.procs)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{self._check(h)}"

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        got = self.procs[self._check(h)]
        if isinstance(got, int):
            raise pynvml.NVMLError(got)
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in got]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self.reasons[self._check(h)]


@pytest.fixture
def child():
    """A process of this test's tree: what a rank's command starts (a DataLoader worker, a
    launcher's child) and what holds the CUDA context."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


def test_the_rank_s_gpu_is_the_one_nvml_shows_a_process_of_its_tree_on(child):
    """Four GPUs of a node: GPU 1 runs a child of the rank's command, GPU 0 another process
    (init, not the rank's), GPU 3's NVML cannot list processes. The rank's GPU is 1, and only
    its reasons are read (GPU 0 is held back for heat: not the rank's)."""
    import os
    nv = FakeNvml({0: [1], 1: [child], 2: [], 3: pynvml.NVML_ERROR_NOT_SUPPORTED},
                  {0: 0x40, 1: 0x1, 2: 0x0, 3: 0x40})
    use = UseTracker(nv, os.getpid()).sample()
    assert use.used == {1: UsedGpu(1, "GPU-1")} and use.reasons == {1: 0x1} and not use.lost
    alone = UseTracker(nv, child).sample()          # the command itself holds the context
    assert alone.used == {1: UsedGpu(1, "GPU-1")}
    assert UseTracker(FakeNvml({0: [1]}, {0: 0}), os.getpid()).sample().used == {}    # nothing of its: unproven


def test_a_gpu_of_the_rank_s_that_falls_off_the_bus_is_said_lost(child):
    import os
    nv = FakeNvml({0: [child], 1: [1]}, {0: 0x4, 1: 0x0})
    t = UseTracker(nv, os.getpid())
    assert t.sample().reasons == {0: 0x4}
    nv.lost.add(0)
    after = t.sample()
    assert after.lost == frozenset({0}) and after.reasons == {} and 0 in after.used
    t.close()
    assert nv.shut == 1


def test_read_device_of_a_lost_gpu_is_lost_and_no_value():
    """Every read of a GPU that fell off the bus raises GPU_IS_LOST: the device's values are
    ``gpu_lost`` alone, not a row of missing values that reads as an idle, unthrottled GPU."""
    nv = FakeNvml({0: []}, {0: 0})
    nv.lost.add(0)
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature", "nvmlDeviceGetTotalEnergyConsumption"):
        setattr(nv, name, lambda h, *a: nv._check(h))
    assert read_device(nv, 0) == {LOST: 1.0}
    nv.lost.clear()
    assert read_device(nv, 0)["clocks_event_reasons"] == 0


def test_the_gpm_sampler_says_a_lost_gpu(monkeypatch, tmp_path):
    """The GPM sampler on the H100 replay: when the GPU's GPM sample raises GPU_IS_LOST, a
    ``gpu_lost`` row for it, not an interval without rows."""
    from pathlib import Path

    from hpcml.samplers.gpm import GpmSampler
    from hpcml.samplers.replay import ReplayNvml
    replay = ReplayNvml.from_file(Path(__file__).parents[1] / "fixtures" / "gpm" / "gpm-h100.jsonl")
    now = [0]

    def clock() -> int:
        now[0] += 500_000_000
        return now[0]
    s = GpmSampler([], replay, clock=clock)
    assert any(r[2] == "sm_active" for r in s.sample())

    def lost(*a):
        raise pynvml.NVMLError(LOST_ERROR)
    monkeypatch.setattr(replay, "nvmlGpmSampleGet", lost, raising=False)
    rows = s.sample()
    assert [(r[2], r[3], r[5]) for r in rows] == [(LOST, 1.0, 0)]
    s.close()


@pytest.mark.parametrize("meta, one", [
    ({"gpus": ["3"]}, True),                                                      # bound to one
    ({"gpus": ["0", "1"]}, False),                                                # SLURM_STEP_GPUS: the node's
    ({"gpus": [], "gpu_binding": "all visible GPUs", "gpu_sampler": {"gpus": ["0"]}}, True),     # one visible
    ({"gpus": [], "gpu_binding": "all visible GPUs", "gpu_sampler": {"gpus": ["0", "1"]}}, False),
    ({"gpus": [], "gpu_binding": "all visible GPUs", "gpu_sampler": {"gpus": ["0"], "not_claimed": ["1"]}}, False),
    ({"gpus": [], "gpu_binding": "all visible GPUs", "gpu_sampler": {"gpus": "all"}}, False),
    ({}, False),
])
def test_a_rank_that_can_see_one_gpu_only_needs_no_proof(meta, one):
    assert one_gpu(meta) is one


@pytest.mark.parametrize("env, alone", [
    ({"LOCAL_WORLD_SIZE": "1"}, True),
    ({"LOCAL_WORLD_SIZE": "4", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, False),     # torchrun's workers come first
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x4)"}, True),
    ({"SLURM_STEP_TASKS_PER_NODE": "1"}, True),
    ({"SLURM_STEP_TASKS_PER_NODE": "2,1"}, False),
    ({"SLURM_STEP_TASKS_PER_NODE": "x"}, None),
    ({}, None),
])
def test_a_rank_the_launcher_started_alone_on_its_node_owns_what_it_samples(env, alone):
    from hpcml.samplers.gpuuse import ALONE_KEY, alone_on_node, owns_sampled
    assert alone_on_node(env) is alone
    meta = {"gpus": ["0", "1"], ALONE_KEY: alone_on_node(env)}
    assert owns_sampled(meta) is (alone is True)
