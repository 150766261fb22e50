"""gssr 0.3/0.4 (PyPI ``gssr``) profiles: the JSON files of ``gssr profile`` and the SQLite
file of ``gssr analyze --export``.

JSON: ``profile_out_JobID_<id>/<label>/<label>_proc_<rank>.json`` (a single file or any
directory tree of them is accepted), each ``json.dump`` of ``{"metadata": {job_id, step_id,
label, hostname, proc_id, n_gpus, gpu_ids, start_time, end_time, elapsed, sampling_time
(ms), n_samples, cmd}, "data": {gpu_id: {tag: [values]}}}``. The tags are DCGM field tags
as DcgmReader's ``GetLatestGpuValuesAsFieldNameDict`` returns them (``GSSR_TAGS`` maps
them to our names; other tags are kept as they are). Quirks:

- no timestamps: gssr drops DCGM's. Times are reconstructed as ``start_time + i x
  sampling_time``; the real interval is a little longer (each turn sleeps sampling_time
  *plus* the DCGM query) and gssr keeps the *last* ``n_samples`` of each series, so the
  times are approximate, and the notes say so.
- blanks never reach the file (DcgmReader skips them and gssr truncates every series to
  the shortest), so there is no N/A; a ``null`` or ``NaN`` from another writer stays NaN.
- one GPU per task normally (``--gpus-per-task``), but a task may hold several GPUs.

SQLite: tables ``data`` (job_id, step_id, proc_id, gpu_id, sample_index, time = sample_index
x sampling_time / 1000, one column per tag), ``process_metadata`` (hostname, gpu_ids,
start_time as local ``%Y-%m-%d %H:%M:%S`` per proc_id) and ``job_metadata``. Times are
start_time (whole seconds, read as this machine's local time) + ``time``. Known gssr bug:
``ExportDataHandler.create_data_table`` appends each process's frame after its GPU loop,
so only the *last* GPU of each process reaches ``data``; GPUs listed in
``process_metadata.gpu_ids`` but absent from ``data`` are named in a note.

Speed: the JSON path reads ~1 GB (1,024 GPUs x 3,600 samples x 16 tags) in a few seconds:
orjson parses each file and its lists become float32 arrays at once, nothing else kept.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import sqlite3
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_ID
from hpcml.score.importers import open_sqlite, read_file
from hpcml.score.recording import VALUE_DTYPE, Recording
from hpcml.words import printable

# DCGM field tags (dcgm_fields.cpp) of the fields gssr watches (its metric_ids) and the other
# profiling fields, -> our column names.
GSSR_TAGS = {tag: BY_ID[fid].name for tag, fid in {
    "gpu_utilization": 203, "fb_total": 250, "fb_free": 251, "fb_used": 252, "fb_resv": 253,
    "gr_engine_active": 1001, "sm_active": 1002, "sm_occupancy": 1003, "tensor_active": 1004,
    "dram_active": 1005, "fp64_active": 1006, "fp32_active": 1007, "fp16_active": 1008,
    "pcie_tx_bytes": 1009, "pcie_rx_bytes": 1010, "nvlink_tx_bytes": 1011, "nvlink_rx_bytes": 1012,
    "sm_clock": 100, "memory_clock": 101,
}.items()}
_ID_COLUMNS = ("job_id", "step_id", "proc_id", "gpu_id", "sample_index", "time")
_NEEDED = ("hostname", "start_time", "sampling_time")
POOL_MIN_FILES = 64          # below this a process pool costs more than it saves


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.rglob("*_proc_*.json"))
    return [path]


def _name(tag: str) -> str:
    return GSSR_TAGS.get(tag, tag.lower())


def _parse(raw: bytes, f: Path) -> dict:
    import orjson
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:                                  # Python's json.dump writes NaN/Infinity, orjson refuses them
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise UsageError(f"not valid JSON (truncated or damaged?): {exc}", file=str(f)) from None
        except RecursionError:                # orjson stops at depth 1024, json at the stack's end
            raise UsageError("not valid JSON: nested too deeply", file=str(f)) from None


def _read(f: Path) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """One gssr JSON file -> (metadata, {gpu_id: {our name: float32 array}})."""
    raw = read_file(f, "a gssr profile")
    doc = _parse(raw, f)
    del raw
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict) or not isinstance(doc.get("data"), dict):
        raise UsageError("not a gssr profile: no 'metadata' and 'data' objects", file=str(f))
    meta, data = doc["metadata"], doc["data"]
    for key in _NEEDED:
        if key not in meta:
            raise UsageError("gssr metadata lacks this entry", file=str(f), key=key)
    gpus: dict[str, dict[str, np.ndarray]] = {}
    for gpu_id, metrics in data.items():
        if not isinstance(metrics, dict):
            raise UsageError("GPU entry is not an object of metric lists", file=str(f), key=str(gpu_id))
        cols, n = {}, None
        for tag, values in metrics.items():
            if not isinstance(values, list):
                raise UsageError("metric is not a list of values", file=str(f), key=f"{gpu_id}.{tag}")
            try:
                with np.errstate(over="ignore"):      # beyond float32: inf, made missing below
                    col = np.array(values, dtype=VALUE_DTYPE)
            except (TypeError, ValueError):
                raise UsageError("metric holds a value that is not a number", file=str(f),
                                 key=f"{gpu_id}.{tag}") from None
            if n is not None and len(col) != n:
                raise UsageError(f"{len(col)} values where the GPU's other metrics have {n}",
                                 file=str(f), key=f"{gpu_id}.{tag}")
            n = len(col)
            col[~np.isfinite(col)] = np.nan            # Infinity (json.dump writes it) or overflow: not a value
            cols[_name(tag)] = col
        gpus[str(gpu_id)] = cols
        metrics.clear()                       # free the Python floats now
    return meta, gpus


def _said(value: object) -> str:
    """A value from the file as an error line shows it: bounded before it is built
    (``reprlib``: a long text or list is cut, not copied whole), control characters escaped."""
    return printable(reprlib.repr(value[:100] if isinstance(value, (str, bytes)) else value), 80)


def _number(meta: dict, key: str, f: Path) -> float:
    try:
        v = float(meta[key])
    except (TypeError, ValueError):
        raise UsageError(f"{_said(meta[key])} is not a number", file=str(f), key=key) from None
    if not math.isfinite(v):
        raise UsageError(f"{_said(meta[key])} is not a finite number", file=str(f), key=key)
    return v


def _put(rec: Recording, node: str, gpu: str, t: np.ndarray, cols: dict[str, np.ndarray]) -> None:
    """Columns for one GPU; appended (NaN where a side lacks a column) if the GPU is there already
    (several steps of one job, or two tasks sharing a GPU)."""
    g = rec.gpu(node, gpu)
    if not len(g.t):
        g.set_columns(t, cols)
        return
    g.set_columns(*_joined([(np.asarray(g.t, float), g.values), (t, cols)]))
    g.freeze()


def _joined(parts: list[tuple[np.ndarray, dict[str, Any]]]) -> tuple[np.ndarray, dict[str, Any]]:
    """Pieces of one GPU's series, one after another: NaN where a piece lacks a column."""
    if len(parts) == 1:
        return parts[0]
    names = list(dict.fromkeys(k for _, cols in parts for k in cols))
    nan = lambda k: np.full(k, np.nan, VALUE_DTYPE)  # noqa: E731
    return (np.concatenate([t for t, _ in parts]),
            {k: np.concatenate([cols.get(k, nan(len(t))) for t, cols in parts]) for k in names})


