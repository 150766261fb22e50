"""The store's one schema: long rows, so host, GPU, user metrics and sections share it.

Long (one value per row) rather than wide because the set of metric names is open-ended
and differs by rank; DuckDB pivots it back in one statement.
"""

from __future__ import annotations

COLUMNS = ("ts", "rank", "kind", "name", "value", "step", "gpu")
KINDS = ("host", "gpu", "metric", "section", "problem")


def arrow_schema():
    import pyarrow as pa
    return pa.schema([
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("step", pa.int64()),
        pa.field("gpu", pa.int16()),
    ])


def to_batch(rows: list[tuple], rank: int):
    """Rows are (ts_ns, kind, name, value, step, gpu) tuples, as the buffers hold them.
    Values become Python floats first: a recorder's pyarrow knows no numpy (``hpcml.arrowprobe``)."""
    import pyarrow as pa
    ts, kind, name, value, step, gpu = zip(*rows)
    value = tuple(v if v is None or type(v) is float else float(v) for v in value)
    return pa.record_batch([
        pa.array([t // 1000 for t in ts], pa.timestamp("us", tz="UTC")),
        pa.array([rank] * len(rows), pa.int32()),
        pa.array(kind, pa.string()),
        pa.array(name, pa.string()),
        pa.array(value, pa.float64(), from_pandas=True),
        pa.array(step, pa.int64()),
        pa.array(gpu, pa.int16()),
    ], schema=arrow_schema())


#: microseconds per unit of an Arrow timestamp
_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def from_batch(batch) -> dict[str, list]:
    """A batch of the store's schema as Python lists, ``ts`` in epoch seconds (a float).

    Why not ``batch.to_pydict()``: it makes every timestamp a timezone-aware ``datetime``,
    for which pyarrow imports pandas where it is installed (0.3-0.4 s of CPU in each rank's
    recorder, the first time a rank logs). The timestamps are read as their integers here."""
    import pyarrow as pa
    out = {}
    for field, column in zip(batch.schema, batch.columns):
        if pa.types.is_timestamp(field.type):
            per = _PER_S[field.type.unit]
            out[field.name] = [None if t is None else t / per for t in column.view(pa.int64()).to_pylist()]
        else:
            out[field.name] = column.to_pylist()
    return out
