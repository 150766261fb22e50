"""The job store: a directory with one append-only Arrow IPC stream per rank.

Why Arrow's *stream* format: it has no footer, so a file cut anywhere by ``kill -9``
still reads up to its last complete batch (Parquet and Arrow's file format are unreadable
until their footer is written). Each flush appends one record batch (zstd-compressed
buffers) and hands it to the OS, so a killed rank loses at most its last flush interval.
Analysis: ``read_job(dir).table`` is a pyarrow Table that DuckDB queries directly
(``duckdb.sql("select ... from table")``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hpcml import ipcbounds, progress
from hpcml.errors import UsageError
from hpcml.files import JSON_MAX, load_json_bounded, write_atomic
from hpcml.observe.schema import arrow_schema, to_batch
from hpcml.schemas import check, tag

_RANK_RE = re.compile(r"^rank-(\d+)(?:\.(\d+))?\.arrows$")
JOB_META = "job.json"
RANK_META = "rank-{rank:05d}.json"
JOB_SCHEMA = tag("observe.job", 1)      # job.json
RANK_SCHEMA = tag("observe.rank", 1)    # rank-NNNNN.json
#: The most a rank file is read to, decoded: ``DECODED_PER_BYTE`` times its size on disk,
#: and never less than ``DECODED_FLOOR``. The job's own program can write its rank file, and
#: zstd decodes a 37 KB file of zeros to 1.2 GB (150M rows): the report (8 files at once, on
#: threads) must not allocate what such a file claims. The store's own files decode to 3-8
#: times their size (52 bytes a row decoded; 1 s flushes of 8 GPUs x 25 constant fields and
#: 30 host rows: 5.6; 100,000-row flushes of one metric: 7.4), so 1,024 is a hundred times
#: what a real file needs at any length: a day at 1 s sampling of 300 rows a second (8 GPUs'
#: DCGM fields, host, 20 steps a second of sections and metrics) is 26M rows, 1.4 GB
#: decoded from a ~250 MB file. The floor (256 MiB) is for small files, whose real ones
#: decode to a few MiB. A batch is counted before it is decoded, from the sizes its message
#: claims (``hpcml.ipcbounds``): one that would pass the bound is never allocated.
DECODED_PER_BYTE = 1024
DECODED_FLOOR = 256 << 20


def rank_path(job_dir: str | os.PathLike, rank: int) -> Path:
    """This rank's next file: ``rank-00003.arrows``, or ``rank-00003.1.arrows`` after a
    restart (a stream is never appended to once closed or cut)."""
    base = Path(job_dir)
    path = base / f"rank-{rank:05d}.arrows"
    k = 0
    while path.exists():
        k += 1
        path = base / f"rank-{rank:05d}.{k}.arrows"
    return path


class RankWriter:
    """Appends batches of rows to one rank's stream; ``sink`` is a path or a writable fd."""

    def __init__(self, sink: str | os.PathLike | IO[bytes], rank: int) -> None:
        import pyarrow as pa
        self.rank = rank
        self._own = isinstance(sink, (str, os.PathLike))
        self._fh: IO[bytes] = open(sink, "xb") if isinstance(sink, (str, os.PathLike)) else sink
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        self._writer = pa.ipc.new_stream(self._fh, arrow_schema(), options=options)
        self._fh.flush()

    @classmethod
    def create(cls, job_dir: str | os.PathLike, rank: int) -> RankWriter:
        """A new stream for ``rank`` in ``job_dir``, under the next free name, taken
        atomically: the recorder and the API inside a container may both start a segment of
        one rank at the same moment, and neither may fail or overwrite the other's."""
        for _ in range(1000):
            path = rank_path(job_dir, rank)
            try:
                fh = open(path, "xb")
            except FileExistsError:
                continue                          # taken between the look and the open: the next one
            writer = cls(fh, rank)
            writer._own = True
            return writer
        raise FileExistsError(f"no free file name for rank {rank} in {job_dir}")

    def write_rows(self, rows: list[tuple]) -> None:
        if rows:
            self.write_batch(to_batch(rows, self.rank))

    def write_batch(self, batch) -> None:
        self._writer.write_batch(batch)
        self._fh.flush()

    def close(self) -> None:
        try:
            self._writer.close()
            self._fh.flush()
        finally:
            if self._own:
                self._fh.close()


