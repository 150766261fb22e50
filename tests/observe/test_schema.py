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


def test_a_float_or_numpy_step_is_stored_as_pa_array_stored_it():
    """A rank may log ``step=3.0`` or a numpy integer: stored as the whole number, truncated as
    pyarrow did (a step that failed the batch lost every later row of the rank: the step is
    reused by the sections after it)."""
    import numpy as np
    rows = [(1, "metric", "loss", 1.0, 3.0, None), (2, "metric", "loss", 1.0, np.int64(4), np.int16(1)),
            (3, "metric", "loss", 1.0, 5.5, 2.0), (4, "section", "step", 0.1, np.float64(6.0), None)]
    got = from_batch(to_batch(rows, 0))
    assert got["step"] == [3, 4, 5, 6] and got["gpu"] == [None, 1, 2, None]


def test_names_are_strings_or_utf8_bytes_and_nothing_else():
    """What pa.array took for a string column: str, UTF-8 bytes and None; anything else raises
    (the API counts the failed write) rather than storing its repr."""
    batch = to_batch([(1, "metric", b"loss", 1.0, None, None), (2, "metric", None, 2.0, None, None)], 0)
    batch.validate(full=True)
    assert from_batch(batch)["name"] == ["loss", None]
    for bad in (7, b"\xff", "\ud800"):
        with pytest.raises((TypeError, UnicodeError)):
            to_batch([(1, "metric", bad, 1.0, None, None)], 0)


def test_timestamps_in_microseconds_for_remote_write():
    """Remote-write reads µs from any timestamp unit (or an int64 column), and refuses a
    column of another type instead of reading its bits as a time."""
    from hpcml.observe.schema import micros
    assert micros(pa.array([1_700_000_000_123_456_789, None], pa.timestamp("ns", tz="UTC"))) == \
        [1_700_000_000_123_456, None]
    assert micros(pa.array([1_700_000_000], pa.timestamp("s"))) == [1_700_000_000_000_000]
    assert micros(pa.array([5], pa.int64())) == [5]
    with pytest.raises(TypeError):
        micros(pa.array([1.5e15], pa.float64()))
