"""Rank files the job's own program wrote (it can write its ``observe/rank-N.arrows``): another
schema, a FIFO, a symbolic link out of the job directory, a few KB that decode to GBs. Each
is that rank's ``problem``; the report, the GPU score and ``hpcml farm results`` read the
rest of the job, and ``hpcml run`` ends as its job ended whatever its report does."""

from __future__ import annotations

import os
import threading
import time
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from hpcml.observe import store
from hpcml.observe.schema import arrow_schema
from hpcml.observe.series import read_series
from hpcml.observe.store import RankWriter, read_job, read_rank
from hpcml.samplers import NoGpuSamples
from hpcml.testing.synthetic_job import make_job


def _stream(path: Path, batches: list, schema, compression: str | None = None) -> Path:
    """``batches`` written as a rank writes its file: one Arrow IPC stream."""
    with pa.OSFile(str(path), "wb") as fh:
        w = pa.ipc.new_stream(fh, schema, options=pa.ipc.IpcWriteOptions(compression=compression))
        for b in batches:
            w.write_batch(b)
        w.close()
    return path


def _foreign(path: Path) -> Path:
    sch = pa.schema([("x", pa.int64())])
    return _stream(path, [pa.record_batch([pa.array([1, 2, 3])], schema=sch)], sch)


def _zeros(n: int):
    """``n`` rows of the store's schema, every byte zero (empty strings): zstd's best case."""
    cols = []
    for f in arrow_schema():
        if f.type == pa.string():
            cols.append(pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.zeros(4 * (n + 1), np.uint8)),
                                                                pa.py_buffer(b"")]))
        else:
            cols.append(pa.Array.from_buffers(f.type, n, [None, pa.py_buffer(np.zeros(n * f.type.bit_width // 8,
                                                                                      np.uint8))]))
    return pa.RecordBatch.from_arrays(cols, schema=arrow_schema())


def test_a_rank_file_of_another_schema_is_that_rank_s_problem(tmp_path):
    """One rank's file holds another program's table (a column ``x``): read_job raised
    ArrowInvalid, the report and the score KeyError; now the rank's problem names its
    columns and the other ranks are read."""
    d = make_job(tmp_path / "job", 4, 50, seed=1)
    (d / "rank-00002.arrows").unlink()
    _foreign(d / "rank-00002.arrows")
    got = read_rank(d / "rank-00002.arrows")
    assert got.batches == [] and got.problem and "not an hpcml observe store file" in got.problem
    assert "x (int64)" in got.problem
    job = read_job(d)
    assert set(job.problems) == {2} and job.missing == [2] and job.table.schema.equals(arrow_schema())
    series = read_series(d)
    assert set(series.problems) == {2} and series.missing == [2] and series.rows == job.table.num_rows
    from hpcml.score.importers import load
    rec = load(d, "store")
    assert any(n.startswith("rank 2: not an hpcml observe store file") for n in rec.notes), rec.notes


def test_a_store_of_foreign_files_only_scores_as_no_gpu_samples(tmp_path):
    """The score of a store whose every rank file is another program's: no GPU samples
    (KeyError 'Field "kind" does not exist in schema' before)."""
    d = tmp_path / "job"
    d.mkdir()
    _foreign(d / "rank-00000.arrows")
    from hpcml.score.importers import load
    with pytest.raises(NoGpuSamples):
        load(d, "store")
    assert read_series(d).series == {}


def test_a_store_without_a_gpu_column_reads_in_the_store_s_schema(tmp_path):
    """Another producer's rows without ``gpu``: each batch gets a null one, so read_job (an
    ArrowInvalid before) and every reader see the store's own schema."""
    d = make_job(tmp_path / "job", 2, 20, seed=2)
    f = d / "rank-00001.arrows"
    with pa.ipc.open_stream(f.read_bytes()) as r:
        t = r.read_all().drop_columns(["gpu"])
    f.unlink()
    _stream(f, t.to_batches(), t.schema, "zstd")
    got = read_rank(f)
    assert got.problem is None and all(b.schema.equals(arrow_schema()) for b in got.batches)
    assert sum(b.num_rows for b in got.batches) == t.num_rows
    assert sum(b.column("gpu").null_count for b in got.batches) == t.num_rows
    assert read_job(d).problems == {}


