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
