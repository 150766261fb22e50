"""``hpcml.observe.schema``: the store's batches read back as Python values."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hpcml.observe.schema import from_batch, to_batch


def test_a_batch_reads_back_as_it_was_written():
    """The recorder's reading of a rank's batch (its progress, the Prometheus and MLflow
    feeds) gives what to_pydict gave, timestamps as epoch seconds, nulls kept."""
    rows = [(1_795_884_611_565_183_000, "metric", "loss", 0.5, 3, None),
            (1_795_884_611_600_000_000, "section", "step", 0.02, None, 1),
            (1_795_884_612_000_001_000, "host", "cpu", None, None, None)]
    batch = to_batch(rows, rank=7)
    got, old = from_batch(batch), batch.to_pydict()
    assert got["ts"] == [t.timestamp() for t in old["ts"]]
    assert got["ts"] == [1_795_884_611.565183, 1_795_884_611.6, 1_795_884_612.000001]
    for name in ("rank", "kind", "name", "value", "step", "gpu"):
        assert got[name] == old[name], name


@pytest.mark.parametrize("unit, per", [("s", 1), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)])
def test_every_timestamp_unit_is_read_in_seconds(unit, per):
    """A rank's own pyarrow may send another unit than the store's: seconds all the same."""
    batch = pa.record_batch([pa.array([1_700_000_000 * int(per), None], pa.timestamp(unit, tz="UTC"))], names=["ts"])
    assert from_batch(batch)["ts"] == [1_700_000_000.0, None]
