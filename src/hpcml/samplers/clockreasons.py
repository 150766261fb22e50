"""NVML's clocks event (throttle) reasons: one table for the vetting checks and the run-time
samplers, which read the same mask (``nvmlDeviceGetCurrentClocksEventReasons``; DCGM's field
112, ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``, carries it unchanged).

``SLOWDOWN`` are the reasons that cost a busy GPU its clocks for its heat or its power delivery:
a rank whose GPU is held back so is slowed by its GPU's surroundings (cooling, a power brake),
not by its own work; the straggler verdicts name that as contention. The software power cap
(``sw_power_cap``) is not among them: under one enforced limit it marks load, not a cause.
A rank slow in its own compute keeps its GPU at the cap while the others wait in NCCL's
kernels at low power (../shared/recordings/h100: a bf16 GEMM power-capped at ~700 W, a
resident kernel doing nothing at ~120 W), so it would show "held back" the longer the slower
it is, and a straggler would be excused as contention."""

from __future__ import annotations

#: the bits as documented for nvmlDeviceGetCurrentClocksEventReasons; names are ours, in snake case
CLOCK_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80      # hardware, thermal (software, hardware), power brake
MASK_MAX = 1 << 64                               # an unsigned long long, as NVML returns it


def reason_names(mask: int | None) -> list[str]:
    """Names of the bits set in a clocks event reasons mask; unknown bits as hex."""
    if not mask:
        return []
    names = [n for n, bit in CLOCK_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_REASONS.values())
    names += [hex(1 << b) for b in range(64) if rest >> b & 1]
    return names


def slowdown(value: float | int | None) -> int:
    """The slowdown bits of a mask as a sampler stored it (the store's values are floats;
    a value that is no mask counts as none)."""
    try:
        mask = int(value)                        # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return 0
    return mask & SLOWDOWN if 0 <= mask < MASK_MAX and mask == value else 0
