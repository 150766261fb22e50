"""Link peaks per GPU model, for the interconnect part of the score.

Bidirectional bytes per second (TX + RX both counted, as DCGM's 1009-1012 are), from the
vendors' data sheets: PCIe gen4 x16 is 32 GB/s per direction, gen5 x16 64 GB/s; NVLink
aggregate bandwidth is quoted bidirectional (A100 600 GB/s, H100/H200/GH200 900 GB/s,
B200 1.8 TB/s). A model not in the table has no interconnect part (missing, not 0).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Device:
    name: str
    pcie_bidir: float        # bytes/s
    nvlink_bidir: float | None


DEVICES = (
    Device("A100", 2 * 32 * GB, 600 * GB),
    Device("A40", 2 * 32 * GB, 112.5 * GB),
    Device("L40", 2 * 32 * GB, None),
    Device("H100 PCIe", 2 * 64 * GB, 600 * GB),
    Device("H100", 2 * 64 * GB, 900 * GB),
    Device("H200", 2 * 64 * GB, 900 * GB),
    Device("GH200", 2 * 64 * GB, 900 * GB),
    Device("B200", 2 * 64 * GB, 1800 * GB),
    Device("V100", 2 * 16 * GB, 300 * GB),
)


def lookup(model: str | None) -> Device | None:
    """The table entry whose name appears in NVML/DCGM's device name (longest match wins)."""
    if not model:
        return None
    found = [d for d in DEVICES if d.name.lower() in model.lower()]
    return max(found, key=lambda d: len(d.name)) if found else None
