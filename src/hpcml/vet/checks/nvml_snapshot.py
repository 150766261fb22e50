"""One read of every GPU through NVML, as plain data that can be recorded and replayed.

This is the only module that talks to NVML (nvidia-ml-py's ``pynvml``, imported lazily so a
node without it still loads the vetting worker). Checks judge a :class:`GpuSnapshot`, never
NVML itself, so the same judging runs on a live node, on a snapshot recorded there
(``python -m hpcml.vet.checks.nvml_snapshot > node.json``) and in tests.

Reading is defensive because NVML answers per field: a field the GPU does not support
(``NVMLError_NotSupported``, e.g. retired pages on Ampere, row remapping before Ampere) is
``None`` and listed in ``unsupported``; any other field error is kept in ``field_errors``; a
GPU whose handle NVML cannot give (fallen off the bus) is recorded ``lost`` with the error.
A device NVML may not open (``NoPermission``: Slurm's device cgroup hides another job's GPU;
``nvmlDeviceGetCount_v2`` still counts it) is listed in ``hidden`` and not judged.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hpcml.files import JSON_MAX, load_json_bounded
from hpcml.vet.checks.base import MissingDependency


class NvmlLibraryMissing(MissingDependency):
    """pynvml is installed but libnvidia-ml.so.1 (part of the NVIDIA driver) is not."""


@dataclass
class GpuProcess:
    pid: int
    used_memory: int | None = None     # bytes; None where NVML cannot tell


@dataclass
class GpuInfo:
    """One GPU. Units are NVML's: C, bytes, milliwatts, MHz; None = not read."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False
    error: str | None = None
    temperature: int | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    retired_pages_pending: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    clocks_event_reasons: int | None = None
    power_mw: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    sm_clock_mhz: int | None = None
    processes: list[GpuProcess] | None = None
    unsupported: list[str] = field(default_factory=list)
    field_errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuInfo:
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if d.get("processes") is not None:
            d["processes"] = [GpuProcess(**p) for p in d["processes"]]
        return cls(**d)


@dataclass
class GpuSnapshot:
    driver_loaded: bool
    driver_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    hidden: list[int] = field(default_factory=list)
    taken_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuSnapshot:
        return cls(driver_loaded=bool(d["driver_loaded"]),
                   driver_version=d.get("driver_version"),
                   gpus=[GpuInfo.from_dict(g) for g in d.get("gpus", [])],
                   errors=list(d.get("errors", [])), hidden=list(d.get("hidden", [])),
                   taken_at=d.get("taken_at"))


def load_snapshot(path: str) -> GpuSnapshot:
    return GpuSnapshot.from_dict(load_json_bounded(path, JSON_MAX))


def _wanted(ids: Sequence[str] | None) -> set[str] | None:
    return None if not ids else {str(i).strip().lower() for i in ids}


def matches(gpu: GpuInfo, wanted: set[str]) -> bool:
    """Index (Slurm's SLURM_*_GPUS) or UUID, with or without ``GPU-`` (CUDA_VISIBLE_DEVICES)."""
    uuid = (gpu.uuid or "").lower()
    return str(gpu.index) in wanted or (bool(uuid) and (uuid in wanted or
                                                       uuid.removeprefix("gpu-") in wanted))


def select(snap: GpuSnapshot, ids: Sequence[str] | None) -> tuple[GpuSnapshot, list[str]]:
    """The snapshot limited to ``ids``, and the ids no GPU matched.

    A lost GPU has no UUID to match: when ``ids`` holds UUIDs it may be one of them, so it
    becomes an error of the snapshot rather than silently dropped. Selected by index, it is
    known not to be ours (and the live read never touches it).
    """
    wanted = _wanted(ids)
    if wanted is None:
        return snap, []
    by_index = all(w.isdigit() for w in wanted)
    keep, errors = [], list(snap.errors)
    for g in snap.gpus:
        if matches(g, wanted):
            keep.append(g)
        elif g.lost and not g.uuid and not by_index:
            errors.append(f"GPU at NVML index {g.index} lost: {g.error}")
    missing = [i for i in (ids or []) if not any(matches(g, {str(i).strip().lower()})
                                                for g in keep)]
    return GpuSnapshot(snap.driver_loaded, snap.driver_version, keep, errors,
                       list(snap.hidden), snap.taken_at), missing


