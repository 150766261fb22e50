"""``dcgmi dmon`` text output saved to a file (e.g. ``dcgmi dmon -e 1001,1002,...,1012,203
-d 1000 > dmon.txt``), as DCGM's DeviceMonitor prints it:

    #Entity   SMACT        TENSO        DRAMA        GPUTL             TMPTR
    ID                                                                  C
    GPU 0     0.912        0.471        0.305        98                41
    GPU 1     N/A          N/A          N/A          97                40

- a header line ``#Entity`` (``# Entity`` in older DCGM, as in its user guide) + each
  field's short tag, then a units line starting ``ID`` (``Id`` in older DCGM); both are
  printed again every 14 ticks (and when dmon is restarted into the same file).
- one row per entity and tick, ``<group> <id>`` then the values; groups are ``GPU``,
  ``GPU-I`` and ``GPU-CI`` (MIG GPU and compute instances, with ``-i`` or a group holding
  them: entities of their own named ``GPU-I<id>`` / ``GPU-CI<id>``, never samples of the
  GPU, whose row is its own), ``Switch`` and ``vGPU`` (skipped: not GPUs).
- blank values print ``N/A`` (kept as NaN); floats have 3 decimals; string fields may hold
  spaces, so a row whose whitespace-split cell count does not match the header is cut at
  the header's column positions (dmon pads every column to a fixed width).
- no timestamps: every row of one tick shares one time, tick k is at k x ``interval``
  (dmon's ``-d`` in seconds). A tick ends when an entity shows up again or a header is
  reprinted, so interleaved entities and an entity missing from a tick both work. The
  times are reconstructed, and the notes say so.
- a line ``...`` (a copy that elided rows) is skipped and noted: a gap of unknown length,
  after which a new tick begins. A number with a note glued on (``123(1.2GB/s)``) or rows
  without a header are an edited copy, not dmon's output, and refused.

Columns are found by tag (``fields.BY_TAG``); tags we do not know are kept under their
lowercase tag. The node is the ``node`` argument (default: the file name without suffix).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_TAG
from hpcml.score.importers import read_text
from hpcml.score.recording import Recording, check_interval, text_value

_ROW = re.compile(r"^([A-Za-z][\w-]*)\s+(\d+)(?=\s|$)")
HEADER = re.compile(r"^\s*#\s*Entity\b")
_UNITS = re.compile(r"^id(\s|$)", re.IGNORECASE)
_ELISION = re.compile(r"^(\.\.\.|…)$")
_ANNOTATED = re.compile(r"^[-+]?\d+(\.\d+)?\(.*\)$")
GPU_GROUPS = {"GPU": "", "GPU-I": "GPU-I", "GPU-CI": "GPU-CI"}
MIG_KEYS = {"GPU-I": "gpu_i_id", "GPU-CI": "gpu_ci_id"}
_STOPPED = "dmon was stopped"


class _Header:
    def __init__(self, line: str, lineno: int, path: Path) -> None:
        cells = list(re.finditer(r"\S+", line))
        first = next((i for i, m in enumerate(cells) if m.group().endswith("Entity")), None)
        if first is None:               # '#Entity: GRACT': dcgmi prints the cell alone
            raise UsageError("dmon header has no 'Entity' cell before the field tags", file=str(path), line=lineno)
        first += 1
        cells = cells[first:]
        if not cells:
            raise UsageError("dmon header names no fields", file=str(path), line=lineno)
        self.starts = [m.start() for m in cells]
        self.names: list[str] = []
        for m in cells:
            tag = m.group()
            name = BY_TAG[tag].name if tag in BY_TAG else tag.lower()
            while name in self.names:              # two fields with one short tag
                name += "_"
            self.names.append(name)

    def fixed_cells(self, line: str) -> list[str] | None:
        """Cut a row at the header's column starts, if the row is laid out that way."""
        for s in self.starts:
            if s < len(line) and not line[s - 1].isspace():
                return None
        bounds: list[int | None] = [*self.starts, None]
        return [line[a:b].strip() for a, b in zip(bounds, bounds[1:])]


def _values(line: str, stripped: str, header: _Header, lineno: int, last: int, p: Path) -> list[str]:
    values = stripped.split()[2:]
    if len(values) != len(header.names):
        cells = header.fixed_cells(line)
        cut_short = len(line.rstrip()) <= header.starts[-1] and lineno != last
        if cells is None or cut_short:              # only the very last row may be cut short
            raise UsageError(f"{len(values)} values under {len(header.names)} columns", file=str(p), line=lineno)
        values = cells
    for v in values:
        if _ANNOTATED.match(v):
            raise UsageError(f"value '{v}' has a note glued on: an edited copy, not raw dcgmi dmon output",
                             file=str(p), line=lineno)
    return values


