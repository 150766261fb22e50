"""GpuCheck on recorded snapshots, and read_snapshot against a mock pynvml.

No GPU exists on the development machines. The judging tests replay the hand-written
snapshots in tests/fixtures/nvml (see its README) through HPCML_VET_NVML_REPLAY; the NVML
reading tests use a fake ``pynvml`` module object put into sys.modules. That fake is a
mock: it follows nvidia-ml-py's documented function names, return values and error
classes, and proves only that read_snapshot handles them, not that a real GPU answers so.
"""

from __future__ import annotations

import copy
import json
import sys
import types
from pathlib import Path

import pytest
from pydantic import ValidationError

from hpcml.vet.checks import nvml_snapshot
from hpcml.vet.checks.base import CheckContext, MissingDependency
from hpcml.vet.checks.gpu import REPLAY_ENV, GpuCheck
from hpcml.vet.checks.nvml_snapshot import (
    GpuSnapshot,
    NvmlLibraryMissing,
    load_snapshot,
    read_gpus,
    read_snapshot,
)
from hpcml.vet.model import Outcome

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
STRICT = {"count": 4, "max_temperature": 85, "max_memory_used_fraction": "5%"}
UUID3 = "GPU-e1f2a3b4-c5d6-4e7f-8091-a2b3c4d5e6f7"


@pytest.fixture(autouse=True)
def no_binding_of_the_callers(monkeypatch):
    """The suite may run inside a job or on a GPU machine: its own binding is not the tests'."""
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(var, raising=False)


def judge(monkeypatch, snapshot, ctx: CheckContext | None = None, **params):
    """Run GpuCheck on a sample file name or a snapshot dict, through the replay seam."""
    if isinstance(snapshot, dict):
        path = Path(monkeypatch.tmp) / "snap.json"
        path.write_text(json.dumps(snapshot))
    else:
        path = DATA / snapshot
    monkeypatch.setenv(REPLAY_ENV, str(path))
    check = GpuCheck(GpuCheck.Params(**{**STRICT, **params}), ctx or CheckContext(node="n1"))
    return check.run()


@pytest.fixture
def mp(monkeypatch, tmp_path):
    monkeypatch.tmp = tmp_path
    return monkeypatch


def healthy() -> dict:
    return json.loads((DATA / "healthy_4xa100.json").read_text())


# --- every recorded condition is found, and only it -------------------------------------

CASES = [
    ("healthy_4xa100.json", Outcome.PASS, 0, "4 GPUs healthy", None),
    ("gpu_lost.json", Outcome.FAIL, 1, "gpu2: lost (GPU is lost)", 2),
    ("hot_gpu.json", Outcome.FAIL, 1, "gpu1: temperature 91 C > 85 C", 1),
    ("ecc_uncorrected.json", Outcome.FAIL, 1, "gpu3: 2 uncorrected ECC errors > 0", 3),
    ("row_remap_pending.json", Outcome.FAIL, 1,
     "gpu0: row remapping pending (reset the GPU)", 0),
    ("pcie_downgrade.json", Outcome.FAIL, 1, "gpu2: PCIe gen3 x8 < max gen4 x16", 2),
    ("leftover_process.json", Outcome.FAIL, 1,
     "gpu1: 1 leftover process(es) (pid 48213 using 2.15 GB)", 1),
    ("hw_slowdown.json", Outcome.FAIL, 1, "gpu3: clocks throttled: hw_slowdown", 3),
]


@pytest.mark.parametrize("sample,outcome,value,message,bad_gpu", CASES,
                         ids=[c[0].removesuffix(".json") for c in CASES])
def test_recorded_condition_detected_alone(mp, sample, outcome, value, message, bad_gpu):
    r = judge(mp, sample)
    assert (r.outcome, r.value, r.message) == (outcome, value, message)
    flagged = [g["index"] for g in r.details["gpus"] if g["problems"]]
    assert flagged == ([] if bad_gpu is None else [bad_gpu])
    assert r.unit == "GPUs" and r.details["source"].startswith("replay:")


def test_thresholds_are_optional(mp):
    assert judge(mp, "hot_gpu.json", max_temperature=None).outcome is Outcome.PASS


def test_row_remap_pending_can_be_tolerated_but_failure_is_reported(mp):
    assert judge(mp, "row_remap_pending.json",
                 fail_on_row_remap_pending=False).outcome is Outcome.PASS
    snap = healthy()
    snap["gpus"][1]["remap_failure"] = True
    r = judge(mp, snap)
    assert r.message == "gpu1: row remapping failed (replace the GPU)"


