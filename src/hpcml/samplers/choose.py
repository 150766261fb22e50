"""Which GPU sampler a recording uses, and the label that says what its data can show.

- ``dcgm``: DCGM's profiling fields; the saturation score can be computed. Required: no
  reachable host engine is an error that says why.
- ``gpm``: the same kind of metrics through NVML's GPU Performance Monitoring (Hopper and
  newer), no host engine needed; saturation too.
- ``nvml``: NVML's utilisation, power and clocks. NVML's utilisation is *temporal* (some
  kernel ran during the window), so the recording is labelled "temporal utilisation only,
  no saturation".
- ``auto``: DCGM if a host engine answers, else GPM if the GPUs support it, else NVML,
  else no GPU metrics.
- ``none``: no GPU metrics.

The label goes into the rank's metadata as ``gpu_sampler`` =
``{"kind": "dcgm"|"gpm"|"nvml"|"none", "saturation": bool, "note": str}``; the store
importer reads it back. ``for_task`` adds the node-local GPU claims (``hpcml.samplers.claim``)
so each GPU of a node is recorded by one task only.

Which GPUs are the task's: those Slurm bound (``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``), else
``CUDA_VISIBLE_DEVICES``; with no binding at all (a workstation, a cloud VM, a site that does
not bind GPUs through gres) every GPU the process can see, and the rank's metadata says
``gpu_binding: "all visible GPUs"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcml.errors import UsageError
from hpcml.registry import Registry
from hpcml.samplers import CLAIMED, NONE_VISIBLE, OFF, UNAVAILABLE, SamplerUnavailable, gpuuse
from hpcml.samplers.nvml import NVML_NOTE

__all__ = ["AUTO", "NVML_NOTE", "SAMPLERS", "TaskGpus", "choose_gpu_sampler", "for_task", "modes"]

#: GPU sampler name -> ``open(gpus, interval, env) -> (sampler, label)``, which raises
#: SamplerUnavailable saying why it cannot be used here
SAMPLERS: Registry[Callable[..., tuple[Any, dict]]] = Registry("GPU sampler", "hpcml.samplers", {
    "dcgm": "hpcml.samplers.dcgm:open_sampler",
    "gpm": "hpcml.samplers.gpm:open_sampler",
    "nvml": "hpcml.samplers.nvml:open_sampler",
})
#: the last resort: when it cannot be used the recording goes on without GPU metrics (named
#: or reached by ``auto``); any other sampler that is named but cannot be used is an error
FALLBACK = "nvml"
#: what ``auto`` tries, in order
AUTO = ("dcgm", "gpm", FALLBACK)
ALL_VISIBLE = gpuuse.ALL_VISIBLE


def modes() -> list[str]:
    """``auto``, every GPU sampler's name (plug-ins included) and ``none``."""
    return ["auto", *SAMPLERS.names(), "none"]


def _check_mode(mode: str) -> None:
    if mode not in ("auto", "none") and mode not in SAMPLERS:
        raise UsageError(f"'{mode}' is not one of {', '.join(modes())}", key="gpu_metrics")


def _none(note: str, reason: str = UNAVAILABLE) -> dict:
    return {"kind": "none", "saturation": False, "note": note, "reason": reason}


def choose_gpu_sampler(mode: str, gpus: Sequence[str], interval: float,
                       env: Mapping[str, str] | None = None) -> tuple[Any, dict]:
    """``(sampler or None, label)`` for ``mode``: auto, none or a GPU sampler's name."""
    _check_mode(mode)
    if mode == "none":
        return None, _none("GPU sampling off", OFF)
    order = AUTO if mode == "auto" else (mode,)
    why = ""                   # the samplers auto passed over, and why
    for name in order:
        try:
            sampler, label = SAMPLERS.get(name)(gpus, interval, env)
        except SamplerUnavailable as exc:
            if name == mode and name != FALLBACK:
                raise UsageError(f"{name.upper()} is required but cannot be used: {exc}",
                                 key="gpu_metrics") from None
            if name == order[-1]:
                return None, _none(f"no GPU metrics: {exc}{why}")
            why += f"; {name.upper()} not used: {exc}"
            continue
        if why:
            label = {**label, "note": label.get("note", "") + why}
        return sampler, label
    return None, _none(f"no GPU metrics{why}")


@dataclass
class TaskGpus:
    """This task's GPU sampler (None: no GPU rows), what to add to its rank metadata, and
    its GPU claims; ``close()`` stops the sampler and releases the claims."""

    sampler: Any | None
    meta: dict
    claims: Any | None = None

    def close(self) -> None:
        try:
            if self.sampler is not None:
                self.sampler.close()
        finally:
            if self.claims is not None:
                self.claims.release()


def for_task(mode: str, gpus: Sequence[str], interval: float,
             env: Mapping[str, str] | None = None) -> TaskGpus:
    """Claim this task's GPUs on the node and open a sampler for the ones it won.

    No GPU bound to the task means every GPU the process can see (NVML's list); none
    visible means no GPU sampling, except when DCGM is required (then every GPU DCGM
    supports).
    """
    from hpcml.cluster.allocation import gpu_binding
    from hpcml.samplers.claim import claim_gpus
    from hpcml.samplers.nvml import visible_gpus
    env = os.environ if env is None else env
    _check_mode(mode)
    if mode == "none":
        return TaskGpus(None, {"gpu_sampler": _none("GPU sampling off", OFF)})
    wanted = [str(g) for g in gpus]
    binding = gpu_binding(env)[0] if wanted else ALL_VISIBLE
    if not wanted:
        wanted, why = visible_gpus(env)
        if not wanted and mode != "dcgm":
            return TaskGpus(None, {"gpu_sampler": _none(f"no GPU bound to this task and none visible ({why})", NONE_VISIBLE),
                                   "gpu_binding": None})
    claims = claim_gpus(wanted or ["all"], env)
    bound = [g for g in claims.claimed if g != "all"]
    if not claims.claimed:
        claims.release()
        return TaskGpus(None, {"gpu_sampler": _none(
            f"GPUs {claims.others} are recorded by another task on this node", CLAIMED)})
    try:
        sampler, label = choose_gpu_sampler(mode, bound, interval, env)
    except BaseException:
        claims.release()
        raise
    if claims.others:
        label["not_claimed"] = list(claims.others)
    label["gpus"] = bound or "all"
    meta: dict = {"gpu_sampler": label, "gpu_binding": binding}
    if sampler is None:
        claims.release()
        return TaskGpus(None, meta)
    for key in ("models", "uuids"):
        found = getattr(sampler, key, None)
        if found:
            meta[f"gpu_{key}"] = dict(found)
    return TaskGpus(sampler, meta, claims)