def _in_thread(fn, timeout: float = 10.0):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "still blocked"
    return out[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_like_a_rank_file_is_not_waited_on(tmp_path):
    """A FIFO under a rank file's name: open() blocked for ever (no writer); now the rank's
    problem, and the job reads without it."""
    d = make_job(tmp_path / "job", 2, 20, seed=3)
    (d / "rank-00001.arrows").unlink()
    os.mkfifo(d / "rank-00001.arrows")
    t0 = time.monotonic()
    got = _in_thread(lambda: read_rank(d / "rank-00001.arrows"))
    assert got.problem == "unreadable: a FIFO, not a regular file" and time.monotonic() - t0 < 5
    job = _in_thread(lambda: read_job(d))
    assert set(job.problems) == {1} and job.missing == [1]


def test_a_symbolic_link_out_of_the_job_directory_is_not_followed(tmp_path):
    """A rank file that is a link to a file elsewhere (another job's store, anything the
    job's user can name) is not read through."""
    other = make_job(tmp_path / "other", 1, 20, seed=4)
    d = make_job(tmp_path / "job", 2, 20, seed=5)
    (d / "rank-00001.arrows").unlink()
    (d / "rank-00001.arrows").symlink_to(other / "rank-00000.arrows")
    got = read_rank(d / "rank-00001.arrows")
    assert got.batches == [] and got.problem == "unreadable: a symbolic link, not followed"
    assert set(read_job(d).problems) == {1}


def test_a_tiny_file_that_decodes_to_far_more_is_cut_at_the_bound(tmp_path, monkeypatch):
    """zstd turns a few KB of the store's own schema into hundreds of MB: read until
    ``DECODED_PER_BYTE`` times the file's size (the floor lowered here, to keep the test
    small), then the problem says so."""
    monkeypatch.setattr(store, "DECODED_FLOOR", 1 << 20)
    f = _stream(tmp_path / "rank-00000.arrows", [_zeros(200_000)] * 4, arrow_schema(), "zstd")
    size = f.stat().st_size
    limit = max(1 << 20, store.DECODED_PER_BYTE * size)
    assert 4 * _zeros(200_000).nbytes > 3 * limit          # a bomb: far past the bound
    got = read_rank(f)
    assert got.problem and got.problem.startswith(f"larger than {limit} bytes decoded from a file of {size} bytes")
    assert sum(b.nbytes for b in got.batches) <= limit


def test_one_batch_that_claims_more_than_the_bound_is_never_decoded(tmp_path):
    """One zstd batch of a few KB that decodes to ~100 MB: counted once decoded, it was
    decoded whole (a 37 KB file became 1.2 GB) before the bound cut it. It is now counted
    from its message: refused before Arrow allocates it. Arrow's memory pool's peak, in a
    process of its own, shows what the read allocated."""
    import json
    import subprocess
    import sys
    batch = _zeros(2_000_000)
    f = _stream(tmp_path / "rank-00000.arrows", [_zeros(1000), batch], arrow_schema(), "zstd")
    size = f.stat().st_size
    limit = (1 << 20) + store.DECODED_PER_BYTE * size
    assert batch.nbytes > 2 * limit                     # one batch far past the bound
    code = ("import json, sys, pyarrow as pa; from hpcml.observe import store\n"
            "store.DECODED_FLOOR = 1 << 20\n"
            "got = store.read_rank(sys.argv[1])\n"
            "print(json.dumps([got.problem, [b.num_rows for b in got.batches], pa.default_memory_pool().max_memory()]))")
    out = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(store.__file__).parents[2])})
    problem, rows, peak = json.loads(out.stdout)
    assert problem.startswith("larger than") and rows == [1000]
    assert peak < batch.nbytes / 4, peak


