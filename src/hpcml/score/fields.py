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
