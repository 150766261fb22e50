"""The live watch's step times (``hpcml.run.steptimes``)."""

from __future__ import annotations

import numpy as np

from hpcml.run.steptimes import StepTimes


def test_compute_times_only_where_every_rank_measured_its_waits():
    """The live twin of the report's rule: ranks 0-2's beats carry their waits (0.7 s of each
    1 s step), rank 3's carry none (not measured). The window the straggler model scores is
    then the step times of all four, never rank 3's whole step against the others' compute;
    once every rank measures its waits, compute times."""
    st = StepTimes(4)
    steps = list(range(1, 41))
    for r in range(4):
        st.add(r, steps, [1.0] * 40, waits=[0.7] * 40 if r != 3 else None)
    ranks, ids, m = st.window(32, busy=True)
    assert list(ranks) == [0, 1, 2, 3] and len(ids) == 32 and np.allclose(m, 1.0)
    st.add(3, list(range(41, 81)), [1.0] * 40, waits=[0.7] * 40)
    for r in range(3):
        st.add(r, list(range(41, 81)), [1.0] * 40, waits=[0.7] * 40)
    ranks, ids, m = st.window(32, busy=True)
    assert np.allclose(m, 0.3, atol=1e-6)


def test_the_watch_starts_without_numpy_and_holds_steps_once_they_come():
    """The launcher's watch is made right after the ranks' srun step, beside the task
    wrappers' and ranks' own start-up on a node they share: until a rank reports a step (or
    a CPU figure) it imports no numpy (~0.1 s of CPU), and its empty rings answer as empty
    (no median, no first step, no shares; an empty window, asked only once a median is). In a fresh interpreter, as the
    launcher is."""
    import subprocess
    import sys
    code = """
import sys
from hpcml.run.watch import Watch  # noqa: F401 - the watch's own imports
from hpcml.run.cpuwaits import CpuWaits
from hpcml.run.steptimes import StepTimes
st, cpu = StepTimes(3), CpuWaits(3)
st.add(0, [], [], restarts=0)
cpu.add(1, None, None, None)
empty = (st.median_step(), st.first_step(), cpu.shares(0, 60.0))
assert "numpy" not in sys.modules, "numpy imported before any step"
assert empty == (None, -1, (None, None, None, None)), empty
assert len(st.window(8)[1]) == 0
for r in range(3):
    st.add(r, list(range(5, 70)), [0.5] * 65)
assert "numpy" in sys.modules and st.first_step() == 5 and abs(st.median_step() - 0.5) < 1e-6
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