@dataclass
class RankData:
    rank: int
    path: Path
    batches: list = field(default_factory=list)
    problem: str | None = None          # why reading stopped early (truncated, corrupt)


def read_rank(path: str | os.PathLike) -> RankData:
    """Every complete batch of one rank file, each in the store's own schema; a damaged
    tail, or a file that is not a rank file (another schema, not a regular file, a symbolic
    link, more than ``DECODED_PER_BYTE`` times its size decoded) is the rank's ``problem``,
    never raised: the job's own program can write these files."""
    import pyarrow as pa
    p = Path(path)
    m = _RANK_RE.match(p.name)
    data = RankData(rank=int(m.group(1)) if m else -1, path=p)
    try:
        fh = _open_regular(p)
    except (OSError, ValueError) as exc:
        data.problem = f"unreadable: {exc.strerror or exc}" if isinstance(exc, OSError) else f"unreadable: {exc}"
        return data
    with fh:
        size = os.fstat(fh.fileno()).st_size
        limit = max(DECODED_FLOOR, DECODED_PER_BYTE * size)
        try:
            got = ipcbounds.next_message(fh, size)
            if got is None:
                data.problem = "unreadable: empty"
                return data
            schema_message = ipcbounds.framed(*got)
            first = pa.ipc.read_message(pa.py_buffer(schema_message))
            if first.type != "schema":          # read_schema of another message crashes pyarrow (SIGSEGV)
                data.problem = f"unreadable: it starts with a {first.type} message, not a schema"
                return data
            schema = pa.ipc.read_schema(first)
        except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
            data.problem = f"unreadable: {str(exc) or type(exc).__name__}"
            return data
        try:
            conform = _conform(schema)
            if conform is None:
                data.problem = f"not an hpcml observe store file: its columns are {_columns(schema)}"
                return data
        except MemoryError:
            data.problem = "unreadable: a schema too large to describe"
            return data
        _read_batches(fh, size, schema_message, conform, data, limit)
    return data


#: checked messages decoded together by Arrow's stream reader (as fast as it reads a file);
#: what a rank file's read holds beside its batches is this, not a copy of the whole file
DECODE_CHUNK = 32 << 20


def _read_batches(fh: IO[bytes], size: int, schema: bytes, conform, data: RankData, limit: int) -> None:
    """The stream's record batches into ``data``, up to its end, a damaged message, or the
    one that would take the bytes decoded past ``limit``: each counted from what its message
    claims (``ipcbounds.decoded_size``) before Arrow sees it, so a batch that claims
    gigabytes is never allocated; checked messages are decoded ``DECODE_CHUNK`` at a time.
    Why reading stopped is the rank's ``problem``."""
    decoded = 0
    held = [0]                                  # what Arrow decoded, counted again after it
    pending: list[bytes] = []
    pending_bytes = 0
    stopped: str | None = None
    while True:
        try:
            got = ipcbounds.next_message(fh, size)
            if got is None:
                break
            claimed = ipcbounds.decoded_size(*got)
        except ipcbounds.Truncated as exc:
            stopped = f"truncated after {{n}} batches ({exc})"
            break
        except ValueError as exc:
            stopped = f"a damaged batch after {{n}} batches ({exc})"
            break
        kind = ipcbounds.message_type(got[0])
        if kind != ipcbounds.RECORD_BATCH:     # the store's schema has no dictionaries
            stopped = f"a {ipcbounds.HEADERS.get(kind, f'type {kind}')} message after {{n}} batches: not the store's"
            break
        decoded += claimed
        if decoded > limit:
            stopped = f"larger than {limit} bytes decoded from a file of {size} bytes: read {{n}} batches, not the rest"
            break
        pending.append(ipcbounds.framed(*got))
        pending_bytes += len(pending[-1])
        if pending_bytes >= DECODE_CHUNK:
            if not _decode([schema, *pending], conform, data, held, limit):
                return
            pending, pending_bytes = [], 0
    if _decode([schema, *pending], conform, data, held, limit) and stopped is not None:
        data.problem = stopped.format(n=len(data.batches))