#: Where a loaded NVIDIA driver shows itself, without NVML.
DRIVER_MARKERS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")


def driver_present() -> bool:
    """Whether this node has a loaded NVIDIA driver (so a failing NVML is an error)."""
    return any(os.path.exists(p) for p in DRIVER_MARKERS)


def _import_pynvml():
    try:
        import pynvml
    except ImportError:
        raise MissingDependency(
            "the GPU check needs nvidia-ml-py, a dependency of hpcml: pip install nvidia-ml-py") from None
    return pynvml


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Lost(Exception):
    pass


class _Reader:
    """Reads one GPU's fields, turning per-field NVML errors into data."""

    def __init__(self, nv, handle, info: GpuInfo) -> None:
        self.nv, self.h, self.info = nv, handle, info

    def get(self, name: str, *calls):
        """First of ``calls`` (fn name, args...) that the driver has; None if unsupported."""
        nv = self.nv
        for n, (fn_name, *args) in enumerate(calls, 1):
            fn = getattr(nv, fn_name, None)
            if fn is None:
                continue
            try:
                return fn(self.h, *args)
            except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
                continue                       # older driver or GPU: try the older call
            except nv.NVMLError_GpuIsLost as e:
                raise _Lost(str(e)) from None
            except nv.NVMLError as e:
                self.info.field_errors[name] = str(e)
                return None
            except Exception as e:             # e.g. NVMLLibraryMismatchError
                if n == len(calls):
                    self.info.field_errors[name] = f"{type(e).__name__}: {e}"
                    return None
        self.info.unsupported.append(name)
        return None


