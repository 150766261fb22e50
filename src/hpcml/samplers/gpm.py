"""GPU sampler through NVML's GPU Performance Monitoring (GPM), for this task's GPUs only.

GPM (``nvmlGpmSampleGet`` / ``nvmlGpmMetricsGet`` in nvidia-ml-py; Hopper and newer) gives
the same kind of figures as DCGM's profiling fields (SM activity and occupancy, tensor and
FP pipe activity, DRAM bandwidth, PCIe and NVLink rates) straight from the driver: no host
engine, no root. A metric is the average over the interval between two GPM samples, so the
sampler keeps the previous sample of each GPU and, at each ``sample()``, takes a new one
and asks for the metrics between the two. Rows carry the interval's *end* (the moment the
new sample was taken): like DCGM's timestamps, the time the values became known.

How GPM maps onto the score's fields (the names DCGM's rows carry too):

=====================================  ==========================  ===========================
GPM metric (``NVML_GPM_METRIC_*``)     row name                    unit conversion
=====================================  ==========================  ===========================
SM_UTIL                                sm_active                   percent -> ratio
SM_OCCUPANCY                           sm_occupancy                percent -> ratio
GRAPHICS_UTIL                          gr_engine_active            percent -> ratio
ANY_TENSOR_UTIL                        pipe_tensor_active          percent -> ratio
HMMA / IMMA / DFMA / DMMA_TENSOR_UTIL  pipe_tensor_{hmma,...}      percent -> ratio
FP64 / FP32 / FP16_UTIL                pipe_fp{64,32,16}_active    percent -> ratio
INTEGER_UTIL                           pipe_int_active             percent -> ratio
DRAM_BW_UTIL                           dram_active                 percent -> ratio
PCIE_TX / RX_PER_SEC                   pcie_tx / rx_bytes          MiB/s -> bytes/s
NVLINK_TOTAL_TX / RX_PER_SEC           nvlink_tx / rx_bytes        MiB/s -> bytes/s
=====================================  ==========================  ===========================

Beside them, NVML's device values (utilisation, power, clocks, memory used, energy) at
the same moment, under the NVML sampler's row names.

Where GPM differs from DCGM: DRAM_BW_UTIL is bandwidth used against the theoretical peak
(DCGM's DRAM active is the share of cycles the memory interface was busy; both reach
~0.9 on a device-to-device copy of an H100); FP16_UTIL counts non-tensor FP16 only, as
DCGM's FP16 pipe does; GPM is read per GPU and not for MIG instances (a GPU in MIG mode is
left out, and the label says so).

Missing stays missing: a metric NVML answers with an error is no row, a metric that fails
on every call is dropped after the first, and a GPU whose sample fails (reset) has no rows
for that interval; one NVML says is lost (fallen off the bus) has a ``gpu_lost`` row
(``hpcml.samplers.nvml.LOST``) instead, so that what it did is unknown, not "not throttled".

No GPU exists on the development machines: ``HPCML_GPM_REPLAY=file.jsonl`` replaces the
NVML library (only it) with ``hpcml.samplers.replay``, which plays back a recording made
on a real H100 (tests/fixtures/gpm), so everything above runs in the tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpcml.samplers import SamplerUnavailable
from hpcml.samplers.binding import pick
from hpcml.samplers.nvml import LOST, NoDriver, is_lost, nvml_library, read_device, shutdown

MIB = 1024 * 1024
PERCENT = 0.01
#: GPM metric name (nvidia-ml-py's without ``NVML_GPM_METRIC_``) -> (row name, factor)
METRICS: dict[str, tuple[str, float]] = {
    "SM_UTIL": ("sm_active", PERCENT),
    "SM_OCCUPANCY": ("sm_occupancy", PERCENT),
    "GRAPHICS_UTIL": ("gr_engine_active", PERCENT),
    "ANY_TENSOR_UTIL": ("pipe_tensor_active", PERCENT),
    "HMMA_TENSOR_UTIL": ("pipe_tensor_hmma_active", PERCENT),
    "IMMA_TENSOR_UTIL": ("pipe_tensor_imma_active", PERCENT),
    "DFMA_TENSOR_UTIL": ("pipe_tensor_dfma_active", PERCENT),
    "DMMA_TENSOR_UTIL": ("pipe_tensor_dmma_active", PERCENT),
    "FP64_UTIL": ("pipe_fp64_active", PERCENT),
    "FP32_UTIL": ("pipe_fp32_active", PERCENT),
    "FP16_UTIL": ("pipe_fp16_active", PERCENT),
    "INTEGER_UTIL": ("pipe_int_active", PERCENT),
    "DRAM_BW_UTIL": ("dram_active", PERCENT),
    "PCIE_TX_PER_SEC": ("pcie_tx_bytes", MIB),
    "PCIE_RX_PER_SEC": ("pcie_rx_bytes", MIB),
    "NVLINK_TOTAL_TX_PER_SEC": ("nvlink_tx_bytes", MIB),
    "NVLINK_TOTAL_RX_PER_SEC": ("nvlink_rx_bytes", MIB),
}
NOTE = "NVML GPM metrics: saturation"
MIN_GAP_NS = 100_000_000       # two GPM samples closer than 0.1 s give no metrics


class GpmSampler:
    """Samples this task's GPUs through NVML GPM; same interface as NvmlSampler."""

    def __init__(self, bound: Sequence[str], nv: Any, clock: Callable[[], int] = time.time_ns,
                 env: Mapping[str, str] | None = None) -> None:
        """``bound``: the task's GPUs as its binding names them (``samplers.binding``; empty:
        every GPU); ``nv``: pynvml or a replay; ``clock``: ns since 1970 (a replay may bring
        its own)."""
        self.nv = nv
        self.env = os.environ if env is None else env
        self.clock = clock
        self.bound = [str(g).strip() for g in bound if str(g).strip()]
        self.models: dict[str, str] = {}
        self.uuids: dict[str, str] = {}
        self.notes: list[str] = []
        self.ids = {getattr(nv, f"NVML_GPM_METRIC_{name}"): name for name in METRICS
                    if isinstance(getattr(nv, f"NVML_GPM_METRIC_{name}", None), int)}
        self.gpus: list[tuple[int, Any]] = []           # (index, handle)
        self._prev: dict[int, Any] = {}                 # index -> the last GPM sample
        self._spare: dict[int, Any] = {}
        self._taken: dict[int, int] = {}                # index -> when _prev was taken (ns)
        self._failing: set[int] = set()                 # metric ids NVML refused on every try
        self._closed = False
        nv.nvmlInit()
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        nv = self.nv
        unsupported, mig = [], []
        chosen = pick(nv, self.bound, self.env)
        self.notes += chosen.notes
        for d in chosen.devices:
            i, h = d.index, d.handle
            if self._in_mig_mode(h):
                mig.append(i)
                continue
            try:
                supported = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except nv.NVMLError:
                supported = False
            if not supported:
                unsupported.append(i)
                continue
            self.gpus.append((i, h))
            if d.uuid:
                self.uuids[str(i)] = d.uuid
            if d.name:
                self.models[str(i)] = d.name
        if mig:
            self.notes.append(f"GPUs {mig} are in MIG mode; GPM is not read per MIG instance, not recorded")
        if unsupported:
            self.notes.append(f"GPUs {unsupported} do not support GPM (Hopper or newer needed), not recorded")
        if not self.gpus:
            raise SamplerUnavailable("; ".join(self.notes) or f"none of this task's GPUs {self.bound} is visible to NVML")
        for i, h in self.gpus:
            self._prev[i] = nv.nvmlGpmSampleGet(h, nv.nvmlGpmSampleAlloc())
            self._taken[i] = self.clock()
            self._spare[i] = nv.nvmlGpmSampleAlloc()

    def _in_mig_mode(self, handle: Any) -> bool:
        nv = self.nv
        try:
            current = nv.nvmlDeviceGetMigMode(handle)[0]
        except (AttributeError, nv.NVMLError):
            return False                               # no MIG on this GPU or this NVML
        return bool(current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))

    def _metrics(self, s1: Any, s2: Any) -> dict[str, float]:
        """Every wanted metric between two samples; a call NVML refuses as a whole is
        retried metric by metric, and metrics that fail alone are not asked again."""
        nv = self.nv
        wanted = [m for m in self.ids if m not in self._failing]
        try:
            return self._get(wanted, s1, s2)
        except nv.NVMLError:
            out: dict[str, float] = {}
            failed = []
            for m in wanted:
                try:
                    out.update(self._get([m], s1, s2))
                except nv.NVMLError:
                    failed.append(m)
            if out:                                    # all failing at once is transient
                self._failing.update(failed)
            return out

    def _get(self, ids: list[int], s1: Any, s2: Any) -> dict[str, float]:
        nv = self.nv
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(ids)
        mg.sample1, mg.sample2 = s1, s2
        for k, m in enumerate(ids):
            mg.metrics[k].metricId = m
        nv.nvmlGpmMetricsGet(mg)
        out = {}
        for k, m in enumerate(ids):
            metric = mg.metrics[k]
            if metric.nvmlReturn == 0:                 # NVML_SUCCESS; else no value
                out[self.ids[m]] = float(metric.value)
        return out

    def sample(self, ts: int | None = None) -> list[tuple]:
        """Rows ``(end_ns, "gpu", name, value, None, index)`` for the interval since the last
        call; ``ts`` (the recorder's clock) is not used."""
        nv = self.nv
        rows: list[tuple] = []
        for i, h in self.gpus:
            if self.clock() - self._taken[i] < MIN_GAP_NS:
                continue                               # too short an interval to average over
            current = self._spare[i]
            try:
                nv.nvmlGpmSampleGet(h, current)
            except nv.NVMLError as exc:                # lost: said (unknown from now on); resetting: no rows
                if is_lost(nv, exc):
                    rows.append((self.clock(), "gpu", LOST, 1.0, None, i))
                continue
            end = self.clock()
            try:
                values = self._metrics(self._prev[i], current)
            finally:
                self._spare[i], self._prev[i] = self._prev[i], current
                self._taken[i] = end
            for name, value in values.items():
                field, factor = METRICS[name]
                if value == value:                     # NaN is missing too
                    rows.append((end, "gpu", field, value * factor, None, i))
            for name, device_value in read_device(nv, h).items():
                if device_value is not None:
                    rows.append((end, "gpu", name, float(device_value), None, i))
        return rows

    def label(self) -> dict:
        note = "; ".join([NOTE, *self.notes])
        return {"kind": "gpm", "saturation": True, "note": note,
                "metrics": sorted(self.ids[m] for m in self.ids if m not in self._failing)}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        nv = self.nv
        for sample in [*self._prev.values(), *self._spare.values()]:
            try:
                nv.nvmlGpmSampleFree(sample)
            except Exception:  # noqa: BLE001 - freeing is best effort
                pass
        self._prev, self._spare = {}, {}
        shutdown(nv)


def open_sampler(gpus: Sequence[str], interval: float,
                 env: Mapping[str, str] | None = None) -> tuple[GpmSampler, dict]:
    """``gpm`` in hpcml.samplers.choose: the sampler and its label, or SamplerUnavailable."""
    try:
        nv = nvml_library(env)
    except ImportError as exc:
        raise SamplerUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
    except NoDriver as exc:
        raise SamplerUnavailable(str(exc)) from exc
    try:
        sampler = GpmSampler(list(gpus), nv, env=env)
    except SamplerUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - no driver, no GPM in this NVML
        raise SamplerUnavailable(f"NVML GPM unavailable ({type(exc).__name__}: {exc})") from exc
    return sampler, sampler.label()