def _decode(messages: list[bytes], conform, data: RankData, held: list[int], limit: int) -> bool:
    """Checked messages (the schema's first) decoded by Arrow's stream reader, each batch
    validated whole before anything uses it and its buffers counted into ``held`` against
    ``limit`` (the claims' check); False, with the rank's problem, at the first that fails
    (the batches before it kept)."""
    import pyarrow as pa
    if len(messages) < 2:
        return True
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(b"".join(messages)))
        for batch in reader:
            # lengths, offsets and text checked against the buffers: a batch that claims 2^30
            # rows over 8 rows' buffers, or an offset past its data, crashed whoever read it
            batch.validate(full=True)
            held[0] += batch.get_total_buffer_size()
            if held[0] > limit:
                data.problem = f"larger than {limit} bytes decoded: read {len(data.batches)} batches, not the rest"
                return False
            data.batches.append(conform(batch))
    except (pa.ArrowException, OSError, MemoryError) as exc:
        data.problem = f"a damaged batch after {len(data.batches)} batches ({exc})"
        return False
    return True


def _open_regular(p: Path) -> IO[bytes]:
    """``p`` opened for reading as a file anyone could have replaced: a FIFO is not waited
    on (O_NONBLOCK), a symbolic link is not followed out of the job directory (O_NOFOLLOW),
    anything but a regular file is a ValueError."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("a symbolic link, not followed") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a device")
            raise ValueError(f"{kind}, not a regular file")
        os.set_blocking(fd, True)
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def _columns(schema) -> str:
    """A foreign file's columns as said in its problem: its names are the writer's, shown as
    text (``printable``: no terminal escapes, no faked lines; a name that is not UTF-8 said so)."""
    from hpcml.words import printable
    try:
        said = ", ".join(f"{f.name} ({f.type})" for f in schema)
    except UnicodeDecodeError:
        said = "named in bytes that are not UTF-8"
    return printable(said, 200)


def _conform(schema):
    """How a batch of a file of ``schema`` becomes one in the store's own schema: as it is
    (the same schema), with a null ``gpu`` column (a store of another producer without
    one); None for any other schema (another program's file under a rank file's name)."""
    import pyarrow as pa
    own = arrow_schema()
    if schema.equals(own, check_metadata=False):
        return lambda batch: batch
    without_gpu = own.remove(own.get_field_index("gpu"))
    if schema.equals(without_gpu, check_metadata=False):
        gpu = own.field("gpu")
        return lambda batch: pa.RecordBatch.from_arrays([*batch.columns, pa.nulls(batch.num_rows, gpu.type)],
                                                        schema=own)
    return None


@dataclass
class JobData:
    path: Path
    meta: dict[str, Any]
    ranks: dict[int, RankData]
    table: Any                               # pyarrow.Table of every rank's rows
    missing: list[int]                        # ranks the metadata expects but no data has

    @property
    def problems(self) -> dict[int, str]:
        return {r: d.problem for r, d in self.ranks.items() if d.problem}


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def earlier_runs(rank_meta_path: Path) -> list[dict[str, Any]]:
    """The runs of this rank that an earlier recorder in the same store recorded (a requeued
    Slurm job started again with the same store): their start, end and exit code, kept in
    the new ``rank-NNNNN.json`` under ``earlier`` instead of being overwritten. The report
    reads their starts to tell the time between two runs from a stall."""
    from hpcml.files import load_json_bounded
    try:
        old = load_json_bounded(rank_meta_path, 1 << 20)
    except (OSError, ValueError):
        return []
    if not isinstance(old, dict):
        return []
    kept = [e for e in old.get("earlier") or [] if isinstance(e, dict)]
    return [*kept, {k: old.get(k) for k in ("start", "end", "exit_code", "signal", "node", "host")}]


def read_meta(path: str | os.PathLike) -> tuple[Path, dict[str, Any], list[Path]]:
    """A job directory's metadata (job.json with each rank's under "ranks") and its rank
    files, without reading any data; not a job directory is bad input (exit 2)."""
    p = Path(path)
    if p.is_file():
        hint = f"; give its directory: {p.parent}" if p.name == JOB_META or _RANK_RE.match(p.name) else ""
        raise UsageError(f"a file, not a job directory{hint}", file=str(p))
    if not p.is_dir():
        raise UsageError("not a job directory (it does not exist)", file=str(p))
    files = sorted(f for f in p.iterdir() if _RANK_RE.match(f.name))
    meta_path = p / JOB_META
    if not files and not meta_path.exists():
        hint = ""
        if (p / "run.json").is_file():      # an hpcml run job directory: its stores are inside
            hint = (f"; an hpcml run job directory: its store is {p / 'observe'} (a requeued job's attempt N: "
                    f"{p / 'attempts' / 'N' / 'observe'}), and `hpcml report {p}` covers every attempt")
        raise UsageError(f"not a job directory: no job.json and no rank-*.arrows files{hint}", file=str(p))
    meta: dict[str, Any] = {}
    if meta_path.exists():
        try:
            meta = load_json_bounded(meta_path, JSON_MAX)
        except (OSError, ValueError) as exc:
            raise UsageError(f"job metadata is not valid JSON: {exc}", file=str(meta_path)) from None
        check(meta, JOB_SCHEMA, str(meta_path), untagged=True)   # untagged: recorded before tags
    for f in sorted(p.glob("rank-*.json")):
        try:
            rank_meta = load_json_bounded(f, JSON_MAX)
            check(rank_meta, RANK_SCHEMA, str(f), untagged=True)
            meta.setdefault("ranks", {})[str(rank_meta["rank"])] = rank_meta
        except (OSError, ValueError, KeyError):
            continue
    return p, meta, files


def files_by_rank(files: list[Path]) -> dict[int, list[Path]]:
    """Rank -> its files in order (a restarted rank has ``rank-N.1.arrows`` ...)."""
    by_rank: dict[int, list[tuple[int, Path]]] = {}
    for f in files:
        m = _RANK_RE.match(f.name)
        assert m is not None, f  # read_meta lists only rank-*.arrows files
        by_rank.setdefault(int(m.group(1)), []).append((int(m.group(2) or 0), f))
    # by segment number: a name sort puts rank-3.1 before rank-3 and rank-3.10 before rank-3.2
    return {r: [f for _, f in sorted(segs)] for r, segs in by_rank.items()}


def iter_ranks(files: list[Path], read=None):
    """Each rank's data in turn, its restart segments joined, so a caller can reduce one
    rank before the next is read (a 1,024-rank job never sits in memory at once).
    ``read``: a file's RankData when the files were read already (default ``read_rank``)."""
    read = read or read_rank
    by_rank = files_by_rank(files)
    for rank in sorted(by_rank):
        data = None
        for f in by_rank[rank]:
            d = read(f)
            if data is None:
                data = d
            else:
                data.batches += d.batches
                data.problem = data.problem or d.problem
        yield data


