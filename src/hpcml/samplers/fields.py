"""DCGM field IDs the scorer reads (``dcgm_fields.h``), with the short tags ``dcgmi dmon``
prints and what kind of quantity each is (ratio 0-1, rate, counter, gauge)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    id: int
    name: str          # our column name
    tag: str           # dcgmi dmon column header
    kind: str          # "ratio" (0-1), "rate" (per second), "counter" (monotonic), "gauge"


FIELDS = (
    Field(1001, "gr_engine_active", "GRACT", "ratio"),
    Field(1002, "sm_active", "SMACT", "ratio"),
    Field(1003, "sm_occupancy", "SMOCC", "ratio"),
    Field(1004, "pipe_tensor_active", "TENSO", "ratio"),
    Field(1005, "dram_active", "DRAMA", "ratio"),
    Field(1006, "pipe_fp64_active", "FP64A", "ratio"),
    Field(1007, "pipe_fp32_active", "FP32A", "ratio"),
    Field(1008, "pipe_fp16_active", "FP16A", "ratio"),
    Field(1009, "pcie_tx_bytes", "PCITX", "rate"),
    Field(1010, "pcie_rx_bytes", "PCIRX", "rate"),
    Field(1011, "nvlink_tx_bytes", "NVLTX", "rate"),
    Field(1012, "nvlink_rx_bytes", "NVLRX", "rate"),
    Field(203, "gpu_util", "GPUTL", "gauge"),            # percent, temporal
    Field(155, "power_usage", "POWER", "gauge"),         # W
    Field(156, "total_energy_consumption", "TOTEC", "counter"),   # mJ
    Field(100, "sm_clock", "SMCLK", "gauge"),            # MHz
    Field(101, "mem_clock", "MMCLK", "gauge"),           # MHz
    Field(112, "clocks_event_reasons", "CLKRS", "gauge"),
    Field(250, "fb_total", "FBTTL", "gauge"),            # MiB
    Field(251, "fb_free", "FBFRE", "gauge"),
    Field(252, "fb_used", "FBUSD", "gauge"),
    Field(253, "fb_reserved", "FBRSV", "gauge"),
)
BY_ID = {f.id: f for f in FIELDS}
BY_NAME = {f.name: f for f in FIELDS}
BY_TAG = {f.tag: f for f in FIELDS}
PROFILING_IDS = tuple(range(1001, 1013))

# DCGM's own names for the fields (dcgm-exporter metrics, gssr-record CSV columns).
DCGM_NAMES = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001, "DCGM_FI_PROF_SM_ACTIVE": 1002,
    "DCGM_FI_PROF_SM_OCCUPANCY": 1003, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_DRAM_ACTIVE": 1005, "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 1006,
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 1007, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 1008,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009, "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
    "DCGM_FI_PROF_NVLINK_TX_BYTES": 1011, "DCGM_FI_PROF_NVLINK_RX_BYTES": 1012,
    "DCGM_FI_DEV_GPU_UTIL": 203, "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156, "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_MEM_CLOCK": 101, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 112,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 112, "DCGM_FI_DEV_FB_FREE": 251,
    "DCGM_FI_DEV_FB_USED": 252, "DCGM_FI_DEV_FB_RESERVED": 253,
}