def test_a_batch_whose_buffers_lie_outside_its_body_is_the_rank_s_problem(tmp_path):
    """A message whose metadata points a buffer past its body is refused as damaged, the
    batches before it kept. The file is the writer's own, with one buffer entry of the
    second batch's metadata (two little-endian int64s: offset, length) rewritten."""
    import struct
    f = _stream(tmp_path / "rank-00000.arrows", [_zeros(10), _zeros(10)], arrow_schema(), "zstd")
    raw = bytearray(f.read_bytes())
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(bytes(raw)))
    reader.read_next_message()
    first, second = reader.read_next_message(), reader.read_next_message()
    meta, body = second.metadata.to_pybytes(), second.body.size
    at = raw.find(meta, raw.find(first.metadata.to_pybytes()) + 1)
    from hpcml.ipcbounds import _Table
    batch = _Table(meta, struct.unpack_from("<I", meta, 0)[0]).table(2)      # Message.header: RecordBatch
    vector = batch._field(2)                                                 # RecordBatch.buffers
    start = vector + struct.unpack_from("<I", meta, vector)[0]
    k = start + 4 + 16 * (struct.unpack_from("<I", meta, start)[0] - 1)      # its last Buffer
    assert at > 0 and sum(struct.unpack_from("<qq", meta, k)) <= body
    raw[at + k:at + k + 16] = struct.pack("<qq", struct.unpack_from("<q", meta, k)[0], body + 4096)
    f.write_bytes(bytes(raw))
    got = read_rank(f)
    assert got.problem and got.problem.startswith("a damaged batch after 1 batches"), got.problem
    assert [b.num_rows for b in got.batches] == [10]


def _messages(data: bytes) -> list[list]:
    """A stream's messages as [flatbuffer metadata, body], to rewrite one as a hostile writer
    would (Arrow's encapsulated format: 0xFFFFFFFF, the metadata's length, then both)."""
    import struct

    from hpcml.ipcbounds import _Table
    out, pos = [], 0
    while pos + 8 <= len(data):
        _cont, n = struct.unpack_from("<Ii", data, pos)
        if n == 0:
            break
        meta = bytearray(data[pos + 8:pos + 8 + n])
        body_len = _Table(bytes(meta), struct.unpack_from("<I", meta, 0)[0]).scalar(3, "<q", 0)
        out.append([meta, data[pos + 8 + n:pos + 8 + n + body_len]])
        pos += 8 + n + body_len
    return out


def _joined(messages: list[list], end: bool = True) -> bytes:
    import struct
    out = bytearray()
    for meta, body in messages:
        meta = bytes(meta) + b"\0" * (-len(meta) % 8)
        out += struct.pack("<Ii", 0xFFFFFFFF, len(meta)) + meta + bytes(body)
    return bytes(out + (struct.pack("<Ii", 0xFFFFFFFF, 0) if end else b""))