def test_memory_limits_absolute_and_fraction(mp):
    r = judge(mp, "leftover_process.json", max_foreign_processes=None, max_memory_used="1 GB")
    assert (r.outcome, r.message) == (Outcome.FAIL, "gpu1: memory used 2.15 GB > 1 GB")
    r = judge(mp, "leftover_process.json", max_foreign_processes=None,
              max_memory_used_fraction="1%")
    assert r.message == "gpu1: memory used 2.5% > 1.0%"
    assert judge(mp, "leftover_process.json", max_foreign_processes=1).outcome is Outcome.PASS


def test_throttle_reason_can_warn_instead(mp):
    r = judge(mp, "hw_slowdown.json", throttle_fail=[], throttle_warn=["HwSlowdown"])
    assert (r.outcome, r.value) == (Outcome.WARN, 0)
    assert r.message == "gpu3: clocks throttled: hw_slowdown (warn)"


def test_bad_params_rejected():
    with pytest.raises(ValidationError, match="unknown throttle reason 'hw_slow'"):
        GpuCheck.Params(throttle_fail=["hw_slow"])
    with pytest.raises(ValidationError):
        GpuCheck.Params(max_temp=80)
    assert GpuCheck.Params(max_memory_used="2 GiB").max_memory_used == 2 * 2**30


def test_pcie_gen_is_not_judged_while_idle_but_width_is(mp):
    snap = healthy()
    snap["gpus"][0]["pcie_gen"] = 1                       # idle: clocks reason gpu_idle
    assert judge(mp, snap).outcome is Outcome.PASS
    assert judge(mp, snap, pcie_gen_when_idle=True).message == \
        "gpu0: PCIe gen1 x16 < max gen4 x16"
    snap["gpus"][0]["clocks_event_reasons"] = 0           # busy and still gen1: bad
    assert judge(mp, snap).message == "gpu0: PCIe gen1 x16 < max gen4 x16"
    r = judge(mp, "pcie_downgrade.json", pcie_min_gen=3, pcie_min_width=8)
    assert r.outcome is Outcome.PASS
    r = judge(mp, "pcie_downgrade.json", pcie_min_width=16)
    assert r.message == "gpu2: PCIe gen3 x8 < min gen4 x16"


def test_retired_pages_on_pre_ampere_gpu(mp):
    snap = healthy()
    snap["gpus"][2].update(retired_pages_sbe=3, retired_pages_dbe=2,
                           retired_pages_pending=True, remap_pending=None,
                           remap_failure=None, unsupported=["remapped_rows"])
    r = judge(mp, snap, max_retired_pages=4)
    assert r.message == ("gpu2: page retirement pending (reset the GPU), "
                         "5 retired pages > 4; not measured: retired pages (gpu0, gpu1, gpu3)")   # Ampere's
    snap["gpus"][2]["retired_pages_pending"] = False
    assert judge(mp, snap, max_retired_pages=5).outcome is Outcome.PASS


def test_gpu_count(mp):
    r = judge(mp, "healthy_4xa100.json", count=8)
    assert (r.outcome, r.value, r.message) == (Outcome.FAIL, 4, "4 GPUs found, 8 expected")
    r = judge(mp, "healthy_4xa100.json", count=2)
    assert (r.outcome, r.message) == (Outcome.WARN, "4 GPUs found, 2 expected")


def test_unreadable_field_warns(mp):
    snap = healthy()
    snap["gpus"][0]["temperature"] = None
    snap["gpus"][0]["field_errors"] = {"temperature": "Unknown Error"}
    r = judge(mp, snap)
    assert (r.outcome, r.message) == (
        Outcome.WARN, "gpu0: could not read temperature (Unknown Error) (warn)")


def test_failures_and_warnings_listed_per_gpu(mp):
    snap = healthy()
    snap["gpus"][1].update(temperature=90, ecc_volatile_uncorrected=1)
    snap["gpus"][3].update(clocks_event_reasons=0x4)
    r = judge(mp, snap)
    assert r.message == ("gpu1: temperature 90 C > 85 C, 1 uncorrected ECC errors > 0; "
                         "gpu3: clocks throttled: sw_power_cap (warn)")
    assert r.value == 1


# --- no GPU, and which GPUs -----------------------------------------------------------

