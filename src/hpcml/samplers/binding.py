"""Which of the node's GPUs a task's GPU binding names, as NVML sees them.

The numbers in a binding are not NVML indices, and reading them as such samples, or vets,
another job's GPU:

- ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS`` hold the number of each GPU's device file
  (``/dev/nvidiaN``; Slurm's ``gres_common.c`` writes ``dev_num`` into the global list),
  which NVML gives as the device's minor number. NVML's index follows the PCI bus and can
  differ (PrincetonUniversity/jobstats#34: ``/dev/nvidia0`` was nvidia-smi's GPU 6).
- ``CUDA_VISIBLE_DEVICES`` holds UUIDs (Slurm 25.11, or set by hand) or CUDA ordinals. An
  ordinal counts the GPUs this process can open: with Slurm's ``ConstrainDevices`` the job's
  own, renumbered from 0 (guilbaults/slurm-job-exporter#63). CUDA orders them by PCI bus
  where ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; its default (``FASTEST_FIRST``) agrees with the PCI
  bus where every GPU is the same model. Otherwise one ordinal cannot be placed without CUDA
  (left unmatched, said), but ordinals that count every GPU the process can open name them
  all, whatever their order. A MIG instance (``MIG-``) is not an NVML device of its own and
  matches nothing here (the samplers do not read MIG instances).
- ``ROCR_VISIBLE_DEVICES`` and ``GPU_DEVICE_ORDINAL`` number AMD GPUs: none of them is an
  NVIDIA GPU NVML shows.
- No binding (hpcml's own list of what NVML shows): NVML indices.

Inside a job's device cgroup ``nvmlDeviceGetCount`` still counts every GPU of the node; the
others answer ``NVML_ERROR_NO_PERMISSION`` and are not this task's (``inaccessible``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcml import logs

__all__ = ["CUDA_SOURCE", "MINOR_SOURCES", "Choice", "Device", "choose", "devices", "identify", "pick", "source_of"]

log = logs.get(__name__)

#: Slurm's variables whose numbers are device minor numbers
MINOR_SOURCES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
CUDA_SOURCE = "CUDA_VISIBLE_DEVICES"
AMD_SOURCES = ("ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
#: the shortest UUID prefix taken as naming one GPU (CUDA accepts unique prefixes)
MIN_PREFIX = 8


@dataclass(frozen=True)
class Device:
    """One GPU NVML lets this process open: its index and handle, and what names it."""

    index: int
    handle: Any = None
    uuid: str | None = None
    minor: int | None = None
    pci_bus_id: str | None = None
    name: str | None = None


@dataclass
class Choice:
    """The devices a binding names, the entries none matched, and how they were read."""

    devices: list[Device] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ask(nv: Any, fn: str, handle: Any) -> Any:
    """One identity query; None where NVML (or a recording standing in for it) has none."""
    call = getattr(nv, fn, None)
    if call is None:
        return None
    try:
        return call(handle)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: not known, not fatal
        return None


def identify(nv: Any, index: int, handle: Any) -> Device:
    """What names one GPU; a query NVML refuses leaves that name unknown."""
    uuid, minor = _ask(nv, "nvmlDeviceGetUUID", handle), _ask(nv, "nvmlDeviceGetMinorNumber", handle)
    pci, name = _ask(nv, "nvmlDeviceGetPciInfo", handle), _ask(nv, "nvmlDeviceGetName", handle)
    bus = getattr(pci, "busId", None) if pci is not None else None
    return Device(index=index, handle=handle, uuid=_text(uuid) if uuid is not None else None,
                  minor=int(minor) if isinstance(minor, int) else None,
                  pci_bus_id=_text(bus).upper() if bus is not None else None,
                  name=_text(name) if name is not None else None)


def devices(nv: Any) -> tuple[list[Device], list[int]]:
    """Every GPU this process can open, and the NVML indices it cannot: another job's in a
    device cgroup (NoPermission), or a GPU NVML gives no handle for (lost): neither can be
    sampled, and neither may stop the others being found."""
    out: list[Device] = []
    unopened: list[int] = []
    error = getattr(nv, "NVMLError", Exception)
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except error as exc:
            log.debug("NVML gives no handle for GPU %d: %s", i, exc)
            unopened.append(i)
            continue
        out.append(identify(nv, i, h))
    return out, unopened


def source_of(bound: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The variable ``bound`` came from (``cluster.allocation.gpu_binding``), or None where
    it is not the environment's binding (then its numbers are NVML indices)."""
    from hpcml.cluster.allocation import gpu_binding
    var, entries = gpu_binding(env)
    return var if var and bound and set(bound) <= set(entries) else None