class _Entities:
    """Each entity's ticks and columns (a column new to an entity, or missing from a
    header, is NaN where it was not printed)."""

    def __init__(self) -> None:
        self.series: dict[str, tuple[list[int], dict[str, list[float]]]] = {}

    def add(self, index: str, tick: int, names: list[str], values: list[str]) -> None:
        ticks, cols = self.series.setdefault(index, ([], {}))
        before = len(ticks)
        ticks.append(tick)
        for name, value in zip(names, values):
            col = cols.get(name)
            if col is None:
                col = cols[name] = [math.nan] * before
            col.append(text_value(value))
        for col in cols.values():
            if len(col) == before:
                col.append(math.nan)


def read(path: str | Path, interval: float, what: str) -> tuple[Path, str]:
    """A monitor's text output (dcgmi's or nvidia-smi's), and its delay checked: both print
    rows without timestamps unless told otherwise, so times may be ticks x ``interval``."""
    p = Path(path)
    check_interval(interval)
    return p, read_text(p, f"{what} output file")


def load(path: str | Path, interval: float = 1.0, node: str | None = None) -> Recording:
    p, text = read(path, interval, "a dcgmi dmon")
    node = node or p.stem
    header: _Header | None = None
    tick = 0
    seen: set[str] = set()
    found = _Entities()
    skipped: dict[str, int] = {}
    elided: list[int] = []
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines, start=1) if line.strip() and not _ELISION.match(line.strip())),
               default=0)
    for lineno, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if HEADER.match(stripped):
                if seen:                            # a reprinted header closes the tick
                    tick, seen = tick + 1, set()
                header = _Header(line, lineno, p)
            continue
        if _ELISION.match(stripped):                # rows left out here: a new tick follows
            elided.append(lineno)
            if seen:
                tick, seen = tick + 1, set()
            continue
        if header is None:
            raise UsageError("no '#Entity' header before the first row: not raw dcgmi dmon output "
                             "(an excerpt or an edited copy?)", file=str(p), line=lineno)
        if _UNITS.match(stripped) or stripped.startswith(_STOPPED):
            continue                                # units line under each header; dmon's goodbye
        m = _ROW.match(stripped)
        if m is None:
            raise UsageError(f"not a dmon row: '{stripped[:60]}'", file=str(p), line=lineno)
        group, ident = m.groups()
        values = _values(line, stripped, header, lineno, last, p)
        key = f"{group} {ident}"
        if key in seen:                             # an entity again: the next tick began
            tick, seen = tick + 1, set()
        seen.add(key)
        if group not in GPU_GROUPS:
            skipped[group] = skipped.get(group, 0) + 1
            continue
        found.add(f"{GPU_GROUPS[group]}{ident}", tick, header.names, values)
    if not found.series:
        raise UsageError("no GPU rows: not dcgmi dmon output, or only non-GPU entities", file=str(p))
    return _recording(p, node, found, interval, skipped, elided)


def _recording(p: Path, node: str, found: _Entities, interval: float, skipped: dict[str, int],
               elided: list[int]) -> Recording:
    rec = Recording(source=f"dcgmi-dmon:{p}")
    for index, (ticks, cols) in found.series.items():
        group = index.rstrip("0123456789")
        g = (rec.instance(node, index, {MIG_KEYS[group]: index[len(group):]}) if group in MIG_KEYS
             else rec.gpu(node, index))
        g.set_columns(np.asarray(ticks, float) * interval, cols)
    n_ticks = 1 + max(t[-1] for t, _ in found.series.values())
    per = ", ".join(f"{('GPU ' + i) if i.isdigit() else i} {len(t)}" for i, (t, _) in found.series.items())
    rec.notes.append(f"dcgmi dmon prints no timestamps: times are tick x {interval:g} s (the -d delay), "
                     f"{n_ticks} ticks (per entity: {per})")
    if any(g.mig for g in rec.gpus.values()):
        rec.notes.append("MIG instances (GPU-I, GPU-CI rows) are scored apart from whole GPUs; dmon does not "
                         "say which GPU holds an instance")
    if elided:
        rec.notes.append(f"rows were left out at line {', '.join(map(str, elided))} ('...'): a copy, not the whole "
                         "output; the gap's length is unknown and not counted")
    if skipped:
        rec.notes.append("skipped rows of entities that are not GPUs: "
                         + ", ".join(f"{g} ({n})" for g, n in sorted(skipped.items())))
    return rec
