"""Shared report helpers (hpcml.htmlkit)."""

from __future__ import annotations

import numpy as np

from hpcml.htmlkit import _path, bridge_gaps


def test_sparse_samples_are_bridged_and_real_gaps_kept():
    nan = np.nan
    y = np.array([nan, 1, nan, nan, nan, 2, nan, nan, nan, 3] + [nan] * 12 + [5, nan])
    out = bridge_gaps(y)
    assert np.allclose(out[1:10], [1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75, 3])
    assert np.isnan(out[0]) and np.isnan(out[10:22]).all() and out[22] == 5 and np.isnan(out[23])
    assert "L" not in _path(np.arange(len(y)), y)           # the old drawing: moves only
    assert "L" in _path(np.arange(len(y)), out)
