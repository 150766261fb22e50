"""Which GPU sampler a recording uses, and the label that says what its data can show.

- ``dcgm``: DCGM's profiling fields; the saturation score can be computed. Required: no
  reachable host engine is an error that says why.
- ``nvml``: NVML's utilisation, power and clocks. NVML's utilisation is *temporal* (some
  kernel ran during the window), so the recording is labelled "temporal utilisation only,
  no saturation".
- ``auto``: DCGM if a host engine answers, else NVML, else no GPU metrics.
- ``none``: no GPU metrics.

The label goes into the rank's metadata as ``gpu_sampler`` =
``{"kind": "dcgm"|"nvml"|"none", "saturation": bool, "note": str}``; the store importer
reads it back. ``for_task`` adds the node-local GPU claims (``hpcml.score.claim``) so each
GPU of a node is recorded by one task only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from hpcml.errors import UsageError

MODES = ("auto", "dcgm", "nvml", "none")
NVML_NOTE = "temporal utilisation only, no saturation (NVML)"


def _none(note: str) -> dict:
    return {"kind": "none", "saturation": False, "note": note}


def _nvml(gpus: Sequence[str], dcgm_reason: str | None = None):
    why = f"; DCGM not used: {dcgm_reason}" if dcgm_reason else ""
    try:
        from hpcml.samplers.nvml import NvmlSampler
        sampler = NvmlSampler(list(gpus))
    except Exception as exc:  # noqa: BLE001 - no NVML (no driver, no nvidia-ml-py)
        return None, _none(f"no GPU metrics: NVML unavailable ({type(exc).__name__}: {exc}){why}")
    return sampler, {"kind": "nvml", "saturation": False, "note": NVML_NOTE + why}


def choose_gpu_sampler(mode: str, gpus: Sequence[str], interval: float,
                       env: Mapping[str, str] | None = None):
    """``(sampler or None, label)`` for ``mode`` in auto, dcgm, nvml, none."""
    if mode not in MODES:
        raise UsageError(f"'{mode}' is not one of {', '.join(MODES)}", key="--gpu-metrics")
    if mode == "none":
        return None, _none("GPU sampling off")
    if mode == "nvml":
        return _nvml(gpus)
    from hpcml.samplers.dcgm import DcgmSampler, probe
    found = probe(env)
    if found.ok:
        try:
            sampler = DcgmSampler(gpus, interval, env)
            return sampler, sampler.label()
        except Exception as exc:  # noqa: BLE001 - any DCGM failure: say why, maybe fall back
            reason = f"{type(exc).__name__}: {exc}" if not str(exc).strip() else str(exc)
    else:
        reason = found.reason
    if mode == "dcgm":
        raise UsageError(f"DCGM is required but cannot be used: {reason}", key="--gpu-metrics")
    return _nvml(gpus, reason)


@dataclass
class TaskGpus:
    """This task's GPU sampler (None: no GPU rows), what to add to its rank metadata, and
    its GPU claims; ``close()`` stops the sampler and releases the claims."""

    sampler: object | None
    meta: dict
    claims: object | None = None

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

    No GPU bound to the task means no GPU sampling, except when DCGM is required (then
    every GPU DCGM supports) or an NVML replay is set (the tests' recorded samples).
    """
    from hpcml.score.claim import claim_gpus
    env = os.environ if env is None else env
    if mode not in MODES:
        raise UsageError(f"'{mode}' is not one of {', '.join(MODES)}", key="--gpu-metrics")
    if mode == "none":
        return TaskGpus(None, {"gpu_sampler": _none("GPU sampling off")})
    wanted = [str(g) for g in gpus]
    if not wanted and mode != "dcgm" and not env.get("HPCML_OBSERVE_NVML_REPLAY"):
        return TaskGpus(None, {"gpu_sampler": _none("no GPU bound to this task")})
    claims = claim_gpus(wanted or ["all"], env)
    bound = [g for g in claims.claimed if g != "all"]
    if not claims.claimed:
        claims.release()
        return TaskGpus(None, {"gpu_sampler": _none(
            f"GPUs {claims.others} are recorded by another task on this node")})
    try:
        sampler, label = choose_gpu_sampler(mode, bound, interval, env)
    except BaseException:
        claims.release()
        raise
    if claims.others:
        label["not_claimed"] = list(claims.others)
    label["gpus"] = bound or "all"
    meta: dict = {"gpu_sampler": label}
    if sampler is None:
        claims.release()
        return TaskGpus(None, meta)
    for key in ("models", "uuids"):
        found = getattr(sampler, key, None)
        if found:
            meta[f"gpu_{key}"] = dict(found)
    return TaskGpus(sampler, meta, claims)
