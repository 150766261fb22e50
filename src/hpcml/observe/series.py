"""A job store read as one series per (kind, name): what the report needs, and no more.

``read_job`` builds one long table of every rank's rows (kind and name as strings in every
row: about 55 bytes a row, 0.9 GB for 1,024 ranks x 10,000 steps) and the report then
grouped it by (kind, name) over 16.8M strings. Here ranks are read 16 at a time on a pool of
threads (Arrow decompresses and hashes without the GIL) and split by (kind, name) at once;
only rank, timestamp, value (and step, for sections; the GPU, for GPU rows) are kept: about
24 bytes a row. The
strings and Arrow buffers of those ranks are freed before the next are read, so the peak is
the series, not the table plus the series.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcml import progress
from hpcml.observe.store import files_by_rank, iter_ranks, missing_ranks, read_meta

Key = tuple[str, str]
_COLUMNS = ["ts", "rank", "kind", "name", "value", "step", "gpu"]
RANKS_PER_SPLIT = 16


@dataclass
class Series:
    """One (kind, name)'s rows over the job: rank, microseconds since the epoch, value, the
    step number (sections and user metrics, int32 for these; -1 where the row has none), and
    the GPU's NVML index on the recording rank's node (GPU rows; -1 where the row has none):
    whose GPU a row is (``hpcml.observe.gpuowners``)."""

    rank: np.ndarray
    ts_us: np.ndarray
    value: np.ndarray
    step: np.ndarray | None = None
    gpu: np.ndarray | None = None


@dataclass
class JobSeries:
    """The job as ``build`` reads it (``hpcml.observe.report``); the same fields as
    ``JobData`` less the table."""

    path: Path
    meta: dict[str, Any]
    ranks: list[int]                       # ranks with a rank file
    rows: int
    series: dict[Key, Series]
    missing: list[int]
    problems: dict[int, str] = field(default_factory=dict)


def split(t) -> dict[Key, tuple]:
    """A table's rows by (kind, name): (rank, ts_us, value, step or None, gpu or None)
    arrays. The columns stay chunked as read: combining them would copy every string."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if not t.num_rows:
        return {}
    kinds, names = pc.unique(t["kind"]), pc.unique(t["name"])
    nn = len(names)
    kt = np.uint16 if len(kinds) * nn < 65536 else np.int64     # 16-bit: a stable radix sort
    key = pc.index_in(t["kind"], value_set=kinds).to_numpy().astype(kt) * kt(nn) \
        + pc.index_in(t["name"], value_set=names).to_numpy().astype(kt)
    order = np.argsort(key, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(key, minlength=len(kinds) * nn))])

    def column(name: str, fill):
        col = t[name]
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        return (pc.fill_null(col, fill) if col.null_count else col).to_numpy()
    rank, ts, value, step = column("rank", 0), column("ts", 0), column("value", np.nan), column("step", -1)
    gpu = column("gpu", -1) if "gpu" in t.column_names else np.full(len(rank), -1, np.int16)
    kinds_l, names_l = kinds.to_pylist(), names.to_pylist()
    out: dict[Key, tuple] = {}
    for code in np.flatnonzero(bounds[1:] > bounds[:-1]):
        idx = order[bounds[code]:bounds[code + 1]]
        kind = kinds_l[code // nn]
        out[(kind, names_l[code % nn])] = (rank[idx], ts[idx], value[idx],
                                           step[idx] if kind == "section" else
                                           step[idx].astype(np.int32) if kind == "metric" else None,
                                           gpu[idx].astype(np.int16) if kind == "gpu" else None)
    return out


def _read_some(files: list[Path]) -> tuple[dict[int, str], list[int], int, dict]:
    """A few ranks' files read and split together (a split has a fixed cost; 16 ranks
    share it); their Arrow buffers are dropped on return."""
    import pyarrow as pa
    batches: list = []
    problems: dict[int, str] = {}
    with_data: list[int] = []
    for d in iter_ranks(files):
        batches += d.batches
        if d.problem:
            problems[d.rank] = d.problem
        if any(b.num_rows for b in d.batches):
            with_data.append(d.rank)
    if not batches:
        return problems, with_data, 0, {}
    t = pa.Table.from_batches(batches)
    t = t.select([c for c in _COLUMNS if c in t.column_names])       # another producer's store may lack ``gpu``
    return problems, with_data, t.num_rows, split(t)


def read_series(path: str | os.PathLike) -> JobSeries:
    """A job directory as series; not a job directory is bad input (exit 2). Damaged rank
    files are read up to the cut and named in ``problems``, as ``read_job`` does."""
    from concurrent.futures import ThreadPoolExecutor
    p, meta, files = read_meta(path)
    by_rank = files_by_rank(files)
    ranks = sorted(by_rank)
    chunks = [[f for r in ranks[i:i + RANKS_PER_SPLIT] for f in by_rank[r]]
              for i in range(0, len(ranks), RANKS_PER_SPLIT)]
    pieces: dict[Key, list] = {}
    problems: dict[int, str] = {}
    rows = 0
    with_data: set[int] = set()
    done = 0
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for probs, seen, n, parts in pool.map(_read_some, chunks):
            done = min(len(ranks), done + RANKS_PER_SPLIT)
            progress.advance("reading ranks", done, len(ranks))
            problems.update(probs)
            with_data.update(seen)
            rows += n
            for key, arrays in parts.items():
                pieces.setdefault(key, []).append(arrays)
    series = {key: _join(parts) for key, parts in sorted(pieces.items())}
    return JobSeries(path=p, meta=meta, ranks=ranks, rows=rows, series=series,
                     missing=missing_ranks(meta, with_data), problems=problems)


def _join(parts: list[tuple]) -> Series:
    rank, ts, value, step, gpu = zip(*parts)
    return Series(rank=np.concatenate(rank), ts_us=np.concatenate(ts), value=np.concatenate(value),
                  step=None if step[0] is None else np.concatenate(step),
                  gpu=None if gpu[0] is None else np.concatenate(gpu))


def from_table(table) -> dict[Key, Series]:
    """The same series from a ``read_job`` table (for callers that hold one already)."""
    return {key: Series(*arrays) for key, arrays in split(table).items()}
