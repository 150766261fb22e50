"""``hpcml.ipcbounds``: the sizes an Arrow IPC record batch's message claims are the sizes
Arrow allocates when it decodes it, for every codec and column kind the store (or another
writer) uses; a damaged message is a ValueError, never another exception."""

from __future__ import annotations

import io
import random

import numpy as np
import pyarrow as pa
import pytest

from hpcml.ipcbounds import decoded_size


def _messages(table: pa.Table, compression: str | None) -> list:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table, max_chunksize=max(1, table.num_rows // 3))
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(sink.getvalue()))
    schema = pa.ipc.read_schema(reader.read_next_message())
    return [(m, schema) for m in reader]


def _allocated(batch: pa.RecordBatch) -> int:
    """Every buffer of every column, its children's included (``Array.buffers`` is flat)."""
    return sum(b.size for c in batch.columns for b in c.buffers() if b is not None)


TABLE = pa.table({
    "t": pa.array(np.arange(30_000, dtype=np.int64)),
    "v": pa.array(np.where(np.arange(30_000) % 7 == 0, np.nan, 1.5)),
    "s": pa.array([None if i % 5 == 0 else f"name-{i % 13}" for i in range(30_000)]),
    "l": pa.array([[i, i + 1] if i % 3 else None for i in range(30_000)], pa.list_(pa.int32())),
    "n": pa.nulls(30_000),
    "b": pa.array([i % 2 == 0 for i in range(30_000)]),
})


@pytest.mark.parametrize("compression", ["zstd", "lz4", None])
def test_the_claimed_size_is_what_arrow_allocates(compression):
    for message, schema in _messages(TABLE, compression):
        claimed = decoded_size(memoryview(message.metadata), memoryview(message.body))
        assert claimed == _allocated(pa.ipc.read_record_batch(message, schema))


def test_a_schema_message_decodes_to_nothing():
    sink = io.BytesIO()
    pa.ipc.new_stream(sink, TABLE.schema).close()
    message = pa.ipc.MessageReader.open_stream(pa.BufferReader(sink.getvalue())).read_next_message()
    assert message.type == "schema" and decoded_size(message.metadata.to_pybytes(), b"") == 0


def test_a_damaged_message_is_a_value_error_and_nothing_else():
    """Every byte of the metadata, and of the body's length prefixes, flipped at random
    (2,000 tries): the result is a size or a ValueError."""
    message, _ = _messages(TABLE, "zstd")[0]
    meta, body = bytearray(message.metadata.to_pybytes()), message.body.to_pybytes()
    rng = random.Random(7)
    refused = 0
    for _ in range(2000):
        bad = bytearray(meta)
        for _ in range(rng.randint(1, 4)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        try:
            assert decoded_size(bytes(bad), body) >= 0
        except ValueError:
            refused += 1
    assert refused > 100
    for cut in (0, 3, 8, len(meta) // 2):
        with pytest.raises(ValueError):
            decoded_size(bytes(meta[:cut]), body)
    with pytest.raises(ValueError, match="outside the message's body"):
        decoded_size(bytes(meta), body[:len(body) // 2])
