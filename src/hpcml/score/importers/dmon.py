"""``dcgmi dmon`` text output saved to a file (e.g. ``dcgmi dmon -e 1001,1002,...,1012,203
-d 1000 > dmon.txt``), as DCGM's DeviceMonitor prints it:

    #Entity   SMACT        TENSO        DRAMA        GPUTL             TMPTR
    ID                                                                  C
    GPU 0     0.912        0.471        0.305        98                41
    GPU 1     N/A          N/A          N/A          97                40

- a header line ``#Entity`` + each field's short tag, then a units line starting ``ID``;
  both are printed again every 14 ticks (and when dmon is restarted into the same file).
- one row per entity and tick, ``<group> <id>`` then the values; groups are ``GPU``,
  ``GPU-I`` and ``GPU-CI`` (MIG instances, with ``-i`` or a group holding them; kept as
  GPUs named ``GPU-I<id>`` / ``GPU-CI<id>``), ``Switch`` and ``vGPU`` (skipped: not GPUs).
- blank values print ``N/A`` (kept as NaN); floats have 3 decimals; string fields may hold
  spaces, so a row whose whitespace-split cell count does not match the header is cut at
  the header's column positions (dmon pads every column to a fixed width).
- no timestamps: every row of one tick shares one time, tick k is at k x ``interval``
  (dmon's ``-d`` in seconds). A tick ends when an entity shows up again or a header is
  reprinted. The times are reconstructed, and the notes say so.

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
from hpcml.score.recording import Recording, text_value

_ROW = re.compile(r"^([A-Za-z][\w-]*)\s+(\d+)(?=\s|$)")
GPU_GROUPS = {"GPU": "", "GPU-I": "GPU-I", "GPU-CI": "GPU-CI"}
_STOPPED = "dmon was stopped"


class _Header:
    def __init__(self, line: str, lineno: int, path: Path) -> None:
        cells = list(re.finditer(r"\S+", line))
        if len(cells) < 2:
            raise UsageError("dmon header names no fields", file=str(path), line=lineno)
        self.starts = [m.start() for m in cells]
        self.names: list[str] = []
        for m in cells[1:]:
            tag = m.group()
            name = BY_TAG[tag].name if tag in BY_TAG else tag.lower()
            while name in self.names:              # two fields with one short tag
                name += "_"
            self.names.append(name)

    def fixed_cells(self, line: str) -> list[str] | None:
        """Cut a row at the header's column starts, if the row is laid out that way."""
        for s in self.starts[1:]:
            if s < len(line) and not line[s - 1].isspace():
                return None
        bounds = self.starts[1:] + [None]
        return [line[a:b].strip() for a, b in zip(bounds, bounds[1:])]


def load(path: str | Path, interval: float = 1.0, node: str | None = None) -> Recording:
    p = Path(path)
    if interval <= 0 or not math.isfinite(interval):
        raise UsageError(f"the dmon delay must be above 0 s, not {interval}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read a dcgmi dmon output file: {exc}", file=str(p)) from None
    node = node or p.stem
    header: _Header | None = None
    tick = 0
    seen: set[str] = set()
    series: dict[str, tuple[list[int], dict[str, list[float]]]] = {}
    skipped: dict[str, int] = {}
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
    for lineno, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if stripped.startswith("#Entity"):
                if seen:                            # a reprinted header closes the tick
                    tick, seen = tick + 1, set()
                header = _Header(line, lineno, p)
            continue
        if header is None:
            raise UsageError("not dcgmi dmon output: no '#Entity' header before the first row",
                             file=str(p), line=lineno)
        if re.match(r"ID(\s|$)", stripped) or stripped.startswith(_STOPPED):
            continue                                # units line under each header; dmon's goodbye
        m = _ROW.match(stripped)
        if m is None:
            raise UsageError(f"not a dmon row: '{stripped[:60]}'", file=str(p), line=lineno)
        group, ident = m.groups()
        values = stripped.split()[2:]
        if len(values) != len(header.names):
            cells = header.fixed_cells(line)
            cut_short = len(line.rstrip()) <= header.starts[-1] and lineno != last
            if cells is None or cut_short:          # only the very last row may be cut short
                raise UsageError(f"{len(values)} values under {len(header.names)} columns",
                                 file=str(p), line=lineno)
            values = cells
        key = f"{group} {ident}"
        if key in seen:                             # an entity again: the next tick began
            tick, seen = tick + 1, set()
        seen.add(key)
        if group not in GPU_GROUPS:
            skipped[group] = skipped.get(group, 0) + 1
            continue
        ticks, cols = series.setdefault(f"{GPU_GROUPS[group]}{ident}", ([], {}))
        before = len(ticks)
        ticks.append(tick)
        for name, value in zip(header.names, values):
            col = cols.get(name)
            if col is None:                         # a column new to this entity
                col = cols[name] = [math.nan] * before
            col.append(text_value(value))
        for col in cols.values():
            if len(col) == before:                  # a column this header lacks
                col.append(math.nan)
    if not series:
        raise UsageError("no GPU rows: not dcgmi dmon output, or only non-GPU entities", file=str(p))
    rec = Recording(source=f"dcgmi-dmon:{p}")
    for index, (ticks, cols) in series.items():
        rec.gpu(node, index).set_columns(np.asarray(ticks, float) * interval, cols)
    rec.notes.append(f"dcgmi dmon prints no timestamps: times are tick x {interval:g} s (the -d delay), "
                     f"{tick + 1} ticks")
    if skipped:
        rec.notes.append("skipped rows of entities that are not GPUs: "
                         + ", ".join(f"{g} ({n})" for g, n in sorted(skipped.items())))
    return rec

