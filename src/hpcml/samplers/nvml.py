"""GPU sampler through NVML (nvidia-ml-py), for the GPUs bound to this task only.

NVML stays initialised for the recorder's lifetime (init per sample would cost more than
the sample). Utilisation here is NVML's *temporal* figure (some kernel ran during the
window), not saturation; ``hpcml score`` measures that with DCGM.

No GPU exists on the development machines: ``HPCML_OBSERVE_NVML_REPLAY=file.jsonl``
replays recorded samples (one JSON object per line: {"gpus": [{"index": 0, ...}]}) in a
loop, which is how the tests exercise this module; ``"lost": true`` in a GPU's entry stands
for a GPU that fell off the bus. The live path is untested here.

A GPU NVML says is lost (``GPU_IS_LOST``: fallen off the bus) gives a ``gpu_lost`` row
(``LOST``) each sample instead of its values: from then on what it did
is unknown, and whoever reads the rows must not take the missing clocks reasons for "not
throttled".
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hpcml.samplers import SamplerUnavailable

#: the row a sampler writes for a GPU NVML says is lost (value 1.0, the GPU's index)
LOST = "gpu_lost"
NVML_ERROR_GPU_IS_LOST = 15               # nvml.h


def is_lost(nv: Any, exc: BaseException) -> bool:
    """Whether an NVML error says the GPU is lost (fell off the bus, needs a reset)."""
    return getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST)


NVML_NOTE = "temporal utilisation only, no saturation (NVML)"
FIELDS = ("util_gpu_percent", "util_mem_percent", "mem_used_bytes", "power_w", "sm_clock_mhz",
          "mem_clock_mhz", "temperature_c", "energy_mj", "clocks_event_reasons")


REPLAY_ENV = "HPCML_GPM_REPLAY"
#: any one of these exists where an NVIDIA driver is loaded (bare metal, a container given
#: the GPUs, WSL2's /dev/dxg)
DRIVER_SIGNS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


class NoDriver(OSError):
    """No NVIDIA driver on this node: NVML is not even imported (pynvml costs every rank's
    recorder ~20-40 ms of CPU at start on a node that has no GPU)."""


def nvml_library(env: Mapping[str, str] | None = None) -> Any:
    """pynvml, or the replay of a recorded GPU when ``HPCML_GPM_REPLAY`` names one (both
    samplers and the GPU listing read NVML through this one choice)."""
    env = os.environ if env is None else env
    replay = env.get(REPLAY_ENV)
    if replay:
        from hpcml.samplers.replay import ReplayNvml
        return ReplayNvml.from_env(replay, env)
    if not any(os.path.exists(p) for p in DRIVER_SIGNS):
        raise NoDriver(f"no NVIDIA driver on this node (none of {', '.join(DRIVER_SIGNS)})")
    import pynvml
    return pynvml


def shutdown(nv: Any) -> None:
    """``nvmlShutdown``, best effort: a sampler that stops, or a probe that is done, must
    not fail on a driver that already went away."""
    try:
        nv.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass


def read_device(nv, handle) -> dict[str, float | None]:
    """NVML's device values of one GPU (None: NVML refused that one), shared with the GPM
    sampler: utilisation, memory used, power, clocks, temperature, clock-event reasons; for a
    GPU NVML says is lost, ``{LOST: 1.0}`` alone: none of its values is known."""
    lost = False

    def get(fn, *args):
        nonlocal lost
        if lost:
            return None
        try:
            return fn(handle, *args)
        except nv.NVMLError as exc:
            lost = is_lost(nv, exc)
            return None
    util = get(nv.nvmlDeviceGetUtilizationRates)
    mem = get(nv.nvmlDeviceGetMemoryInfo)
    power = get(nv.nvmlDeviceGetPowerUsage)
    values = {"util_gpu_percent": util.gpu if util else None,
              "util_mem_percent": util.memory if util else None,
              "mem_used_bytes": mem.used if mem else None,
              "power_w": power / 1000 if power is not None else None,
              "sm_clock_mhz": get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
              "mem_clock_mhz": get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
              "temperature_c": get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
              "energy_mj": get(nv.nvmlDeviceGetTotalEnergyConsumption),
              "clocks_event_reasons": get(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                          or nv.nvmlDeviceGetCurrentClocksThrottleReasons)}
    return {LOST: 1.0} if lost else values


class NvmlSampler:
    def __init__(self, bound: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """``bound``: the task's GPUs as its binding names them (``samplers.binding``: Slurm's
        device numbers, CUDA's ordinals or UUIDs; NVML indices where nothing binds)."""
        from hpcml.samplers.binding import pick
        env = os.environ if env is None else env
        self.bound = list(bound)
        self._replay = None
        self.handles: list[tuple[int, object]] = []
        self.models: dict[str, str] = {}
        self.uuids: dict[str, str] = {}
        self.notes: list[str] = []
        replay = env.get("HPCML_OBSERVE_NVML_REPLAY")
        if replay:
            with open(replay, encoding="utf-8") as f:
                self._replay = itertools.cycle([json.loads(line) for line in f if line.strip()])
            return
        nv = nvml_library(env)  # ImportError: the caller records without GPUs
        nv.nvmlInit()
        self.nv = nv
        try:
            chosen = pick(nv, self.bound, env)
        except BaseException:
            shutdown(nv)
            raise
        self.notes += chosen.notes
        for d in chosen.devices:
            self.handles.append((d.index, d.handle))
            if d.uuid:
                self.uuids[str(d.index)] = d.uuid
            if d.name:
                self.models[str(d.index)] = d.name

    def sample(self, ts: int) -> list[tuple]:
        if self._replay is not None:
            gpus = [(g["index"], g) for g in next(self._replay)["gpus"]
                    if not self.bound or str(g["index"]) in self.bound]
        else:
            gpus = [(i, read_device(self.nv, h)) for i, h in self.handles]
        rows = []
        for index, values in gpus:
            if values.get(LOST) or values.get("lost") is True:      # a replay's "lost": true
                rows.append((ts, "gpu", LOST, 1.0, None, index))
                continue
            rows += [(ts, "gpu", name, float(values[name]), None, index) for name in FIELDS
                     if values.get(name) is not None]
        return rows

    def close(self) -> None:
        if self._replay is None and self.handles is not None:
            shutdown(self.nv)


