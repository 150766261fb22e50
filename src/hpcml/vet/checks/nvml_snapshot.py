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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hpcml.files import JSON_MAX, load_json_bounded
from hpcml.samplers.binding import CUDA_SOURCE, Device, choose, identify, source_of
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
    minor: int | None = None           # /dev/nvidiaN's N: what Slurm's SLURM_*_GPUS name
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


def _identity(g: GpuInfo) -> Device:
    return Device(index=g.index, uuid=g.uuid, minor=g.minor, pci_bus_id=g.pci_bus_id, name=g.name)


def _known(g: GpuInfo) -> bool:
    """Whether anything but its NVML index names the GPU (a lost one may have nothing)."""
    return bool(g.uuid) or g.minor is not None


def select(snap: GpuSnapshot, ids: Sequence[str] | None,
           env: Mapping[str, str] | None = None) -> tuple[GpuSnapshot, list[str]]:
    """The snapshot limited to ``ids`` (the task's binding, read as ``samplers.binding``
    reads it: Slurm's device numbers, CUDA's ordinals or UUIDs, NVML indices where nothing
    binds), and the ids no GPU matched; how they were read goes to the snapshot's errors
    only where a GPU could not be placed.

    A lost GPU with nothing but its index to name it may be one of ``ids`` unless they are
    NVML indices: it becomes an error of the snapshot rather than silently dropped. Selected
    by NVML index, it is known not to be ours (and the live read never touches it).
    """
    wanted = [str(i).strip() for i in ids or [] if str(i).strip()]
    if not wanted:
        return snap, []
    env = os.environ if env is None else env
    source = source_of(wanted, env)
    by_index = source is None and all(w.isdigit() for w in wanted)
    placeable = [g for g in snap.gpus if by_index or _known(g) or not g.lost]
    chosen = choose([_identity(g) for g in placeable], wanted, source, env)
    picked = {d.index for d in chosen.devices}
    keep = [g for g in snap.gpus if g.index in picked and g in placeable]
    errors = list(snap.errors)
    # a lost GPU nothing names is another job's where every entry found its GPU, unless the
    # entries are CUDA ordinals (a GPU missing from the count moves them)
    if chosen.unmatched or (source == CUDA_SOURCE and any(w.isdigit() for w in wanted)):
        errors += [f"GPU at NVML index {g.index} lost: {g.error}" for g in snap.gpus if g not in placeable]
    if chosen.unmatched:
        errors += [n for n in chosen.notes if n not in errors]
    return GpuSnapshot(snap.driver_loaded, snap.driver_version, keep, errors,
                       list(snap.hidden), snap.taken_at), chosen.unmatched


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


def _read_gpu(nv, g: GpuInfo, handle) -> GpuInfo:
    """Every value of one GPU into ``g`` (its identity already read by ``_identify``)."""
    r = _Reader(nv, handle, g)
    try:
        if g.uuid is None:
            g.uuid = _opt(r.get("uuid", ("nvmlDeviceGetUUID",)), _s)
        if g.name is None:
            g.name = _opt(r.get("name", ("nvmlDeviceGetName",)), _s)
        if g.pci_bus_id is None:
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
    """Read all GPUs, or those ``indices`` (the task's binding, see ``select``) names."""
    return read_gpus(indices)[0]


def read_gpus(indices: Sequence[str] | None = None) -> tuple[GpuSnapshot, list[str]]:
    """Read all GPUs, or those ``indices`` names, and the entries of ``indices`` no GPU
    matched (``select``: selecting again would read CUDA's ordinals over the chosen GPUs).

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
        return GpuSnapshot(False, None, [], [f"nvmlInit: {e}"], taken_at=time.time()), []
    except nv.NVMLError as e:            # e.g. NVML/RM version mismatch: a broken node
        return GpuSnapshot(True, None, [], [f"nvmlInit: {e}"], taken_at=time.time()), []
    try:
        return _read_all(nv, indices)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _read_all(nv, indices: Sequence[str] | None) -> tuple[GpuSnapshot, list[str]]:
    snap = GpuSnapshot(True, taken_at=time.time())
    try:
        snap.driver_version = _s(nv.nvmlSystemGetDriverVersion())
    except nv.NVMLError as e:
        snap.errors.append(f"driver version: {e}")
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as e:
        snap.errors.append(f"device count: {e}")
        return snap, [str(i) for i in indices or []]
    wanted = [str(i).strip() for i in indices or [] if str(i).strip()]
    by_index = bool(wanted) and source_of(wanted, os.environ) is None and all(w.isdigit() for w in wanted)
    handles = {}
    for i in range(count):
        if by_index and str(i) not in wanted:
            continue                       # do not touch GPUs of other jobs
        try:
            handles[i] = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError_NoPermission:
            snap.hidden.append(i)
            continue
        except nv.NVMLError as e:
            snap.gpus.append(GpuInfo(index=i, lost=True, error=str(e)))
            continue
        snap.gpus.append(_identify(nv, i, handles[i]))
    snap, missing = select(snap, wanted)
    snap.gpus = [_read_gpu(nv, g, handles[g.index]) if not g.lost else g for g in snap.gpus]
    return snap, missing


def _identify(nv, index: int, handle) -> GpuInfo:
    """What names a GPU (UUID, minor number, PCI bus, model): read for every GPU this
    process may open, so that the task's binding can be placed before any value is read."""
    d = identify(nv, index, handle)
    return GpuInfo(index=index, uuid=d.uuid, name=d.name, pci_bus_id=d.pci_bus_id, minor=d.minor)


if __name__ == "__main__":     # record this node's GPUs for replay (HPCML_VET_NVML_REPLAY)
    import sys
    try:
        print(json.dumps(read_snapshot().to_dict(), indent=2))
    except MissingDependency as e:
        sys.exit(f"cannot read the GPUs: {e}")
