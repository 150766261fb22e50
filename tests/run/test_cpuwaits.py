"""Each rank's CPU wait as the watch keeps it (``hpcml.run.cpuwaits``): shares over a span,
and records from a rank's own program (the beat files are in the job directory) that go
back in time or count can neither poison later shares nor freeze the ring."""

from __future__ import annotations

from hpcml.run.cpuwaits import EVERY, CpuWaits


def test_the_share_of_the_last_seconds_spent_waiting():
    w = CpuWaits(2)
    for k in range(20):
        w.add(0, 1000.0 + k * EVERY, 0.5 * k * EVERY, 0.0)
        w.add(1, 1000.0 + k * EVERY, 0.0, 0.0)
    assert w.shares(0, 60.0) == (0.5, 0.0, None, None) and w.shares(1, 60.0) == (0.0, 0.0, None, None)
    assert w.shares(0, 1000.0) == (None, None, None, None)     # not measured over half of that


def test_the_share_of_the_cores_time_throttled_for_heat():
    """Only the kernel's counter given (no CPU wait, no GPU): kept, and its share judged."""
    w = CpuWaits(1)
    for k in range(20):
        w.add(0, 1000.0 + k * EVERY, None, None, None, 0.8 * k * EVERY)
    assert w.shares(0, 60.0) == (None, None, None, 0.8)


def test_a_beat_far_in_the_future_or_a_count_that_goes_back_starts_the_ring_again():
    w = CpuWaits(1)
    w.add(0, 1e300, 1e300, None)                          # forged
    for k in range(20):
        w.add(0, 1000.0 + k * EVERY, 0.25 * k * EVERY, None)
    assert w.shares(0, 60.0) == (0.25, None, None, None)
    w.add(0, 1000.0 + 21 * EVERY, 0.0, None)               # the count went back: a new rank process
    for k in range(22, 40):
        w.add(0, 1000.0 + k * EVERY, (k - 21) * EVERY * 0.1, None)
    got = w.shares(0, 60.0)[0]
    assert got is not None and abs(got - 0.1) < 1e-9
