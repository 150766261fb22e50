"""Which of its node's GPUs a rank uses, as the GPU sees it, and which of them were lost.

Where GPUs are not bound to ranks (every rank sees every GPU of its node: CUDA_VISIBLE_DEVICES
unset, or SLURM_STEP_GPUS listing the node's GPUs for each task), the GPUs a recorder samples
are not its rank's: the first task of a node claims and records them all (``samplers.claim``),
and each rank picks its device itself (``torch.cuda.set_device(LOCAL_RANK)``: a convention,
not a proof). What proves a rank's GPU is the GPU: NVML lists the processes that hold a compute
context on it (``nvmlDeviceGetComputeRunningProcesses``, and MPS clients), and a GPU is the
rank's when one of them is the rank's command or descends from it (``/proc``; in a container
whose pids NVML does not show, nothing is proven). A rank that can see one GPU only
(``one_gpu``: bound to one, or one visible) needs no proof.

Each rank's recorder follows its own process tree (``UseTracker``), whether or not it records
the GPUs: it reads the clocks event reasons of the GPUs its rank uses for its heartbeat (the
live watch), and its metadata names them (``gpus_used``, ``UsedGpu``) for the report, which
credits the recorded GPU rows to the ranks that used the GPU (``hpcml.observe.gpuowners``).

A GPU lost (fallen off the bus: NVML's ``GPU_IS_LOST``) has no values from then on: what it
did is unknown, never "not throttled". The samplers record a ``LOST`` row for it each sample (``samplers.nvml``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcml import logs
from hpcml.proctree import descends_from
from hpcml.samplers.nvml import LOST, is_lost

__all__ = ["ALONE_KEY", "LOST", "GpuUse", "UseTracker", "UsedGpu", "alone_on_node", "is_lost", "one_gpu", "open_tracker",
           "owns_sampled"]

log = logs.get(__name__)

#: samples between two looks at the GPUs' processes once a GPU of the rank's is known
RESCAN = 30
#: the rank metadata's key for the GPUs its processes were seen on
USED_KEY = "gpus_used"
ALL_VISIBLE = "all visible GPUs"          # a rank's gpu_binding where nothing binds GPUs (samplers.choose)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def one_gpu(meta: Mapping[str, Any]) -> bool:
    """Whether a rank (its rank-NNNNN.json metadata) could see one GPU only, so that the GPU
    its recorder sampled is the one it used: bound to one (``gpus``: SLURM_STEP_GPUS,
    CUDA_VISIBLE_DEVICES), or bound to none with one GPU visible on its node."""
    gpus = meta.get("gpus")
    if isinstance(gpus, list) and gpus:
        return len(gpus) == 1
    label = meta.get("gpu_sampler")
    if meta.get("gpu_binding") != ALL_VISIBLE or not isinstance(label, Mapping):
        return False
    sampled, other = label.get("gpus"), label.get("not_claimed") or []
    if not isinstance(sampled, list) or not isinstance(other, list):
        return False                    # "all": every GPU DCGM supports, not counted
    return len({str(g) for g in [*sampled, *other]}) == 1


#: the rank metadata's key: whether the launcher started this rank alone on its node
ALONE_KEY = "alone_on_node"


def alone_on_node(env: Mapping[str, str]) -> bool | None:
    """Whether the launcher started one task on this node (then every GPU the task's recorder
    samples is its rank's): torchrun's ``LOCAL_WORLD_SIZE``, else Slurm's
    ``SLURM_STEP_TASKS_PER_NODE`` (``1(x4)``, or ``2,1``: one count per node run-length coded;
    alone only where every node has one). None where neither says."""
    local = env.get("LOCAL_WORLD_SIZE", "").strip()
    if local.isdigit():
        return int(local) == 1
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
    if not per_node:
        return None
    counts = [part.split("(", 1)[0].strip() for part in per_node.split(",")]
    if not all(c.isdigit() for c in counts):
        return None
    return all(int(c) == 1 for c in counts)


def owns_sampled(meta: Mapping[str, Any]) -> bool:
    """Whether every GPU a rank's recorder sampled is the rank's own without NVML's proof:
    it could see one GPU only (``one_gpu``), or the launcher started it alone on its node
    (``ALONE_KEY``, from ``alone_on_node``)."""
    return one_gpu(meta) or meta.get(ALONE_KEY) is True


@dataclass(frozen=True)
class UsedGpu:
    """A GPU a rank's processes held a compute context on: its NVML index on the rank's node
    and its UUID (None where NVML did not give it)."""

    index: int
    uuid: str | None = None

    def to_json(self) -> dict[str, int | str | None]:
        return {"index": self.index, "uuid": self.uuid}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> list[UsedGpu]:
        """The ``gpus_used`` of a rank's metadata; what is not one (a file the job's own
        program may have written) is left out."""
        out = []
        found = meta.get(USED_KEY)
        for g in found if isinstance(found, list) else []:
            if isinstance(g, Mapping) and isinstance(g.get("index"), int) and not isinstance(g["index"], bool):
                uuid = g.get("uuid")
                out.append(cls(g["index"], uuid if isinstance(uuid, str) and uuid else None))
        return out


@dataclass(frozen=True)
class GpuUse:
    """One look at the rank's GPUs: ``used``, those its processes were seen on so far (NVML
    index -> GPU); ``reasons``, each one's clocks event reasons read now (absent: not read);
    ``lost``, those NVML says are lost."""

    used: dict[int, UsedGpu]
    reasons: dict[int, int]
    lost: frozenset[int]


class UseTracker:
    """Which GPUs of the node a rank's processes (``root`` and its descendants) use, through
    NVML; ``nv``: pynvml or a stand-in (``samplers.replay``). Every GPU is looked at while none
    is found, then every ``RESCAN`` samples; the reasons of the GPUs found, every sample."""

    def __init__(self, nv: Any, root: int, descends: Callable[[int, int], bool] = descends_from) -> None:
        self.nv, self.root, self.descends = nv, root, descends
        self.gpus: list[tuple[int, Any, str | None]] = []        # (index, handle, UUID)
        self.used: dict[int, UsedGpu] = {}
        self.lost: set[int] = set()
        self._until_scan = 0
        nv.nvmlInit()
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                except nv.NVMLError:
                    continue                 # hidden from this process, or lost before it looked: never proven
                try:
                    uuid: str | None = _text(nv.nvmlDeviceGetUUID(h))
                except nv.NVMLError:
                    uuid = None
                self.gpus.append((i, h, uuid))
        except BaseException:
            self.close()
            raise

    def _pids(self, handle: Any) -> set[int] | None:
        """The pids with a compute context on a GPU (MPS clients too); None when NVML cannot
        say. A lost GPU raises."""
        nv, said = self.nv, False
        out: set[int] = set()
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                procs = fn(handle)
            except nv.NVMLError as exc:
                if is_lost(nv, exc):
                    raise
                continue
            said = True
            out.update(int(p.pid) for p in procs if getattr(p, "pid", None) is not None)
        return out if said else None

    def _mine(self, pid: int) -> bool:
        return pid == self.root or self.descends(pid, self.root)

    def _scan(self) -> None:
        nv = self.nv
        for i, h, uuid in self.gpus:
            if i in self.used or i in self.lost:
                continue
            try:
                pids = self._pids(h)
            except nv.NVMLError:
                self.lost.add(i)             # whose it was is unknown: it proves no rank's
                continue
            if pids and any(self._mine(p) for p in pids):
                self.used[i] = UsedGpu(i, uuid)
                log.debug("hpcml observe record: GPU %d (%s) is this rank's: its process %d holds a context on it",
                          i, uuid, self.root)

    def sample(self) -> GpuUse:
        nv = self.nv
        if self._until_scan <= 0:
            self._scan()
            self._until_scan = RESCAN if self.used else 1
        self._until_scan -= 1
        read = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons: dict[int, int] = {}
        for i, h, _ in self.gpus:
            if i not in self.used or i in self.lost:
                continue
            try:
                reasons[i] = int(read(h))
            except nv.NVMLError as exc:
                if is_lost(nv, exc):
                    self.lost.add(i)         # else: not read this time
        return GpuUse(dict(self.used), reasons, frozenset(self.lost))

    def close(self) -> None:
        from hpcml.samplers.nvml import shutdown
        shutdown(self.nv)


def open_tracker(root: int, env: Mapping[str, str] | None = None) -> UseTracker | None:
    """A tracker of ``root``'s GPUs, or None where NVML cannot be read (no driver, no
    nvidia-ml-py) or an NVML replay stands for the driver (either: they record no
    processes, so a tracker would prove nothing and only add a second replay's reads)."""
    from hpcml.samplers.nvml import REPLAY_ENV, nvml_library
    env = os.environ if env is None else env
    if env.get("HPCML_OBSERVE_NVML_REPLAY") or env.get(REPLAY_ENV):
        return None
    try:
        nv = nvml_library(env)
        return UseTracker(nv, root)
    except Exception as exc:  # noqa: BLE001 - no driver, no nvidia-ml-py, NVML refused: nothing proven
        log.debug("hpcml observe record: which GPUs the rank uses is not followed (%s%s: %s)",
                  "replay: " if env.get(REPLAY_ENV) else "", type(exc).__name__, exc)
        return None
