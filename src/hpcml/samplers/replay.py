"""A stand-in for the NVML library that plays back GPM recordings made on a real GPU.

``HPCML_GPM_REPLAY=file.jsonl`` makes ``hpcml.samplers.gpm`` use it instead of the driver.
The file is what ``gpm_record.py`` writes (tests/fixtures/gpm, recorded on an H100): one
JSON object per 0.5 s interval, ``gpm`` holding each GPM metric by nvidia-ml-py's name
without ``NVML_GPM_METRIC_`` (``null``: NVML refused it), and NVML's ``nvml_gpu_util``,
``nvml_mem_util``, ``power_w`` and ``sm_clock`` of that interval.

This is a mock of the C library only: structures, constants and the error class are
nvidia-ml-py's own, so the sampler fills the real ``c_nvmlGpmMetricsGet_t``. Each
``nvmlGpmSampleGet`` moves a GPU one recorded interval on (in a loop); ``nvmlGpmMetricsGet``
answers with the interval the second sample ended. ``HPCML_GPM_REPLAY_GPUS`` (default 1)
GPUs replay the same file; ``HPCML_GPM_REPLAY_PHASES`` (comma-separated) keeps only those
phases.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

MODEL = "NVIDIA H100 80GB HBM3"


@dataclass
class _Handle:
    index: int


class ReplayNvml:
    """Module-like: the nvidia-ml-py functions the samplers call, answered from a recording."""

    def __init__(self, rows: list[dict], gpus: int = 1, model: str = MODEL) -> None:
        if not rows:
            raise ValueError("a GPM replay needs at least one recorded interval")
        self.rows = rows
        self.count = gpus
        self.model = model
        self.cursor = [0] * gpus            # per GPU: the interval the next sample ends
        self.samples: dict[int, tuple[int, int]] = {}   # sample address -> (gpu, row)
        self.ids = {getattr(pynvml, n): n[len("NVML_GPM_METRIC_"):] for n in dir(pynvml)
                    if n.startswith("NVML_GPM_METRIC_") and isinstance(getattr(pynvml, n), int)}
        self.calls = 0
        self.fresh = [False] * gpus        # per GPU: a GPM sample since the last device read

    @classmethod
    def from_file(cls, path: str | Path, gpus: int = 1, phases: list[str] | None = None) -> ReplayNvml:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if phases:
            rows = [r for r in rows if r.get("phase") in phases]
        return cls(rows, gpus)

    @classmethod
    def from_env(cls, path: str, env: Mapping[str, str]) -> ReplayNvml:
        phases = [p for p in env.get("HPCML_GPM_REPLAY_PHASES", "").split(",") if p]
        return cls.from_file(path, int(env.get("HPCML_GPM_REPLAY_GPUS", "1")), phases or None)

    def __getattr__(self, name: str) -> Any:
        """Constants, structures and NVMLError come from nvidia-ml-py itself."""
        if name.startswith(("NVML_", "c_nvml", "NVMLError")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _row(self, gpu: int) -> dict:
        """The interval the GPU's last GPM sample ended (device values are read right after
        it); a reader that takes no GPM samples (the NVML sampler) moves on one interval per
        utilisation read instead."""
        return self.rows[max(self.cursor[gpu] - 2, 0) % len(self.rows)]

    def _check(self, handle: _Handle) -> int:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < self.count:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.index

    # -- the library ---------------------------------------------------------------------

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < self.count:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return f"GPU-00000000-0000-4000-8000-{self._check(handle):012d}"

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        """/dev/nvidiaN's N: the index, as on most bare-metal nodes."""
        return self._check(handle)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = f"00000000:{self._check(handle) + 1:02X}:00.0".encode()
        return info

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._check(handle)
        return self.model

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._check(handle)
        return [0, 0]

    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> Any:
        self._check(handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        return ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.samples.pop(ctypes.addressof(sample.contents), None)

    def nvmlGpmSampleGet(self, handle: _Handle, sample: Any) -> Any:
        gpu = self._check(handle)
        self.samples[ctypes.addressof(sample.contents)] = (gpu, self.cursor[gpu])
        self.cursor[gpu] += 1
        self.fresh[gpu] = True
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self.calls += 1
        first = self.samples.get(ctypes.addressof(mg.sample1.contents))
        second = self.samples.get(ctypes.addressof(mg.sample2.contents))
        if first is None or second is None or first[0] != second[0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        # the interval that ended at the second sample (its row is the one before the cursor it set)
        values = self.rows[max(second[1] - 1, 0) % len(self.rows)].get("gpm") or {}
        for k in range(mg.numMetrics):
            m = mg.metrics[k]
            v = values.get(self.ids.get(m.metricId, ""))
            if isinstance(v, (int, float)):
                m.value, m.nvmlReturn = float(v), pynvml.NVML_SUCCESS
            else:
                m.value, m.nvmlReturn = 0.0, pynvml.NVML_ERROR_NOT_SUPPORTED
        return mg

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        gpu = self._check(handle)
        if not self.fresh[gpu]:
            self.cursor[gpu] += 1
        self.fresh[gpu] = False
        row = self._row(gpu)
        return pynvml.c_nvmlUtilization_t(int(row.get("nvml_gpu_util", 0)), int(row.get("nvml_mem_util", 0)))

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return int(float(self._row(self._check(handle)).get("power_w", 0.0)) * 1000)

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock: int) -> int:
        row = self._row(self._check(handle))
        if clock == pynvml.NVML_CLOCK_SM and "sm_clock" in row:
            return int(row["sm_clock"])
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _unrecorded(self, handle: _Handle, *args: Any) -> Any:
        self._check(handle)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # what the recording did not capture: NVML's "not supported", so it stays missing
    nvmlDeviceGetMemoryInfo = _unrecorded
    nvmlDeviceGetTemperature = _unrecorded
    nvmlDeviceGetTotalEnergyConsumption = _unrecorded
    nvmlDeviceGetCurrentClocksEventReasons = _unrecorded
    nvmlDeviceGetCurrentClocksThrottleReasons = _unrecorded
    nvmlDeviceGetComputeRunningProcesses = _unrecorded       # whose processes ran there: not recorded
    nvmlDeviceGetMPSComputeRunningProcesses = _unrecorded