def test_no_driver_is_skipped_unless_required(mp):
    r = judge(mp, "no_driver.json")
    assert (r.outcome, r.message) == (Outcome.SKIPPED, "no GPU (NVIDIA driver not loaded)")
    r = judge(mp, "no_driver.json", required=True)
    assert (r.outcome, r.message) == (Outcome.FAIL, "no GPU: NVIDIA driver not loaded")
    r = judge(mp, "no_driver.json", ctx=CheckContext(node="n1", require_gpus=True))
    assert r.outcome is Outcome.FAIL
    r = judge(mp, "no_driver.json", ctx=CheckContext(node="n1", gpus=("0",)))
    assert r.outcome is Outcome.SKIPPED          # ctx.gpus may be ROCR_VISIBLE_DEVICES (AMD)


def test_driver_without_gpus(mp):
    snap = {"driver_loaded": True, "driver_version": "550.54.15", "gpus": []}
    r = judge(mp, snap, count=None)
    assert (r.outcome, r.message) == (Outcome.SKIPPED, "no GPU (NVML sees none)")
    assert judge(mp, snap, count=None, required=True).outcome is Outcome.FAIL


def test_ctx_gpus_limit_the_check(mp):
    ctx = CheckContext(node="n1", gpus=("0", "1"))
    r = judge(mp, "gpu_lost.json", ctx=ctx, count=None)
    assert (r.outcome, r.message) == (Outcome.PASS, "2 GPUs healthy")
    r = judge(mp, "hw_slowdown.json", ctx=CheckContext(node="n1", gpus=(UUID3,)), count=None)
    assert (r.outcome, r.message) == (Outcome.FAIL, "gpu3: clocks throttled: hw_slowdown")
    assert [g["index"] for g in r.details["gpus"]] == [3]
    r = judge(mp, "healthy_4xa100.json", ctx=CheckContext(node="n1", gpus=("0", "7")),
              count=None)
    assert (r.outcome, r.value, r.message) == (Outcome.FAIL, 1, "GPU 7 not found")


def test_lost_gpu_without_uuid_fails_uuid_selection_where_it_may_be_the_tasks(mp):
    """A task's UUID no GPU shows may be the lost GPU's (it has none to match): an error.
    Where the task's UUID found its GPU, the lost one is another job's, and not the task's
    failure (it used to be: review finding)."""
    ctx = CheckContext(node="n1", gpus=("GPU-77777777-3f4b-4e6a-9c7d-1b2e3f4a5b60",))
    r = judge(mp, "gpu_lost.json", ctx=ctx, count=None)
    assert r.outcome is Outcome.FAIL and r.message.startswith("nvml: GPU at NVML index 2 lost: GPU is lost")
    ctx = CheckContext(node="n1", gpus=("GPU-5a8e2c1d-3f4b-4e6a-9c7d-1b2e3f4a5b60",))
    r = judge(mp, "gpu_lost.json", ctx=ctx, count=None)
    assert (r.outcome, r.message) == (Outcome.PASS, "1 GPUs healthy")


def test_snapshot_round_trip():
    snap = load_snapshot(str(DATA / "leftover_process.json"))
    assert snap.gpus[1].processes[0].pid == 48213
    again = GpuSnapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert again == snap


# --- NVML reading, against a mock pynvml ------------------------------------------------

