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

    Each column is laid out in Arrow's own format here (``pa.Array.from_buffers``) rather
    than converted by ``pa.array``: that asks pandas, the first time in a process, whether
    the list is a pandas object, which imports pandas where it is installed: 0.3-0.4 s of
    CPU and ~50 MB in every rank that logs a metric (the rank is the user's process, where
    pyarrow's probe must not be answered for it, ``hpcml.arrowprobe``). Values become Python
    floats, and NaN a null, as ``pa.array(..., from_pandas=True)`` made them."""
    import pyarrow as pa
    ts, kind, name, value, step, gpu = zip(*rows) if rows else ((),) * 6
    value = tuple(None if v is None or v != v else float(v) for v in value)
    arrays = [_fixed(pa.timestamp("us", tz="UTC"), "q", [t // 1000 for t in ts]),
              _fixed(pa.int32(), "i", [rank] * len(rows)),
              _strings(kind), _strings(name),
              _fixed(pa.float64(), "d", value), _fixed(pa.int64(), "q", _ints(step)),
              _fixed(pa.int16(), "h", _ints(gpu))]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema())


def _validity(values) -> tuple[bytes | None, int]:
    """Arrow's validity bitmap of ``values`` (None: every value set) and the null count."""
    nulls = sum(v is None for v in values)
    if not nulls:
        return None, 0
    bits = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits), nulls


def _ints(values) -> list:
    """Whole numbers as ``int`` (a float step 3.0, a numpy integer), truncated as
    ``pa.array`` did; None kept."""
    return [v if v is None or type(v) is int else int(v) for v in values]


def _fixed(type_, code: str, values):
    """A fixed-width column from Python numbers (``code``: the ``array`` module's type of
    the same width), None a null; a value out of its range raises OverflowError."""
    from array import array

    import pyarrow as pa
    bitmap, nulls = _validity(values)
    data = array(code, values if not nulls else (0 if v is None else v for v in values))
    return pa.Array.from_buffers(type_, len(values), [None if bitmap is None else pa.py_buffer(bitmap),
                                                      pa.py_buffer(data)], null_count=nulls)


def _strings(values):
    """A string column: 32-bit offsets and the UTF-8 bytes (``bytes`` taken as UTF-8, None a
    null); anything else raises TypeError, as ``pa.array`` did."""
    from array import array

    import pyarrow as pa
    encoded = []
    for v in values:
        if isinstance(v, str):
            encoded.append(v.encode("utf-8"))          # a lone surrogate raises, as pa.array did
        elif isinstance(v, bytes):
            v.decode("utf-8")                          # not UTF-8: raises, as pa.array did
            encoded.append(v)
        elif v is None:
            encoded.append(b"")
        else:
            raise TypeError(f"a string column got {type(v).__name__}")
    offsets = array("i", [0])
    end = 0
    for e in encoded:
        end += len(e)
        offsets.append(end)
    bitmap, nulls = _validity(values)
    return pa.Array.from_buffers(pa.string(), len(values), [None if bitmap is None else pa.py_buffer(bitmap),
                                                           pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
                                 null_count=nulls)


#: an Arrow timestamp's units per second
_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def from_batch(batch) -> dict[str, list]:
    """A batch of the store's schema as Python lists, ``ts`` in epoch seconds (a float).

    Why not ``batch.to_pydict()``: it makes every timestamp a timezone-aware ``datetime``,
    for which pyarrow imports pandas where it is installed (0.3-0.4 s of CPU in each rank's
    recorder, the first time a rank logs). The timestamps are read as their integers here."""
    import pyarrow as pa
    out = {}
    for field, column in zip(batch.schema, batch.columns):
        if pa.types.is_timestamp(field.type):        # to the microsecond, as datetime read them
            out[field.name] = [None if t is None else t / 1_000_000 for t in micros(column)]
        else:
            out[field.name] = column.to_pylist()
    return out


def micros(column) -> list:
    """A timestamp column (any unit) or an int64 one (taken as microseconds) as integer
    microseconds; anything else raises TypeError (a batch not of the store's schema)."""
    import pyarrow as pa
    if pa.types.is_timestamp(column.type):
        per = _PER_S[column.type.unit]
        return [None if t is None else t * 1_000_000 // per for t in column.view(pa.int64()).to_pylist()]
    if pa.types.is_int64(column.type):
        return column.to_pylist()
    raise TypeError(f"a timestamp column of type {column.type}")