def visible_gpus(env: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """NVML indices of every GPU this process may open, and why there are none if so.

    The replays (``HPCML_OBSERVE_NVML_REPLAY``, ``HPCML_GPM_REPLAY``) stand for the driver
    in the tests."""
    env = os.environ if env is None else env
    replay = env.get("HPCML_OBSERVE_NVML_REPLAY")
    if replay:
        with open(replay, encoding="utf-8") as f:
            first = json.loads(next(line for line in f if line.strip()))
        return [str(g["index"]) for g in first["gpus"]], "NVML replay"
    try:
        nv = nvml_library(env)
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no nvidia-ml-py: no GPU
        return [], f"NVML: {type(exc).__name__}: {exc}"
    try:
        from hpcml.samplers.binding import devices
        found, unopened = devices(nv)      # another job's (a device cgroup), or lost: not listed
        return [str(d.index) for d in found], ("NVML" if found or not unopened
                                               else f"NVML: none of the {len(unopened)} GPUs here can be opened")
    except Exception as exc:  # noqa: BLE001
        return [], f"NVML: {type(exc).__name__}: {exc}"
    finally:
        shutdown(nv)


def open_sampler(gpus: Sequence[str], interval: float,
                 env: Mapping[str, str] | None = None) -> tuple[NvmlSampler, dict]:
    """``nvml`` in hpcml.samplers.choose: the sampler and its label, or SamplerUnavailable."""
    try:
        sampler = NvmlSampler(list(gpus), env)
    except Exception as exc:  # noqa: BLE001 - no NVML (no driver, no nvidia-ml-py)
        raise SamplerUnavailable(f"NVML unavailable ({type(exc).__name__}: {exc})") from exc
    return sampler, {"kind": "nvml", "saturation": False, "note": "; ".join([NVML_NOTE, *sampler.notes])}


def uuids_of(bound: Sequence[str], source: str | None,
             env: Mapping[str, str]) -> tuple[list[str | None], list[str]]:
    """Each entry's GPU UUID as this process's NVML places it (None: not placed), and how
    they were read: for a reader that numbers GPUs its own way (DCGM's host engine, CUDA in
    a farm worker). Raises what opening NVML raises (no driver, no nvidia-ml-py)."""
    from hpcml.samplers.binding import choose, devices
    nv = nvml_library(env)
    nv.nvmlInit()
    try:
        found, _ = devices(nv)
        out: list[str | None] = []
        notes: list[str] = []
        for entry in bound:
            chosen = choose(found, [entry], source, env)
            notes += chosen.notes
            out.append(chosen.devices[0].uuid if chosen.devices else None)
        return out, list(dict.fromkeys(notes))
    finally:
        shutdown(nv)
