"""The kernel's CPU thermal throttle counters, read as ``hpcml.samplers.cputhermal`` reads
them, on a tree laid out as the kernel's (``/sys/devices/system/cpu/cpuN/thermal_throttle/``:
one decimal count of milliseconds a file, a newline after it). This machine has none (a
virtual machine): the real root gives None, never 0."""

from __future__ import annotations

import os
from pathlib import Path

from hpcml.samplers.cputhermal import SYS_CPU, throttled_s


def _tree(root: Path, cpus: dict[int, tuple[int, int] | None]) -> Path:
    for cpu, counts in cpus.items():
        d = root / f"cpu{cpu}"
        d.mkdir(parents=True)
        if counts is not None:
            (d / "thermal_throttle").mkdir()
            (d / "thermal_throttle" / "core_throttle_total_time_ms").write_text(f"{counts[0]}\n")
            (d / "thermal_throttle" / "package_throttle_total_time_ms").write_text(f"{counts[1]}\n")
    return root


def test_the_mean_over_the_rank_s_cores_of_the_larger_counter(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    counts = {cpu: (2000 + 1000 * i, 500) for i, cpu in enumerate(mine)}
    root = _tree(tmp_path / "cpu", counts)
    expect = sum(max(c) for c in counts.values()) / len(counts) / 1000
    assert throttled_s(os.getpid(), root) == round(expect, 3)


def test_no_counter_is_none_never_0(tmp_path):
    root = _tree(tmp_path / "cpu", {cpu: None for cpu in os.sched_getaffinity(0)})
    assert throttled_s(os.getpid(), root) is None
    if not any((SYS_CPU / f"cpu{c}" / "thermal_throttle").is_dir() for c in os.sched_getaffinity(0)):
        assert throttled_s(os.getpid()) is None


def test_a_counter_that_is_not_a_count_is_skipped(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    root = _tree(tmp_path / "cpu", {cpu: (1000, 0) for cpu in mine})
    (root / f"cpu{mine[0]}" / "thermal_throttle" / "core_throttle_total_time_ms").write_text("-5\n")
    (root / f"cpu{mine[0]}" / "thermal_throttle" / "package_throttle_total_time_ms").write_text("lots\n")
    got = throttled_s(os.getpid(), root)
    assert got == (1.0 if len(mine) > 1 else None)
