"""NVML's clocks event reasons as the samplers store them (floats) and the checks name them."""

from __future__ import annotations

import math

from hpcml.samplers.clockreasons import SLOWDOWN, reason_names, slowdown


def test_the_slowdown_bits_of_a_stored_mask_and_nothing_from_what_is_no_mask():
    assert slowdown(0x40 | 0x1) == 0x40 and slowdown(float(0x8 | 0x10)) == 0x8
    assert slowdown(0x4) == 0                  # the software power cap: a busy GPU's load, not a cause
    assert slowdown(0x1) == 0 and slowdown(0x100) == 0                 # idle, display: no slowdown
    for bad in (None, -0x40, 0.5 + 0x40, math.nan, math.inf, 2.0 ** 70, "0x40", [0x40]):
        assert slowdown(bad) == 0, bad                                  # type: ignore[arg-type]
    assert reason_names(SLOWDOWN) == ["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                      "hw_power_brake_slowdown"]
    assert reason_names(1 << 40) == [hex(1 << 40)] and reason_names(None) == []