def _in_child(path: Path) -> tuple[int, str | None, int, int]:
    """``read_rank`` in a process of its own (a crash is its exit status, not the test's):
    its exit code, the problem, the rows kept and Arrow's peak allocation."""
    import json
    import subprocess
    import sys
    code = ("import json, sys, pyarrow as pa; from hpcml.observe import store\n"
            "store.DECODED_FLOOR = 1 << 20\n"
            "got = store.read_rank(sys.argv[1])\n"
            "print(json.dumps([got.problem, sum(b.num_rows for b in got.batches), pa.default_memory_pool().max_memory()]))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(store.__file__).parents[2])})
    if out.returncode:
        return out.returncode, out.stderr[-300:], 0, 0
    problem, rows, peak = json.loads(out.stdout)
    return 0, problem, rows, peak


def _batch_table(meta: bytearray):
    import struct

    from hpcml.ipcbounds import _Table
    return _Table(bytes(meta), struct.unpack_from("<I", meta, 0)[0])


def test_a_v4_batch_compressed_by_its_custom_metadata_is_refused(tmp_path):
    """Arrow reads a V4 batch without a BodyCompression table as compressed when its custom
    metadata says ``ARROW:experimental_compression``: counted by its stored sizes, six of them
    (33 KB) were 912 MB read (the review's finding). The store writes V5: a V4 batch is refused."""
    import struct
    batch = _zeros(2_000_000)
    sink = tmp_path / "v4.arrows"
    with pa.OSFile(str(sink), "wb") as fh:
        w = pa.ipc.new_stream(fh, arrow_schema(), options=pa.ipc.IpcWriteOptions(
            compression="zstd", metadata_version=pa.ipc.MetadataVersion.V4))
        w.write_batch(batch, custom_metadata={"ARROW:experimental_compression": "zstd"})
        w.close()
    messages = _messages(sink.read_bytes())
    message = _batch_table(messages[1][0])
    slot = message.table(2).vtable + 4 + 2 * 3                # RecordBatch.compression's vtable entry
    struct.pack_into("<H", messages[1][0], slot, 0)           # no BodyCompression: the older way only
    f = tmp_path / "rank-00000.arrows"
    f.write_bytes(_joined(messages))
    rc, problem, rows, peak = _in_child(f)
    assert rc == 0 and problem and "metadata version V4" in problem and rows == 0, problem
    assert peak < batch.nbytes / 4


@pytest.mark.parametrize("attack", ["rows", "offsets", "body", "not-a-schema-first", "empty", "name"])
def test_a_crafted_message_is_the_rank_s_problem_never_a_crash(tmp_path, attack):
    """Each once crashed or raised out of ``read_rank`` (the review's files, rebuilt here):
    2^30 rows claimed over 8 rows' buffers (a segfault where the batch was used, 2 GiB for a
    null column), a string offset 2 GB past its data (a segfault), a body length of 2^62 (a
    MemoryError), a schema message whose header says record batch (pyarrow's read_schema
    segfaults: found by the review's fuzzing),
    an empty file (an empty reason), a column name that is not UTF-8 (a traceback)."""
    import struct
    f = tmp_path / "rank-00000.arrows"
    messages = _messages(_stream(tmp_path / "w.arrows", [_zeros(8)], arrow_schema(), "zstd").read_bytes())
    meta, body = messages[1]
    rb = _batch_table(meta).table(2)
    if attack == "rows":
        struct.pack_into("<q", meta, rb._field(0), 1 << 30)                     # RecordBatch.length
        start = rb._field(1) + struct.unpack_from("<I", meta, rb._field(1))[0]
        for k in range(struct.unpack_from("<I", meta, start)[0]):             # each FieldNode.length
            struct.pack_into("<q", meta, start + 4 + 16 * k, 1 << 30)
    elif attack == "offsets":
        plain = _messages(_stream(tmp_path / "p.arrows", [_zeros(8)], arrow_schema()).read_bytes())
        meta, body = plain[1]
        body = bytearray(body)
        string_col = [i for i, fld in enumerate(arrow_schema()) if fld.type == pa.string()][0]
        buffers = _batch_table(meta).table(2).structs(2, 16)
        # two buffers (validity, values) before each fixed-width column, three before a string one
        index = sum(3 if fld.type == pa.string() else 2 for fld in list(arrow_schema())[:string_col]) + 1
        off, length = struct.unpack("<qq", buffers[index])
        struct.pack_into("<i", body, off + length - 4, 0x7FFF0000)
        messages = [plain[0], [meta, bytes(body)]]
    elif attack == "body":
        struct.pack_into("<q", meta, _batch_table(meta)._field(3), 1 << 62)     # Message.bodyLength
    if attack == "not-a-schema-first":           # the schema's own message, its header typed a batch
        schema_meta = messages[0][0]
        head = _batch_table(schema_meta)
        struct.pack_into("<B", schema_meta, head._field(1), 3)              # Message.header_type
        f.write_bytes(_joined(messages))
    elif attack == "empty":
        f.write_bytes(b"")
    elif attack == "name":
        data = _stream(tmp_path / "n.arrows", [], pa.schema([pa.field("QQQQ", pa.int64())])).read_bytes()
        f.write_bytes(data.replace(b"QQQQ", b"\xff\xfeQQ"))
    else:
        f.write_bytes(_joined([messages[0], [meta, body]], end=attack != "body"))
    rc, problem, rows, peak = _in_child(f)
    assert rc == 0, (rc, problem)
    assert problem and rows == 0 and peak < 64 << 20, (problem, rows, peak)
    assert problem.strip() not in ("unreadable:", "unreadable: ")
    if attack == "name":
        assert "not UTF-8" in problem


def test_metadata_past_its_bound_is_refused_before_arrow_reads_it(tmp_path):
    """Arrow builds what a message's flatbuffer references as often as it is referenced: a
    1.1 MB file whose 20,000 metadata entries point at one 1 MiB string aborted the reader
    (std::bad_alloc, the review's finding). Metadata is bounded (``METADATA_MAX``) before
    Arrow sees it; here a schema with 20 KB of it, as any writer can make one."""
    from hpcml.ipcbounds import METADATA_MAX
    schema = arrow_schema().with_metadata({"note": "x" * 20_000})
    f = _stream(tmp_path / "rank-00000.arrows", [_zeros(8).replace_schema_metadata(schema.metadata)], schema)
    rc, problem, rows, _peak = _in_child(f)
    assert rc == 0 and problem and f"(at most {METADATA_MAX} read)" in problem and rows == 0, problem


def test_a_stream_in_the_framing_before_arrow_0_15_reads(tmp_path):
    """The stream framing without the continuation marker (``use_legacy_format``) is read as
    Arrow reads it: every batch, no problem."""
    f = tmp_path / "rank-00000.arrows"
    with pa.OSFile(str(f), "wb") as fh:
        w = pa.ipc.new_stream(fh, arrow_schema(), options=pa.ipc.IpcWriteOptions(
            compression="zstd", use_legacy_format=True))
        for n in (5, 7):
            w.write_batch(_zeros(n))
        w.close()
    got = read_rank(f)
    assert got.problem is None and [b.num_rows for b in got.batches] == [5, 7]


def test_a_rank_killed_mid_batch_keeps_every_whole_batch(tmp_path):
    """A file cut anywhere inside its last message (``kill -9`` mid-write): the whole batches
    before it are read, and the problem says truncated."""
    f = _stream(tmp_path / "w.arrows", [_zeros(5), _zeros(7), _zeros(9)], arrow_schema(), "zstd")
    raw = f.read_bytes()
    whole = len(_joined(_messages(raw)[:3], end=False))
    for cut in range(whole + 1, len(raw) - 8, 37):
        (tmp_path / "rank-00000.arrows").write_bytes(raw[:cut])
        got = read_rank(tmp_path / "rank-00000.arrows")
        assert [b.num_rows for b in got.batches] == [5, 7], cut
        assert got.problem and got.problem.startswith("truncated after 2 batches"), (cut, got.problem)


def test_the_store_s_own_files_are_far_inside_the_bound(tmp_path, monkeypatch):
    """The ratio alone (no floor) never cuts a real rank file: the writer's own batches of
    constant values, the most compressible a real store gets, decode to under 10 times
    their size."""
    monkeypatch.setattr(store, "DECODED_FLOOR", 0)
    w = RankWriter.create(tmp_path, 0)
    t0 = 1_767_225_600_000_000_000
    for s in range(200):
        w.write_rows([(t0 + s * 10**9, "gpu", f"field_{k}", 100.0, None, g) for g in range(8) for k in range(25)]
                     + [(t0 + s * 10**9, "metric", "loss", 1.0, s, None)])
    w.close()
    f = next(tmp_path.glob("rank-*.arrows"))
    got = read_rank(f)
    assert got.problem is None and sum(b.num_rows for b in got.batches) == 200 * 201
    assert sum(b.nbytes for b in got.batches) < 10 * f.stat().st_size


def test_hpcml_run_ends_when_its_report_fails(tmp_path, monkeypatch, capsys):
    """The report failing (any reason: a store nobody foresaw) is one line on stderr; the
    launcher goes on to its end (phases, exit code) and run.json still gets its ledger."""
    from hpcml.jobmodel import RunRecord
    from hpcml.run import launcher, report
    from hpcml.run.jobdir import read_run, write_run
    d = tmp_path / "job"
    d.mkdir()
    t0 = time.time() - 100
    write_run(d, RunRecord(command=["x"], mode="local", started=t0, ended=t0 + 60, exit_code=1))
    (d / "observe").mkdir()

    def broken(_d):
        raise RuntimeError("a report\nthat failed")
    monkeypatch.setattr(report, "build", broken)
    launcher._report(d, types.SimpleNamespace(report=True, collector=None))
    err = capsys.readouterr().err
    assert "hpcml run: no report: RuntimeError: a report that failed\n" in err
    assert read_run(d).exit_code == 1