def fake_pynvml(devices: dict, *, init_error: str | None = None, calls: list | None = None):
    """A module object shaped like nvidia-ml-py's pynvml, serving ``devices``.

    ``devices`` maps an index to a dict of answers, or to an error name for the handle.
    An answer that is an error name (a str starting with "E:") is raised.
    """
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        text = "Unknown Error"

        def __str__(self):
            return self.text

    nv.NVMLError = NVMLError
    for name, text in [("NotSupported", "Not Supported"), ("GpuIsLost", "GPU is lost"),
                       ("NoPermission", "Insufficient Permissions"),
                       ("DriverNotLoaded", "Driver Not Loaded"),
                       ("LibraryNotFound", "NVML Shared Library Not Found"),
                       ("FunctionNotFound", "Function Not Found"), ("Unknown", "Unknown Error")]:
        setattr(nv, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {"text": text}))
    # the documented enum values of nvml.h
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM = 0, 1
    nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC = 0, 1
    nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    nv.nvmlMemory_v2 = 0x02000028
    calls = calls if calls is not None else []

    def err(name):
        return getattr(nv, f"NVMLError_{name}")()

    def init():
        calls.append("init")
        if init_error:
            raise err(init_error)

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: calls.append("shutdown")
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nv.nvmlDeviceGetCount = lambda: len(devices)

    def handle(i):
        calls.append(("handle", i))
        if isinstance(devices[i], str):
            raise err(devices[i])
        return i

    nv.nvmlDeviceGetHandleByIndex = handle

    def answer(key):
        def fn(h, *args):
            v = devices[h].get((key, *args), devices[h].get(key, "E:NotSupported"))
            if isinstance(v, str) and v.startswith("E:"):
                raise err(v[2:])
            return v
        return fn

    for key in ["UUID", "Name", "PciInfo", "TemperatureV", "Temperature", "MemoryInfo",
                "TotalEccErrors", "RetiredPagesPendingStatus", "RetiredPages", "RemappedRows",
                "CurrentClocksEventReasons", "CurrentClocksThrottleReasons", "PowerUsage",
                "CurrPcieLinkGeneration", "MaxPcieLinkGeneration", "CurrPcieLinkWidth",
                "MaxPcieLinkWidth", "ClockInfo", "ComputeRunningProcesses", "MinorNumber"]:
        setattr(nv, f"nvmlDeviceGet{key}", answer(key))
    return nv


def full_device(**over) -> dict:
    ns = types.SimpleNamespace
    d = {"UUID": "GPU-aaaa", "Name": "NVIDIA A100-SXM4-80GB",
         "PciInfo": ns(busId=b"00000000:07:00.0"),
         "TemperatureV": "E:FunctionNotFound", "Temperature": 34,   # older driver: fallback
         "MemoryInfo": ns(total=85899345920, used=4718592),
         ("TotalEccErrors", 1, 0): 2, ("TotalEccErrors", 0, 0): 5,
         ("TotalEccErrors", 1, 1): 2, ("TotalEccErrors", 0, 1): 9,
         "RemappedRows": (0, 1, 1, 0), "CurrentClocksEventReasons": 0x9,
         "PowerUsage": 61234, "CurrPcieLinkGeneration": 4, "MaxPcieLinkGeneration": 4,
         "CurrPcieLinkWidth": 16, "MaxPcieLinkWidth": 16, "ClockInfo": 210,
         "ComputeRunningProcesses": [ns(pid=777, usedGpuMemory=1 << 30),
                                     ns(pid=778, usedGpuMemory=None)]}
    d.update(over)
    return d


def test_read_snapshot_with_mock_pynvml(monkeypatch):
    calls: list = []
    devices = {0: full_device(),
               1: "GpuIsLost",                                 # handle cannot be obtained
               2: {"UUID": "GPU-cccc", "Name": "Tesla V100-SXM2-32GB",   # old, sparse GPU
                   "PciInfo": types.SimpleNamespace(busId="00000000:3B:00.0"),
                   "Temperature": "E:Unknown", "RetiredPagesPendingStatus": 1,
                   ("RetiredPages", 0): [0x1000, 0x2000], ("RetiredPages", 1): [0x3000]},
               3: "NoPermission",                              # another job's GPU
               4: full_device(UUID="GPU-eeee", PowerUsage="E:GpuIsLost")}  # lost mid-read
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices, calls=calls))
    snap = read_snapshot(None)
    assert (snap.driver_loaded, snap.driver_version, snap.hidden) == (True, "550.54.15", [3])
    assert calls[0] == "init" and calls[-1] == "shutdown"
    g0, g1, g2, g4 = snap.gpus
    assert (g0.uuid, g0.pci_bus_id, g0.temperature, g0.memory_used) == \
        ("GPU-aaaa", "00000000:07:00.0", 34, 4718592)
    assert (g0.ecc_volatile_uncorrected, g0.ecc_volatile_corrected,
            g0.ecc_aggregate_uncorrected, g0.ecc_aggregate_corrected) == (2, 5, 2, 9)
    assert (g0.remap_pending, g0.remap_failure, g0.remapped_rows_uncorrectable) == \
        (True, False, 1)
    assert (g0.clocks_event_reasons, g0.power_mw, g0.sm_clock_mhz) == (0x9, 61234, 210)
    assert [(p.pid, p.used_memory) for p in g0.processes] == [(777, 1 << 30), (778, None)]
    assert g0.unsupported == ["retired_pages_pending", "retired_pages_sbe",
                              "retired_pages_dbe"] and not g0.field_errors
    assert (g1.index, g1.lost, g1.error, g1.uuid) == (1, True, "GPU is lost", None)
    assert (g2.retired_pages_pending, g2.retired_pages_sbe, g2.retired_pages_dbe) == \
        (True, 2, 1)
    assert g2.temperature is None and g2.field_errors == {"temperature": "Unknown Error"}
    assert g2.memory_total is None and g2.ecc_volatile_uncorrected is None
    assert "memory" in g2.unsupported and "processes" in g2.unsupported
    assert (g4.lost, g4.error, g4.uuid) == (True, "GPU is lost", "GPU-eeee")
    assert GpuSnapshot.from_dict(snap.to_dict()) == snap


