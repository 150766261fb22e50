"""``nvidia-smi dmon`` output saved to a file (``nvidia-smi dmon -s pucvmet -o DT -f
dmon.txt``, or its stdout): the monitor every NVIDIA driver ships, so every user has it.

    #Date       Time        gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk
    #YYYYMMDD   HH:MM:SS    Idx     W     C     C     %     %     %     %   MHz   MHz
     20250301   14:02:07      0    71    33     -    97    41     0     0  2619  1980

- a header line ``# gpu ...`` (``#Date Time gpu ...`` with ``-o DT``; ``-o D``/``-o T``
  one of them) naming the columns ``-s`` selected, then a units line ``# Idx W C ...``;
  both are printed again from time to time. ``--format csv`` separates cells by commas.
- one row per GPU and interval (``-i 0,1`` picks GPUs); ``-`` where a value is not
  supported (kept as NaN, never 0). A header with ``gi``/``ci`` columns gives MIG rows:
  a row whose ``gi`` is a number is that GPU instance of GPU ``gpu``, an entity of its own
  (``<gpu>/gi<gi>``), never a sample of the GPU.
- times: the row's date and time (to the second, the node's local time) when printed, else
  tick x ``interval`` (``-d``), a tick ending where a GPU shows up again.

What it allows: ``sm`` is NVML's utilisation (the share of time some kernel ran, as
``gpu_util``), ``mem`` the share of time the memory controller was busy (``mem_util``).
Both are temporal: there is no compute / memory / interconnect split and no saturation
score, and the recording is ``temporal_only``. Power, clocks, temperatures and memory
used are kept; other columns (``enc``, ``pviol``, ``rxpci``, GPM's ``smutil`` ...) under
their own name.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from hpcml.errors import UsageError
from hpcml.score.importers.dmon import read
from hpcml.score.recording import Recording, text_value

COLUMNS = {"sm": "gpu_util", "mem": "mem_util", "pwr": "power_usage", "pclk": "sm_clock", "mclk": "mem_clock",
           "fb": "fb_used", "gtemp": "gpu_temp", "mtemp": "memory_temp"}
NOTE = ("nvidia-smi dmon gives utilisation only: sm % (some kernel ran) and mem % (the memory controller was "
        "busy), both shares of time; no compute / memory / interconnect split and no saturation score")
_DAY = 86400.0


def _cells(line: str) -> list[str]:
    body = line.lstrip("#").strip()
    return [c.strip() for c in body.split(",")] if "," in body else body.split()


class _Layout:
    """Where a header put the GPU index, the MIG ids, the date, the time and the values."""

    def __init__(self, cells: list[str], lineno: int, p: Path) -> None:
        low = [c.lower() for c in cells]
        self.width = len(cells)
        self.gpu = low.index("gpu")
        self.gi = low.index("gi") if "gi" in low else None
        self.ci = low.index("ci") if "ci" in low else None
        self.date = low.index("date") if "date" in low else None
        self.time = low.index("time") if "time" in low else None
        fixed = {self.gpu, self.gi, self.ci, self.date, self.time}
        self.values = [(i, COLUMNS.get(c, c)) for i, c in enumerate(low) if i not in fixed]
        if not self.values:
            raise UsageError("nvidia-smi dmon header names no metrics", file=str(p), line=lineno)


class _Clock:
    """Seconds for a row: its printed date/time, else the tick count."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.tick = 0
        self.seen: set[str] = set()
        self.day = 0.0
        self.last: float | None = None

    def at(self, layout: _Layout, cells: list[str], entity: str, lineno: int, p: Path) -> float:
        if entity in self.seen:
            self.tick, self.seen = self.tick + 1, set()
        self.seen.add(entity)
        if layout.time is None and layout.date is None:
            return self.tick * self.interval
        try:
            if layout.date is not None and layout.time is not None:
                stamp = datetime.strptime(f"{cells[layout.date]} {cells[layout.time]}", "%Y%m%d %H:%M:%S")
                return stamp.replace(tzinfo=timezone.utc).timestamp()
            if layout.date is not None:
                stamp = datetime.strptime(cells[layout.date], "%Y%m%d")
                return stamp.replace(tzinfo=timezone.utc).timestamp() + self.tick * self.interval
            h, m, s = (int(x) for x in cells[layout.time or 0].split(":"))
        except ValueError:
            raise UsageError("date/time not as nvidia-smi dmon -o DT prints it (YYYYMMDD HH:MM:SS)",
                             file=str(p), line=lineno) from None
        t = h * 3600.0 + m * 60 + s
        if self.last is not None and t + self.day < self.last - 1:   # past midnight
            self.day += _DAY
        self.last = t + self.day
        return self.last


def load(path: str | Path, interval: float = 1.0, node: str | None = None) -> Recording:
    p, text = read(path, interval, "an nvidia-smi dmon")
    node = node or p.stem
    rec = Recording(source=f"nvidia-smi-dmon:{p}", temporal_only=True)
    layout: _Layout | None = None
    clock = _Clock(interval)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = _cells(line)
        if line.lstrip().startswith("#"):
            if "gpu" in (c.lower() for c in cells):
                layout = _Layout(cells, lineno, p)
            continue                                 # the units line, or a comment
        if layout is None:
            raise UsageError("no '# gpu ...' header before the first row: not nvidia-smi dmon output "
                             "(or written with --format csv,noheader)", file=str(p), line=lineno)
        if len(cells) != layout.width:
            raise UsageError(f"{len(cells)} cells under {layout.width} columns", file=str(p), line=lineno)
        gpu = cells[layout.gpu]
        if not gpu.isdigit():
            raise UsageError(f"GPU index '{gpu}' is not a number", file=str(p), line=lineno)
        gi = cells[layout.gi] if layout.gi is not None and cells[layout.gi].isdigit() else None
        ci = cells[layout.ci] if layout.ci is not None and cells[layout.ci].isdigit() else None
        index = gpu if gi is None else f"{gpu}/gi{gi}" + (f"/ci{ci}" if ci is not None else "")
        t = clock.at(layout, cells, index, lineno, p)
        g = rec.gpu(node, index) if gi is None else rec.instance(
            node, index, {"gpu_i_id": gi, "gpu_ci_id": ci, "parent": gpu})
        for i, name in layout.values:
            g.add(t, name, text_value(cells[i]))
    if not rec.gpus:
        raise UsageError("no GPU rows: not nvidia-smi dmon output", file=str(p))
    rec.notes.append(NOTE)
    if layout is not None and layout.time is None and layout.date is None:
        rec.notes.append(f"no -o DT date/time columns: times are tick x {interval:g} s (the -d delay), "
                         f"{clock.tick + 1} ticks")
    elif layout is not None and layout.date is None:
        rec.notes.append("no -o D date column: times are seconds of the day (midnight crossings counted)")
    return rec
