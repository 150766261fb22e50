"""hpcml.phases: the launcher's own time, phase by phase."""

from __future__ import annotations

import subprocess
import sys
import time

from hpcml import phases


def test_a_phase_records_its_wall_and_cpu() -> None:
    clock = phases.Clock()
    with clock.phase("sleeping"):
        time.sleep(0.2)
    with clock.phase("spinning"):
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
    sleeping, spinning = clock.spans
    assert (sleeping.name, spinning.name) == ("sleeping", "spinning")
    assert sleeping.wall_s >= 0.2 and sleeping.cpu_s < sleeping.wall_s / 2       # waiting costs no CPU
    assert spinning.cpu_s >= 0.2 and spinning.start >= sleeping.start + 0.2
    assert [d["name"] for d in clock.to_json()] == ["sleeping", "spinning"]


def test_phase_records_into_the_commands_clock_only_once_begun() -> None:
    phases._active = None
    with phases.phase("nobody keeps this"):
        pass
    assert phases.current() is None
    clock = phases.begin()
    with phases.phase("kept"):
        pass
    assert [s.name for s in clock.spans] == ["kept"] and phases.current() is clock
    phases._active = None


def test_started_is_the_process_start_not_the_call() -> None:
    """A process that sleeps 0.5 s before asking: its start is at least that long ago (the
    clock ticks of /proc are 10 ms), and not before it was spawned."""
    code = ("import time; time.sleep(0.5); from hpcml.phases import started; "
            "s, cpu = started(); print(s, time.time() - s, cpu)")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    begun, ago, cpu = (float(x) for x in out.stdout.split())
    assert ago >= 0.48
    assert before - 0.05 <= begun <= before + 0.5
    assert 0 < cpu < ago                                  # the interpreter's start-up, not the sleep