def test_read_snapshot_by_index_leaves_other_gpus_alone(monkeypatch):
    calls: list = []
    devices = {0: full_device(), 1: full_device(UUID="GPU-bbbb"), 2: full_device(UUID="GPU-cccc")}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices, calls=calls))
    snap = read_snapshot(["1"])
    assert [g.uuid for g in snap.gpus] == ["GPU-bbbb"]
    assert [c for c in calls if isinstance(c, tuple)] == [("handle", 1)]
    snap = read_snapshot(["gpu-cccc"])                     # UUID, any case
    assert [g.index for g in snap.gpus] == [2]


def _no_binding(monkeypatch):
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", REPLAY_ENV):
        monkeypatch.delenv(var, raising=False)


def sound_device(**over) -> dict:
    """``full_device`` without its faults: no ECC error, no remap, no throttling, no process."""
    d = full_device(RemappedRows=(0, 0, 0, 0), CurrentClocksEventReasons=0, ComputeRunningProcesses=[])
    d.update({k: 0 for k in d if isinstance(k, tuple) and k[0] == "TotalEccErrors"})
    d.update(over)
    return d


def _judge_live(gpus: tuple[str, ...]):
    return GpuCheck(GpuCheck.Params(), CheckContext(node="n1", gpus=gpus)).run()


def test_slurms_gpu_numbers_are_device_minor_numbers_not_nvml_indices(monkeypatch):
    """SLURM_STEP_GPUS=0 is /dev/nvidia0, which NVML may index 2 (PrincetonUniversity/jobstats#34:
    /dev/nvidia0 was nvidia-smi's GPU 6): the task's GPU is judged, not another job's."""
    _no_binding(monkeypatch)
    bad = {"RemappedRows": (0, 3, 0, 1)}                       # a failed row remap: not ours
    devices = {0: sound_device(UUID="GPU-0000", MinorNumber=2, **bad),
               1: sound_device(UUID="GPU-1111", MinorNumber=3),
               2: sound_device(UUID="GPU-2222", MinorNumber=0),
               3: sound_device(UUID="GPU-3333", MinorNumber=1)}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices))
    monkeypatch.setenv("SLURM_STEP_GPUS", "0,1")
    snap, missing = read_gpus(["0", "1"])
    assert [g.uuid for g in snap.gpus] == ["GPU-2222", "GPU-3333"] and missing == []
    assert [g.minor for g in snap.gpus] == [0, 1] and snap.gpus[0].power_mw == 61234
    report = _judge_live(("0", "1"))
    assert report.outcome is Outcome.PASS, report.message


def test_a_job_local_cuda_ordinal_inside_a_device_cgroup_is_the_jobs_gpu(monkeypatch):
    """Slurm's ConstrainDevices: the job's one GPU is CUDA_VISIBLE_DEVICES=0 while NVML still
    counts the node's others and refuses them (NoPermission)."""
    _no_binding(monkeypatch)
    devices = {0: "NoPermission", 1: "NoPermission", 2: sound_device(UUID="GPU-2222", MinorNumber=2),
               3: "NoPermission"}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    snap, missing = read_gpus(["0"])
    assert ([g.uuid for g in snap.gpus], missing, snap.hidden) == (["GPU-2222"], [], [0, 1, 3])
    report = _judge_live(("0",))
    assert report.outcome is Outcome.PASS, report.message