def _by_uuid(devs: Sequence[Device], entry: str) -> Device | None:
    """CUDA's reading of a UUID entry: whole, without ``GPU-``, or a prefix naming one GPU."""
    want = entry.strip().lower()
    if not want.startswith(("gpu-", "mig-")):
        want = "gpu-" + want
    exact = [d for d in devs if d.uuid and d.uuid.lower() == want]
    if exact:
        return exact[0]
    if len(want) - len("gpu-") < MIN_PREFIX:
        return None
    prefixed = [d for d in devs if d.uuid and d.uuid.lower().startswith(want)]
    return prefixed[0] if len(prefixed) == 1 else None


def _cuda_order(devs: Sequence[Device], env: Mapping[str, str]) -> tuple[list[Device] | None, str | None]:
    """The devices in CUDA's order, and a note where that order is inferred; None where it
    cannot be known without CUDA (GPUs of several models, CUDA's default order)."""
    if len(devs) <= 1:
        return list(devs), None
    if any(d.pci_bus_id is None for d in devs):
        return None, "NVML gave no PCI bus id to order the GPUs as CUDA does"
    ordered = sorted(devs, key=lambda d: d.pci_bus_id or "")
    if env.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID":
        return ordered, None
    if len({d.name for d in devs}) == 1:
        return ordered, None           # FASTEST_FIRST among equals is the PCI bus order
    return None, ("CUDA_VISIBLE_DEVICES ordinals cannot be placed on a node with GPUs of "
                  "several models without CUDA_DEVICE_ORDER=PCI_BUS_ID")


def choose(devs: Sequence[Device], bound: Sequence[str], source: str | None,
           env: Mapping[str, str]) -> Choice:
    """The devices ``bound`` names, read as ``source`` writes them (``source_of``); every
    device where nothing is bound."""
    if not bound:
        return Choice(devices=list(devs))
    if source in AMD_SOURCES:
        return Choice(unmatched=[str(b).strip() for b in bound],
                      notes=[f"{source} numbers AMD GPUs, not the NVIDIA GPUs NVML shows"])
    every = sorted(str(i) for i in range(len(devs)))
    if source == CUDA_SOURCE and devs and sorted(str(b).strip() for b in bound) == every:
        return Choice(devices=list(devs))     # every GPU it can open: which is which does not matter
    out = Choice()
    ordered: list[Device] | None = None
    for entry in (str(b).strip() for b in bound):
        found: Device | None = None
        if not entry.isdigit():
            found = _by_uuid(devs, entry)
        elif source in MINOR_SOURCES and any(d.minor is not None for d in devs):
            found = next((d for d in devs if d.minor == int(entry)), None)
        elif source in MINOR_SOURCES:          # a recording from before minor numbers were kept
            found = next((d for d in devs if d.index == int(entry)), None)
            out.notes.append(f"no minor numbers known; {source}'s numbers taken as NVML indices")
        elif source == CUDA_SOURCE:
            if ordered is None:
                ordered, note = _cuda_order(devs, env)
                if note:
                    out.notes.append(note)
            if ordered is not None and int(entry) < len(ordered):
                found = ordered[int(entry)]
        else:
            found = next((d for d in devs if d.index == int(entry)), None)
        if found is None:
            out.unmatched.append(entry)
        elif found not in out.devices:
            out.devices.append(found)
    out.notes = list(dict.fromkeys(out.notes))
    return out


def pick(nv: Any, bound: Sequence[str], env: Mapping[str, str]) -> Choice:
    """The GPUs a sampler records: those of ``bound`` this process's NVML opens, with a note
    for the entries it cannot place (shared by the NVML and GPM samplers)."""
    found, _ = devices(nv)
    chosen = choose(found, bound, source_of(bound, env), env)
    if chosen.unmatched:
        chosen.notes.append(f"GPUs {chosen.unmatched} of this task are not GPUs NVML shows here; not recorded")
    return chosen
