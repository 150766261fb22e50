"""One module per recording format the scorer imports. Each returns a ``Recording``.

``detect(path)`` tells the format from the content (extensions alone are not trusted) and
``load(path, fmt=None, **options)`` imports it. Modules are imported only when used.

A site package adds a format through the ``hpcml.score_importers`` entry-point group: a
function ``load(path: Path, **options) -> Recording`` (options it does not name are left
out). Such a format is chosen by name (``fmt``); ``detect`` knows only the built-ins.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from hpcml.errors import UsageError
from hpcml.files import read_bounded, read_ends
from hpcml.registry import Registry
from hpcml.score.recording import Recording

FORMATS: Registry[Callable[..., Recording]] = Registry("recording format", "hpcml.score_importers", {
    "store": f"{__name__}.store:load",                  # hpcml's own recording: a directory of rank-*.arrows
    "gssr-json": f"{__name__}.gssr_json:load",          # gssr profile: <label>/<label>_proc_<rank>.json
    "gssr-sqlite": f"{__name__}.gssr_json:load_sqlite",  # gssr analyze --export x.sqlite3
    "gssr-record": f"{__name__}.gssr_record:load",      # gssr-record proc_<rank>.csv
    "dmon": f"{__name__}.dmon:load",                    # dcgmi dmon text output
    "nvidia-smi-dmon": f"{__name__}.smi_dmon:load",     # nvidia-smi dmon text output (utilisation only)
    "exporter": f"{__name__}.exporter:load",            # dcgm-exporter /metrics scrapes
})
_HEAD = 64 * 1024
# The largest recording file read whole: a dcgm-exporter scrape of 8 GPUs is ~20 KB, so
# 1 GiB is a day of 1-s scrapes of two nodes; anything bigger (or /dev/zero behind a
# symlink) is refused unread, not read until memory runs out.
FILE_MAX = 1 << 30


def _known() -> str:
    return ", ".join(FORMATS)


def read_file(path: Path, what: str = "", max_bytes: int | None = None) -> bytes:
    """A recording file's bytes, read with ``hpcml.files.read_bounded``: a FIFO is not
    waited on, a device or a file over ``max_bytes`` (default FILE_MAX) is refused; one-line
    UsageError."""
    try:
        return read_bounded(path, FILE_MAX if max_bytes is None else max_bytes)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"cannot read{' ' + what if what else ''}: {why}", file=str(path)) from None


def read_text(path: Path, what: str = "") -> str:
    """``read_file`` decoded as UTF-8 (a BOM dropped)."""
    data = read_file(path, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read{' ' + what if what else ''}: not UTF-8 text (bad byte at offset "
                         f"{exc.start})", file=str(path)) from None


def _head(path: Path) -> bytes:
    """The first _HEAD bytes, without blocking on a FIFO or reading a device."""
    try:
        head, tail, _ = read_ends(path, _HEAD, 0, follow_symlinks=True)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", file=str(path)) from None
    return head or tail


def _is_gssr_json(head: bytes) -> bool:
    h = head.lstrip()
    return h.startswith(b"{") and b'"metadata"' in h[:4096] and b'"sampling_time"' in h


def _is_gssr_csv(path: Path) -> bool:
    return _head(path).lstrip().startswith(b"timestamp,gpuId")


#: SQLite's steps the format's detection may take (its check of the pages included)
SQLITE_DETECT_STEPS = 200_000_000
#: how many of SQLite's steps pass between two looks at a read's step budget
SQLITE_STEP_EVERY = 10_000
#: the longest text or blob a cell of an SQLite recording may hold: a host name, a GPU list
SQLITE_VALUE_MAX = 1 << 20


def sound(con: sqlite3.Connection) -> str | None:
    """What ``PRAGMA quick_check`` finds wrong with the database's pages, or None: it reads
    each page once, and a crafted b-tree whose pages share a child (a 32 KB file claiming
    10^12 rows, which ``count(*)`` walked for ever in one step) is a page referenced twice."""
    rows = con.execute("PRAGMA quick_check(1)").fetchall()
    return None if rows == [("ok",)] else str(rows[0][0] if rows else "no answer")


def sqlite_uri(path: Path, fd: int) -> str:
    """SQLite's URI of the file open at ``fd`` (``/proc``'s link to it: the file this
    process checked, whatever is at ``path`` by now), read-only and immutable."""
    where = Path(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else path.resolve()
    return f"{where.as_uri()}?mode=ro&immutable=1"


@contextlib.contextmanager
def open_sqlite(path: Path, steps: Callable[[int], int]) -> Iterator[sqlite3.Connection]:
    """An SQLite recording opened as an untrusted file is, for detection and for reading
    alike: one descriptor of a regular file within FILE_MAX, which SQLite reads immutable (a
    journal beside it, a FIFO there, is never looked for), cells of at most
    ``SQLITE_VALUE_MAX`` (Python 3.11+), ``trusted_schema`` off, at most ``steps(size)`` of
    SQLite's steps (beyond them a statement fails "interrupted"), and its pages checked
    first (``sound``). UsageError naming what is wrong; sqlite3.Error or ValueError (a name
    not UTF-8) from SQLite as it reads."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError("no such SQLite file", file=str(path)) from None
    except OSError as exc:
        raise UsageError(f"cannot open: {exc.strerror or exc}", file=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError("not a regular file (a FIFO, a device or a directory)", file=str(path))
        if st.st_size > FILE_MAX:
            raise UsageError(f"larger than {FILE_MAX:,} bytes, the most a recording may be", file=str(path))
        try:
            con = sqlite3.connect(sqlite_uri(path, fd), uri=True)
        except sqlite3.Error as exc:
            from hpcml.words import printable
            raise UsageError(f"cannot open as SQLite: {printable(str(exc), 200)}", file=str(path)) from None
        try:
            limit = getattr(con, "setlimit", None)           # Python 3.11+; on 3.10 the file's size bounds a cell
            if limit is not None:
                limit(sqlite3.SQLITE_LIMIT_LENGTH, SQLITE_VALUE_MAX)  # type: ignore[attr-defined]
            con.execute("PRAGMA trusted_schema=OFF")
            left = [steps(st.st_size)]

            def budget() -> int:                             # non-zero: SQLite interrupts the statement
                left[0] -= SQLITE_STEP_EVERY
                return left[0] < 0
            con.set_progress_handler(budget, SQLITE_STEP_EVERY)
            if problem := sound(con):
                from hpcml.words import printable
                raise UsageError(f"not a gssr SQLite export: damaged ({printable(problem, 200)})", file=str(path))
            yield con
        finally:
            con.close()
    finally:
        os.close(fd)


def _sqlite_tables(path: Path) -> set[str]:
    """The tables of an SQLite file, opened as ``gssr_json.load_sqlite`` opens it
    (``open_sqlite``); none for any other file, or one SQLite cannot read (a name that is
    not UTF-8 too)."""
    try:
        with open_sqlite(path, lambda _size: SQLITE_DETECT_STEPS) as con:
            return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except (UsageError, sqlite3.Error, ValueError):
        return set()


def _first(it):
    return next(iter(it), None)


def _detect_dir(p: Path) -> str | None:
    if _first(p.glob("rank-*.arrows")) is not None:
        return "store"
    for f in p.rglob("*_proc_*.json"):
        if _is_gssr_json(_head(f)):
            return "gssr-json"
        break
    for f in p.rglob("proc_*.csv"):
        if _is_gssr_csv(f):
            return "gssr-record"
        break
    return None


def _detect_file(p: Path) -> str | None:
    head = _head(p)
    if head.startswith(b"SQLite format 3\x00"):
        return "gssr-sqlite" if {"data", "job_metadata"} <= _sqlite_tables(p) else None
    if _is_gssr_json(head):
        return "gssr-json"
    if head.lstrip().startswith(b"timestamp,gpuId"):
        return "gssr-record"
    text = head.decode("utf-8", errors="replace")
    first = text.lstrip().split("\n", 1)[0]
    if re.match(r"#\s*Entity\b", first) or re.match(r"(GPU|GPU-I|GPU-CI)\s+\d+\s", first):
        return "dmon"                 # dcgmi dmon's header, or its rows (refused there with the reason)
    if re.match(r"#\s*(gpu|Date|Time)\b", first):
        return "nvidia-smi-dmon"
    if "# TYPE DCGM_FI_" in text or any(line.startswith("DCGM_FI_") for line in text.splitlines()):
        return "exporter"
    return None


def detect(path: str | Path) -> str:
    """The format of ``path`` from its content; UsageError if it is none we know."""
    p = Path(path)
    if not p.exists():
        raise UsageError("no such file or directory", file=str(p))
    fmt = _detect_dir(p) if p.is_dir() else _detect_file(p)
    if fmt is None:
        what = "directory" if p.is_dir() else "file"
        raise UsageError(f"cannot tell the recording format of this {what}; formats known: {_known()}",
                         file=str(p))
    return fmt


def load(path: str | Path, fmt: str | None = None, **options) -> Recording:
    """Import ``path`` (format detected unless ``fmt`` names it). Options a format does not take
    (e.g. ``interval`` for gssr, whose files carry it) are left out and noted; None means unset."""
    p = Path(path)
    if not p.exists():
        raise UsageError("no such file or directory", file=str(p))
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown recording format '{fmt}'; formats known: {_known()}", file=str(p))
    fmt = fmt or detect(p)
    loader = FORMATS.get(fmt)
    accepted = inspect.signature(loader).parameters
    given = {k: v for k, v in options.items() if v is not None}
    ignored = sorted(k for k in given if k not in accepted)
    rec = loader(p, **{k: v for k, v in given.items() if k in accepted})
    if ignored:
        rec.notes.append(f"option(s) {', '.join(ignored)} do not apply to {fmt} recordings and were ignored")
    rec.meta.setdefault("format", fmt)
    return rec