def test_cuda_ordinals_follow_the_pci_bus_and_are_not_guessed_across_models(monkeypatch):
    _no_binding(monkeypatch)
    ns = types.SimpleNamespace
    devices = {0: full_device(UUID="GPU-b", PciInfo=ns(busId=b"00000000:B1:00.0"), MinorNumber=0),
               1: full_device(UUID="GPU-a", PciInfo=ns(busId=b"00000000:3B:00.0"), MinorNumber=1,
                              Name="NVIDIA H100 80GB HBM3")}      # NVML's order is not the bus's here
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    snap, missing = read_gpus(["0"])                # two models, CUDA's default order: unknown
    assert snap.gpus == [] and missing == ["0"]
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in e for e in snap.errors)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")     # both: which is which does not matter
    snap, missing = read_gpus(["0", "1"])
    assert sorted(g.uuid for g in snap.gpus) == ["GPU-a", "GPU-b"] and missing == [] and not snap.errors
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    snap, missing = read_gpus(["0"])
    assert [g.uuid for g in snap.gpus] == ["GPU-a"] and missing == []


def test_another_jobs_lost_gpu_does_not_fail_a_task_whose_gpus_were_all_found(monkeypatch):
    """Review finding: with Slurm's numbers every handle is opened to read its minor number,
    and a GPU NVML gives no handle for (lost, nothing names it) failed every task of the node."""
    _no_binding(monkeypatch)
    devices = {0: sound_device(UUID="GPU-0000", MinorNumber=0), 1: sound_device(UUID="GPU-1111", MinorNumber=1),
               2: "GpuIsLost"}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices))
    monkeypatch.setenv("SLURM_STEP_GPUS", "1")
    report = _judge_live(("1",))
    assert report.outcome is Outcome.PASS, report.message
    monkeypatch.setenv("SLURM_STEP_GPUS", "2")        # not found: the lost GPU may be it
    report = _judge_live(("2",))
    assert report.outcome is Outcome.FAIL and "GPU at NVML index 2 lost" in report.message
    monkeypatch.delenv("SLURM_STEP_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")   # an ordinal: a lost GPU moves the count
    assert "GPU at NVML index 2 lost" in _judge_live(("1",)).message


def test_read_snapshot_driver_not_loaded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({}, init_error="DriverNotLoaded"))
    snap = read_snapshot(None)
    assert (snap.driver_loaded, snap.gpus, snap.errors) == \
        (False, [], ["nvmlInit: Driver Not Loaded"])


def test_judging_a_live_read_through_the_mock(mp):
    """The whole path without replay: mock NVML -> snapshot -> verdict."""
    mp.delenv(REPLAY_ENV, raising=False)
    mp.setitem(sys.modules, "pynvml", fake_pynvml({0: full_device(), 1: "GpuIsLost"}))
    r = GpuCheck(GpuCheck.Params(), CheckContext(node="n1")).run()
    assert r.outcome is Outcome.FAIL and r.value == 2 and r.details["source"] == "nvml"
    assert r.message == ("gpu0: 2 uncorrected ECC errors > 0"
                         ", row remapping pending (reset the GPU), clocks throttled: "
                         "hw_slowdown, 2 leftover process(es) (pid 777 using 1.07 GB, "
                         "pid 778); gpu1: lost (GPU is lost)")


def test_missing_pynvml_raises_missing_dependency(mp, tmp_path):
    mp.delenv(REPLAY_ENV, raising=False)
    mp.setitem(sys.modules, "pynvml", None)                # import pynvml -> ImportError
    with pytest.raises(MissingDependency, match="nvidia-ml-py"):
        read_snapshot(None)
    (tmp_path / "nvidiactl").write_text("")
    mp.setattr(nvml_snapshot, "DRIVER_MARKERS", (str(tmp_path / "nvidiactl"),))
    with pytest.raises(MissingDependency, match="nvidia-ml-py"):
        GpuCheck(GpuCheck.Params(), CheckContext(node="n1")).run()


def test_no_driver_and_no_pynvml_is_no_gpu(mp, tmp_path):
    """A node without the NVIDIA driver has no GPU, whatever Python packages it lacks."""
    mp.delenv(REPLAY_ENV, raising=False)
    mp.setitem(sys.modules, "pynvml", None)
    mp.setattr(nvml_snapshot, "DRIVER_MARKERS", (str(tmp_path / "version"), str(tmp_path / "ctl")))
    r = GpuCheck(GpuCheck.Params(), CheckContext(node="n1")).run()
    assert (r.outcome, r.message) == (Outcome.SKIPPED, "no GPU (NVIDIA driver not loaded)")
    r = GpuCheck(GpuCheck.Params(required=True), CheckContext(node="n1")).run()
    assert r.outcome is Outcome.FAIL and "no GPU" in r.message


