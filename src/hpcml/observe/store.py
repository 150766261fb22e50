"""The job store: a directory with one append-only Arrow IPC stream per rank.

Why Arrow's *stream* format: it has no footer, so a file cut anywhere by ``kill -9``
still reads up to its last complete batch (Parquet and Arrow's file format are unreadable
until their footer is written). Each flush appends one record batch (zstd-compressed
buffers) and hands it to the OS, so a killed rank loses at most its last flush interval.
Analysis: ``read_job(dir).table`` is a pyarrow Table that DuckDB queries directly
(``duckdb.sql("select ... from table")``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from hpcml.errors import UsageError
from hpcml.files import write_atomic
from hpcml.observe.schema import arrow_schema, to_batch

_RANK_RE = re.compile(r"^rank-(\d+)(?:\.(\d+))?\.arrows$")
JOB_META = "job.json"
RANK_META = "rank-{rank:05d}.json"


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

    def __init__(self, sink: str | os.PathLike | BinaryIO, rank: int) -> None:
        import pyarrow as pa
        self.rank = rank
        self._own = not hasattr(sink, "write")
        self._fh = open(sink, "xb") if self._own else sink
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        self._writer = pa.ipc.new_stream(self._fh, arrow_schema(), options=options)
        self._fh.flush()

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
    """Every complete batch of one rank file; a damaged tail is reported, not raised."""
    import pyarrow as pa
    p = Path(path)
    m = _RANK_RE.match(p.name)
    data = RankData(rank=int(m.group(1)) if m else -1, path=p)
    try:
        reader = pa.ipc.open_stream(pa.OSFile(str(p)))
    except (pa.ArrowInvalid, OSError) as exc:
        data.problem = f"unreadable: {exc}"
        return data
    while True:
        try:
            data.batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as exc:
            data.problem = f"truncated after {len(data.batches)} batches ({exc})"
            break
    return data


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


def read_job(path: str | os.PathLike) -> JobData:
    """All ranks of a job directory; not a job directory is bad input (exit 2)."""
    import pyarrow as pa
    p = Path(path)
    if not p.is_dir():
        raise UsageError("not a job directory (it does not exist)", file=str(p))
    files = sorted(f for f in p.iterdir() if _RANK_RE.match(f.name))
    meta_path = p / JOB_META
    if not files and not meta_path.exists():
        raise UsageError("not a job directory: no job.json and no rank-*.arrows files", file=str(p))
    meta: dict[str, Any] = {}
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"job metadata is not valid JSON: {exc}", file=str(meta_path)) from None
    ranks: dict[int, RankData] = {}
    for f in files:                      # a restarted rank has several segments
        d = read_rank(f)
        if d.rank in ranks:
            ranks[d.rank].batches += d.batches
            ranks[d.rank].problem = ranks[d.rank].problem or d.problem
        else:
            ranks[d.rank] = d
    for f in sorted(p.glob("rank-*.json")):
        try:
            rank_meta = json.loads(f.read_text())
            meta.setdefault("ranks", {})[str(rank_meta["rank"])] = rank_meta
        except (OSError, json.JSONDecodeError, KeyError):
            continue
    expected = int(meta.get("ntasks") or 0)
    missing = [r for r in range(expected) if r not in ranks or not ranks[r].batches]
    batches = [b for d in ranks.values() for b in d.batches]
    table = pa.Table.from_batches(batches, schema=arrow_schema())
    return JobData(path=p, meta=meta, ranks=ranks, table=table, missing=missing)