def _read_all(files: list[Path]) -> list[RankData]:
    """Every rank, its segments joined, files read on threads: Arrow decompresses without
    the GIL, so a 1,024-rank job reads in about half the time on 2 cores."""
    from concurrent.futures import ThreadPoolExecutor
    count = progress.Counter("reading rank files", len(files))

    def one(f: Path) -> RankData:
        data = read_rank(f)
        count.step()
        return data
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        read = dict(zip(files, pool.map(one, files)))
    return list(iter_ranks(files, read.__getitem__))


def missing_ranks(meta: dict[str, Any], with_data: set[int]) -> list[int]:
    """Ranks the metadata expects that have no data. Without ``job.json``'s ``ntasks`` (rank
    0's recorder writes it: one that never started wrote none) where recorders ran (their
    ``rank-N.json``), the ranks below the highest one seen that have no data, rank 0 among
    them: the job had at least that many, and a store with a gap is not whole (not "no rank
    missing"). A store written by ``observe.log`` alone (no recorder) names none: which
    ranks log is the script's choice."""
    n = int(meta.get("ntasks") or 0)
    recorded = {int(r) for r in meta.get("ranks") or {} if str(r).isdigit()}
    if not n and recorded:        # recorders ran (rank-N.json); a store of observe.log alone says nothing
        seen = set(with_data) | recorded
        n = max(seen) + 1
    return [r for r in range(n) if r not in with_data]


def read_job(path: str | os.PathLike) -> JobData:
    """All ranks of a job directory; not a job directory is bad input (exit 2)."""
    import pyarrow as pa
    p, meta, files = read_meta(path)
    ranks = {d.rank: d for d in _read_all(files)}
    missing = missing_ranks(meta, {r for r, d in ranks.items() if d.batches})
    batches = [b for d in ranks.values() for b in d.batches]
    table = pa.Table.from_batches(batches, schema=arrow_schema())
    return JobData(path=p, meta=meta, ranks=ranks, table=table, missing=missing)