def test_missing_nvml_library(mp, tmp_path):
    mp.delenv(REPLAY_ENV, raising=False)
    mp.setitem(sys.modules, "pynvml", fake_pynvml({}, init_error="LibraryNotFound"))
    with pytest.raises(NvmlLibraryMissing, match="libnvidia-ml.so.1"):
        read_snapshot(None)
    check = GpuCheck(GpuCheck.Params(), CheckContext(node="n1"))
    mp.setattr(nvml_snapshot, "DRIVER_MARKERS", (str(tmp_path / "absent"),))   # no kernel driver either
    r = check.run()
    assert (r.outcome, r.message) == (Outcome.SKIPPED, "no GPU (NVIDIA driver not loaded)")
    (tmp_path / "version").write_text("NVRM version: 550.54.15\n")
    mp.setattr(nvml_snapshot, "DRIVER_MARKERS", (str(tmp_path / "version"),))  # driver, but no NVML
    with pytest.raises(MissingDependency):
        check.run()


def test_samples_differ_from_healthy_only_where_documented():
    """Guards the recorded data: each fault file changes one GPU of the healthy node."""
    base = healthy()
    for sample, *_rest, bad in CASES[1:]:
        snap = json.loads((DATA / sample).read_text())
        changed = [i for i, (a, b) in enumerate(zip(base["gpus"], snap["gpus"])) if a != b]
        assert changed == [bad], sample
        other = copy.deepcopy(snap)
        other["gpus"][bad] = base["gpus"][bad]
        assert other == base, sample


# --- a real snapshot ----------------------------------------------------------------------

def test_real_h100_snapshot_is_healthy_and_read_in_full(mp):
    """tests/fixtures/nvml/h100_idle.json was taken on a real idle H100 (not hand-written):
    PCIe gen5 x16, row remapping readable, retired pages unsupported (Hopper remaps rows)."""
    r = judge(mp, "h100_idle.json", count=1)
    assert (r.outcome, r.value, r.message) == (Outcome.PASS, 0, "1 GPUs healthy")
    gpu = r.details["gpus"][0]
    assert gpu["problems"] == []
    snap = load_snapshot(DATA / "h100_idle.json")
    g = snap.gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and (g.pcie_gen, g.pcie_width) == (5, 16)
    assert g.remap_pending is False and g.remapped_rows_uncorrectable == 0
    assert set(g.unsupported) == {"retired_pages_pending", "retired_pages_sbe", "retired_pages_dbe"}
    # the same GPU seen as four: the count is what fails
    r = judge(mp, "h100_idle.json", count=4)
    assert (r.outcome, r.message) == (Outcome.FAIL, "1 GPUs found, 4 expected")
    assert judge(mp, "h100_idle.json", count=1).details["gpus"][0]["clocks_event_reasons"] == ["gpu_idle"]


# --- a limit NVML gave no value for is named, never judged healthy -------------------------------

def test_limit_without_a_value_is_named_not_measured(mp):
    """Ampere does not retire pages (NVML: not supported), and a GPU may not report its
    temperature: a limit set on either is not judged, and "healthy" would claim it was."""
    r = judge(mp, "healthy_4xa100.json", max_retired_pages=0)
    assert (r.outcome, r.value) == (Outcome.PASS, 0)
    assert r.message == "4 GPUs: no problem in what was read; not measured: retired pages (gpu0, gpu1, gpu2, gpu3)"
    assert r.details["gpus"][0]["not_measured"] == ["retired pages"]
    snap = healthy()
    snap["gpus"][1].update(temperature=None, unsupported=snap["gpus"][1]["unsupported"] + ["temperature"])
    r = judge(mp, snap, max_temperature=85)
    assert r.message == "4 GPUs: no problem in what was read; not measured: temperature (gpu1)"
    r = judge(mp, snap, max_temperature=85, max_ecc_uncorrected=None, count=5)      # with a problem too
    assert r.message == "4 GPUs found, 5 expected; not measured: temperature (gpu1)"


def test_a_field_that_failed_to_read_is_one_warning_not_two(mp):
    snap = healthy()
    snap["gpus"][1].update(temperature=None, field_errors={"temperature": "Unknown Error"})
    r = judge(mp, snap)
    assert (r.outcome, r.message) == (Outcome.WARN, "gpu1: could not read temperature (Unknown Error) (warn)")
