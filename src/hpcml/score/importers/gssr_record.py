"""gssr-record 2.x CSVs: ``<out>/<cluster>_<jobid>/step_<n>/proc_<rank>.csv``.

Columns (from gssr-record.c): ``timestamp`` (seconds), ``gpuId``, then for each field
``DCGM_FI_<NAME>_min``, ``_avg`` and ``_max`` over the 1-s window, in an order that
changed between versions, so columns are found by name. For the energy counter the
``_avg`` column holds DCGM's DIFF over the window (mJ). Local rank 0 records every GPU of
its node, so ``proc_<rank>`` stands for the node. Caveat kept as a note: gssr-record
writes 0 for any value above 2e9, so PCIe/NVLink rates above 2 GB/s read as 0.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_ID, DCGM_NAMES
from hpcml.score.recording import Recording, text_value

ENERGY_WINDOW = "energy_window_mj"      # mJ used in each window (not a counter)
_PROC = re.compile(r"proc_(\d+)\.csv$")


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.rglob("proc_*.csv"))
    return [path]


def load(path: str | Path) -> Recording:
    p = Path(path)
    files = _files(p)
    if not files or not files[0].exists():
        raise UsageError("no gssr-record proc_<rank>.csv files here", file=str(p))
    rec = Recording(source=f"gssr-record:{p}")
    empty: list[Path] = []                  # a header only: gssr-record ran 0 intervals or saw 0 GPUs
    for f in files:
        m = _PROC.search(f.name)
        node = f"proc{m.group(1)}" if m else f.stem
        try:
            with open(f, newline="") as fh:
                reader = csv.DictReader(fh)
                header = reader.fieldnames or []
                if "timestamp" not in header or "gpuId" not in header:
                    raise UsageError("not a gssr-record CSV: no timestamp and gpuId columns", file=str(f))
                columns = {}
                for name, fid in DCGM_NAMES.items():
                    if f"{name}_avg" in header:
                        # energy's column is DCGM's DIFF over the window, not the counter
                        columns[f"{name}_avg"] = ENERGY_WINDOW if fid == 156 else BY_ID[fid].name
                if not columns:
                    raise UsageError("no DCGM_FI_*_avg columns", file=str(f))
                line = 1
                for line, row in enumerate(reader, start=2):
                    try:
                        t = float(row["timestamp"])
                    except (TypeError, ValueError):
                        raise UsageError(f"timestamp '{row['timestamp']}' is not a number", file=str(f),
                                         line=line) from None
                    g = rec.gpu(node, str(row["gpuId"]).strip())
                    for col, name in columns.items():
                        g.add(t, name, text_value(row.get(col) or ""))
                if line == 1:
                    empty.append(f)
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise UsageError(f"cannot read: {exc}", file=str(f)) from None
    if not rec.gpus and empty:
        raise UsageError("a header and no samples (gssr-record ran 0 intervals or saw 0 GPUs): nothing to import",
                         file=str(empty[0]), line=1)
    if empty:
        rec.notes.append(f"{len(empty)} file(s) with a header and no samples: {', '.join(str(e) for e in empty[:5])}")
    rec.notes.append("gssr-record writes 0 for values above 2e9: PCIe/NVLink rates above 2 GB/s read as 0")
    return rec