def _read_gpu(nv, index: int, handle) -> GpuInfo:
    g = GpuInfo(index=index)
    r = _Reader(nv, handle, g)
    try:
        g.uuid = _opt(r.get("uuid", ("nvmlDeviceGetUUID",)), _s)
        g.name = _opt(r.get("name", ("nvmlDeviceGetName",)), _s)
        pci = r.get("pci_bus_id", ("nvmlDeviceGetPciInfo",))
        g.pci_bus_id = _s(pci.busId) if pci is not None else None
        g.temperature = r.get("temperature",
                              ("nvmlDeviceGetTemperatureV", nv.NVML_TEMPERATURE_GPU),
                              ("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU))
        v2 = getattr(nv, "nvmlMemory_v2", None)
        mem = r.get("memory", *([("nvmlDeviceGetMemoryInfo", v2)] if v2 else []),
                    ("nvmlDeviceGetMemoryInfo",))
        if mem is not None:
            g.memory_total, g.memory_used = int(mem.total), int(mem.used)
        unc, cor = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        for attr, etype, ctype in (
                ("ecc_volatile_uncorrected", unc, nv.NVML_VOLATILE_ECC),
                ("ecc_volatile_corrected", cor, nv.NVML_VOLATILE_ECC),
                ("ecc_aggregate_uncorrected", unc, nv.NVML_AGGREGATE_ECC),
                ("ecc_aggregate_corrected", cor, nv.NVML_AGGREGATE_ECC)):
            setattr(g, attr, r.get(attr, ("nvmlDeviceGetTotalEccErrors", etype, ctype)))
        g.retired_pages_pending = _opt(r.get("retired_pages_pending",
                                             ("nvmlDeviceGetRetiredPagesPendingStatus",)), bool)
        for attr, cause in (
                ("retired_pages_sbe", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                ("retired_pages_dbe", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)):
            setattr(g, attr, _opt(r.get(attr, ("nvmlDeviceGetRetiredPages", cause)), len))
        rows = r.get("remapped_rows", ("nvmlDeviceGetRemappedRows",))
        if rows is not None:
            (g.remapped_rows_correctable, g.remapped_rows_uncorrectable,
             pending, failure) = rows
            g.remap_pending, g.remap_failure = bool(pending), bool(failure)
        g.clocks_event_reasons = r.get("clocks_event_reasons",
                                       ("nvmlDeviceGetCurrentClocksEventReasons",),
                                       ("nvmlDeviceGetCurrentClocksThrottleReasons",))
        g.power_mw = r.get("power_mw", ("nvmlDeviceGetPowerUsage",))
        g.pcie_gen = r.get("pcie_gen", ("nvmlDeviceGetCurrPcieLinkGeneration",))
        g.pcie_gen_max = r.get("pcie_gen_max", ("nvmlDeviceGetMaxPcieLinkGeneration",))
        g.pcie_width = r.get("pcie_width", ("nvmlDeviceGetCurrPcieLinkWidth",))
        g.pcie_width_max = r.get("pcie_width_max", ("nvmlDeviceGetMaxPcieLinkWidth",))
        g.sm_clock_mhz = r.get("sm_clock_mhz", ("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM))
        procs = r.get("processes", ("nvmlDeviceGetComputeRunningProcesses",),
                      ("nvmlDeviceGetComputeRunningProcesses_v2",))
        if procs is not None:
            g.processes = [GpuProcess(int(p.pid), None if p.usedGpuMemory is None
                                      else int(p.usedGpuMemory)) for p in procs]
    except _Lost as e:
        g.lost, g.error = True, str(e)
    return g


def _opt(v, conv):
    return None if v is None else conv(v)


def read_snapshot(indices: Sequence[str] | None = None) -> GpuSnapshot:
    """Read all GPUs, or those whose NVML index or UUID is in ``indices``.

    Raises MissingDependency when pynvml or libnvidia-ml is missing; a node where NVML
    reports no driver gives ``driver_loaded=False`` and no GPUs.
    """
    nv = _import_pynvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError_LibraryNotFound:
        raise NvmlLibraryMissing("libnvidia-ml.so.1 (NVIDIA driver's NVML library) "
                                 "not found") from None
    except nv.NVMLError_DriverNotLoaded as e:
        return GpuSnapshot(False, None, [], [f"nvmlInit: {e}"], taken_at=time.time())
    except nv.NVMLError as e:            # e.g. NVML/RM version mismatch: a broken node
        return GpuSnapshot(True, None, [], [f"nvmlInit: {e}"], taken_at=time.time())
    try:
        return _read_all(nv, indices)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _read_all(nv, indices: Sequence[str] | None) -> GpuSnapshot:
    snap = GpuSnapshot(True, taken_at=time.time())
    try:
        snap.driver_version = _s(nv.nvmlSystemGetDriverVersion())
    except nv.NVMLError as e:
        snap.errors.append(f"driver version: {e}")
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as e:
        snap.errors.append(f"device count: {e}")
        return snap
    wanted = _wanted(indices)
    by_index = wanted is not None and all(w.isdigit() for w in wanted)
    for i in range(count):
        if by_index and wanted is not None and str(i) not in wanted:
            continue                       # do not touch GPUs of other jobs
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError_NoPermission:
            snap.hidden.append(i)
            continue
        except nv.NVMLError as e:
            snap.gpus.append(GpuInfo(index=i, lost=True, error=str(e)))
            continue
        snap.gpus.append(_read_gpu(nv, i, handle))
    return select(snap, indices)[0]


if __name__ == "__main__":     # record this node's GPUs for replay (HPCML_VET_NVML_REPLAY)
    import sys
    try:
        print(json.dumps(read_snapshot().to_dict(), indent=2))
    except MissingDependency as e:
        sys.exit(f"cannot read the GPUs: {e}")