def _read_all(files: list[Path], workers: int | None):
    """(metadata, gpus) per file, in file order; two processes for big directories."""
    if workers is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = min(2, cpus) if len(files) >= POOL_MIN_FILES else 1
    if workers <= 1 or len(files) < 2 or threading.active_count() > 1 or "fork" not in _start_methods():
        yield from map(_read, files)          # forking a threaded process is unsafe: stay serial
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    chunk = max(1, min(16, len(files) // (4 * workers)))
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"))   # fork: nothing to re-import
    try:
        yield from pool.map(_read, files, chunksize=chunk)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _start_methods() -> list[str]:
    import multiprocessing as mp
    return mp.get_all_start_methods()


def load(path: str | Path, workers: int | None = None) -> Recording:
    """``workers``: processes that parse files (default: 2 from POOL_MIN_FILES files on, else 1)."""
    p = Path(path)
    files = _files(p)
    if not files or not files[0].exists():
        raise UsageError("no gssr <label>_proc_<rank>.json files here", file=str(p))
    rec = Recording(source=f"gssr-json:{p}")
    intervals, jobs, drift = set(), set(), []
    for f, (meta, gpus) in zip(files, _read_all(files, workers)):
        start = _number(meta, "start_time", f)
        dt = _number(meta, "sampling_time", f) / 1000.0
        if dt <= 0:
            raise UsageError("sampling_time must be above 0 ms", file=str(f), key="sampling_time")
        node = str(meta["hostname"])
        intervals.add(dt)
        jobs.add((meta.get("job_id"), meta.get("step_id")))
        for gpu, cols in gpus.items():
            if not cols:
                continue
            n = len(next(iter(cols.values())))
            _put(rec, node, gpu, start + np.arange(n) * dt, cols)
            try:
                if n and float(meta.get("elapsed", 0)) > 0:
                    drift.append(float(meta["elapsed"]) / n / dt)
            except (TypeError, ValueError):
                pass
    if not rec.gpus:
        raise UsageError("gssr files with no GPU data", file=str(p))
    shown = ", ".join(f"{d * 1000:g} ms" for d in sorted(intervals))
    note = f"gssr stores no timestamps: times are start_time + sample x sampling_time ({shown})"
    if drift and abs(float(np.median(drift)) - 1.0) > 0.1:
        note += f"; elapsed / n_samples is {np.median(drift):.2f} x that, so times are approximate"
    rec.notes.append(note)
    rec.meta.update({"files": len(files), "jobs": sorted(f"{j}.{s}" for j, s in jobs)})
    return rec


# --- SQLite export -------------------------------------------------------------------------

#: the longest start_time read as a time: gssr writes 19 characters, ISO 8601 with a
#: fraction and an offset takes 32
START_TEXT_MAX = 64
_EPOCH_TEXT = re.compile(r"[0-9]{1,11}(\.[0-9]*)?")


def _start_epoch(value: object) -> float | None:
    """A process's ``start_time`` as epoch seconds, or None where it names no time.

    gssr writes local ``%Y-%m-%d %H:%M:%S`` (whole seconds, this machine's time zone, as
    gssr's own reading assumes); ISO 8601 (a ``T``, a fraction, an offset, as pandas and
    ``datetime.isoformat`` write it) and an epoch number (the JSON profile's own form; in
    a TEXT column SQLite keeps it as its text) are read too. NULL, a blob, text that is no
    time, a number not finite or not after 1970: None, never the epoch's zero."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        return v if math.isfinite(v) and 0 < v < 1e11 else None
    if not isinstance(value, str) or len(value) > START_TEXT_MAX:
        return None
    text = value.strip()
    try:
        when = datetime.strptime(text, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:                  # a number stored in a TEXT column reads back as text
            return _start_epoch(float(text)) if _EPOCH_TEXT.fullmatch(text) else None
    try:
        v = when.timestamp()
    except (OverflowError, OSError, ValueError):
        return None
    return v if 0 < v < 1e11 else None


#: values read from a gssr export's ``data`` table (rows x columns), each a float64 while
#: read: what the other importers' FILE_MAX bounds before it expands
SQLITE_CELLS_MAX = 1 << 28
#: processes (rows of ``process_metadata``) and GPUs (series) of one export: Alps has 10,752
SQLITE_PROCS_MAX = 1 << 20
SQLITE_SERIES_MAX = 1 << 17
#: SQLite's virtual-machine steps a read may take: a plain table's row costs a few per byte
SQLITE_STEPS_PER_BYTE = 64
SQLITE_STEPS_FLOOR = 50_000_000
#: processes whose lost GPUs a note names (the rest counted)
LOST_NAMED = 10


def load_sqlite(path: str | Path) -> Recording:
    """A gssr SQLite export, read as an untrusted file is (``open_sqlite``: one regular
    file's descriptor, immutable, its pages checked, cells bounded), with SQLite's steps
    bounded by the file's size; no column computed as it is read (a generated column's
    expression runs at each SELECT: an 8 KB file once built 400 MB strings per row), no
    virtual table, at most ``SQLITE_CELLS_MAX`` values, ``SQLITE_PROCS_MAX`` processes and
    ``SQLITE_SERIES_MAX`` GPUs."""
    p = Path(path)
    try:
        with open_sqlite(p, lambda size: SQLITE_STEPS_FLOOR + SQLITE_STEPS_PER_BYTE * size) as con:
            return _from_db(con, p)
    except (sqlite3.Error, ValueError) as exc:           # a name not UTF-8 is a UnicodeDecodeError
        why = "more work than a file of its size needs" if "interrupted" in str(exc) else printable(str(exc), 200)
        raise UsageError(f"not a gssr SQLite export: {why}", file=str(p)) from None


def _quoted(name: str) -> str:
    """An SQL identifier, quoted as SQLite reads it (a ``"`` inside doubled): a column's
    name is the file's word, never part of the query."""
    return '"' + name.replace('"', '""') + '"'


def _plain_tables(con: sqlite3.Connection, p: Path, names: tuple[str, ...]) -> None:
    """gssr writes plain tables: a virtual one, or a column computed at each read, is refused."""
    for name, sql in con.execute("SELECT name, sql FROM sqlite_master WHERE type='table'"):
        if name in names and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            raise UsageError(f"not a gssr SQLite export: '{name}' is a virtual table", file=str(p))
    for name in names:
        for row in con.execute(f"PRAGMA table_xinfo({_quoted(name)})"):
            if row[6]:                                  # hidden: 2 virtual, 3 stored generated
                raise UsageError(f"not a gssr SQLite export: '{name}' has a generated column "
                                 f"({printable(str(row[1]), 80)})", file=str(p))
            if row[4] is not None:                      # a default: every row added before it reads it back
                raise UsageError(f"not a gssr SQLite export: '{name}' has a column with a default "
                                 f"({printable(str(row[1]), 80)})", file=str(p))


def _scan(con: sqlite3.Connection, key_cols: list[str], order: str, metrics: list[str], p: Path):
    """The ``data`` table in chunks, straight to arrays (a big export has millions of rows):
    the distinct keys, and per row its key's code, order column, time and float32 metrics."""
    quoted = ", ".join(_quoted(c) for c in [*key_cols, order, "time", *metrics])
    cur = con.execute(f"SELECT {quoted} FROM data")
    nk = len(key_cols)
    index: dict[tuple, int] = {}
    codes, order_v, time_v, mats = [], [], [], []
    total = 0
    while rows := cur.fetchmany(1 << 12):
        total += len(rows)
        if total * (len(metrics) + 2) > SQLITE_CELLS_MAX:
            raise UsageError(f"gssr 'data' table holds more than {SQLITE_CELLS_MAX:,} values ({len(metrics)} metrics "
                             "a row): split the export by job step", file=str(p))
        codes.append(np.fromiter((index.setdefault(r[:nk], len(index)) for r in rows), np.int64, len(rows)))
        if len(index) > SQLITE_SERIES_MAX:
            raise UsageError(f"gssr 'data' table holds more than {SQLITE_SERIES_MAX:,} GPUs' series", file=str(p))
        try:
            arr = np.array([r[nk:] for r in rows], dtype=float)     # NULL -> NaN
        except (TypeError, ValueError):
            raise UsageError("gssr 'data' table holds a value that is not a number", file=str(p)) from None
        order_v.append(arr[:, 0])
        time_v.append(arr[:, 1])
        with np.errstate(over="ignore", invalid="ignore"):
            m = arr[:, 2:].astype(VALUE_DTYPE)
        m[~np.isfinite(m)] = np.nan                    # past float32 (1e300): unknown, as the JSON reader has it
        mats.append(m)
    if not codes:
        return [], np.empty(0, np.int64), np.empty(0), np.empty((len(metrics), 0), VALUE_DTYPE)
    codes_a = np.concatenate(codes)
    sort = np.lexsort((np.concatenate(order_v), codes_a))
    mat = np.ascontiguousarray(np.concatenate(mats)[sort].T)          # one row per metric
    return list(index), codes_a[sort], np.concatenate(time_v)[sort], mat


def _from_db(con: sqlite3.Connection, p: Path) -> Recording:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = {"data", "process_metadata", "job_metadata"} - tables
    if missing:
        raise UsageError(f"not a gssr SQLite export: no table {', '.join(sorted(missing))}", file=str(p))
    _plain_tables(con, p, ("data", "process_metadata", "job_metadata"))
    columns = [r[1] for r in con.execute("PRAGMA table_info(data)")]
    for c in ("proc_id", "gpu_id", "time"):
        if c not in columns:
            raise UsageError(f"gssr 'data' table has no {c} column", file=str(p))
    metrics = [c for c in columns if c not in _ID_COLUMNS]
    if not metrics:
        raise UsageError("gssr 'data' table has no metric columns", file=str(p))
    has_step = "step_id" in columns and "job_id" in columns
    procs = {}
    pm_cols = [r[1] for r in con.execute("PRAGMA table_info(process_metadata)")]
    sel = ", ".join(c if c in pm_cols else "NULL" for c in ("job_id", "step_id", "proc_id", "hostname",
                                                              "gpu_ids", "start_time"))
    for i, (job, step, proc, host, gpu_ids, start) in enumerate(con.execute(f"SELECT {sel} FROM process_metadata")):
        if i >= SQLITE_PROCS_MAX:
            raise UsageError(f"gssr 'process_metadata' table holds more than {SQLITE_PROCS_MAX:,} processes",
                             file=str(p))
        procs[(job, step, proc) if has_step else proc] = (str(host), str(gpu_ids or ""), _start_epoch(start), start)
    rec = Recording(source=f"gssr-sqlite:{p}")
    key_cols = ["job_id", "step_id", "proc_id", "gpu_id"] if has_step else ["proc_id", "gpu_id"]
    order = "sample_index" if "sample_index" in columns else "time"
    keys, codes, t_all, mat = _scan(con, key_cols, order, metrics, p)
    seen = set()
    pieces: dict[tuple[str, str], list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}
    bounds = np.flatnonzero(np.diff(codes)) + 1
    spans = []                                    # (lo, hi, the process's key, the GPU) of each series piece
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(codes)]) if len(codes) else ():
        *pkey, gpu = keys[codes[lo]]
        spans.append((lo, hi, tuple(pkey) if has_step else pkey[0], gpu))
    dated = _dated([pkey for _lo, _hi, pkey, _gpu in spans], procs, has_step, p)
    for lo, hi, pkey, gpu in spans:
        host, _, start, _ = procs.get(pkey, (f"proc{pkey[-1] if has_step else pkey}", "", None, None))
        t = t_all[lo:hi] + (start if dated else 0.0)
        pieces.setdefault((host, str(gpu)), []).append((t, {_name(m): mat[i, lo:hi] for i, m in enumerate(metrics)}))
        seen.add((pkey, str(gpu)))
    for (host, gpu), parts in pieces.items():       # joined once: many processes of one GPU were quadratic
        _put(rec, host, gpu, *_joined(parts))
    lost: list[str] = []
    n_lost = 0
    steps = len({pkey[:2] for pkey in procs}) if has_step else 1       # a step named where there are several
    for pkey, (host, gpu_ids, _, _) in sorted(procs.items(), key=lambda kv: str(kv[0])):
        for gpu in dict.fromkeys(g.strip() for g in gpu_ids.split(",") if g.strip()):
            if (pkey, gpu) not in seen:
                n_lost += 1
                if len(lost) < LOST_NAMED:           # a count, not a list as long as the file makes it
                    step = f"step {printable(str(pkey[1]), 20)}, " if has_step and steps > 1 else ""
                    lost.append(f"{printable(host, 80)} GPU {printable(gpu, 20)} "
                                f"({step}proc {printable(str(pkey[-1] if has_step else pkey), 20)})")
    if not rec.gpus:
        raise UsageError("gssr SQLite export with no rows in 'data'", file=str(p))
    if dated:
        rec.notes.append("gssr stores no timestamps: times are the process start (whole seconds, local time)"
                         " + sample x sampling_time")
    else:
        rec.notes.append("no process with samples has a start_time in 'process_metadata' that names a time: "
                         "times are seconds from each process's start (sample x sampling_time), not dates")
        if shared := sum(len(parts) > 1 for parts in pieces.values()):
            rec.notes.append(f"{shared} GPU(s) hold samples of several processes (job steps), each from its "
                             "own start: laid over each other, not one after the other")
    if lost:
        rec.notes.append(f"gssr's export wrote only the last GPU of each process; lost {n_lost} GPU(s): "
                         + ", ".join(lost) + (f" and {n_lost - len(lost)} more" if n_lost > len(lost) else ""))
    rec.meta.update({"lost_gpus": lost, "lost_gpus_count": n_lost, "dated": dated})
    return rec


def _dated(pkeys: list, procs: dict, has_step: bool, p: Path) -> bool:
    """Whether the samples are placed at their process's start: every process with samples
    (``pkeys``, one per series piece) has a start_time that names a time. None has one: times from each process's start (the
    caller notes it). Some have and some do not: refused, since a process without one cannot
    be placed beside the others (its samples at 1970 would stretch every chart across 56
    years, and no start assumed for it is measured)."""
    known = unknown = 0
    first: tuple | None = None
    for pkey in pkeys:
        got = procs.get(pkey)
        if got is not None and got[2] is not None:
            known += 1
            continue
        unknown += 1
        first = first or (pkey, got)
    if not (known and unknown) or first is None:
        return not unknown
    pkey, got = first
    proc = printable(str(pkey[-1] if has_step else pkey), 20)
    said = ("is not in 'process_metadata'" if got is None else
            f"has start_time {_said(got[3])}, which names no time")
    raise UsageError(f"gssr export: proc {proc} {said}, and {known} other series have one: its samples "
                     "cannot be placed beside theirs", file=str(p), key="process_metadata.start_time")
