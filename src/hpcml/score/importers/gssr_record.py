"""gssr-record 2.x CSVs: ``<out>/<cluster>_<jobid>/step_<n>/proc_<rank>.csv``.

Columns (from gssr-record.c): ``timestamp`` (seconds), ``gpuId``, then for each field
``DCGM_FI_<NAME>_min``, ``_avg`` and ``_max`` over the 1-s window, in an order that
changed between versions, so columns are found by name. For the energy counter the
``_avg`` column holds DCGM's DIFF over the window (mJ). Local rank 0 records every GPU of
its node, so ``proc_<rank>`` stands for the node. Caveat kept as a note: gssr-record
writes 0 for any value above 2e9, so PCIe/NVLink rates above 2 GB/s read as 0.

Tensor: gssr-record watches the tensor sub-pipes ``PIPE_TENSOR_IMMA_ACTIVE`` (integer),
``_HMMA_`` (half) and ``_DFMA_`` (FP64), its ``PIPE_TENSOR_ACTIVE`` commented out. Each is
a share of the same cycles on one tensor pipe, so the pipe's activity is their sum
(TENSOR_PIPES); a sum above 1 is impossible and unknown, never scored (the testdata's
generated directories have many); without the sum a GEMM-bound job read as memory-bound.
A ``PIPE_TENSOR_ACTIVE`` column, where a version records one, is used as it is.
Timestamps must be finite numbers (``nan``/``inf`` parse as floats, and are refused).
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import numpy as np

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_ID, DCGM_NAMES
from hpcml.score.importers import read_text
from hpcml.score.recording import RANGE_TOLERANCE, RANGES, Recording, text_value

ENERGY_WINDOW = "energy_window_mj"      # mJ used in each window (not a counter)
_PROC = re.compile(r"proc_(\d+)\.csv$")
TENSOR = BY_ID[1004].name
IMPOSSIBLE = -1.0                       # outside every ratio's range: dropped and counted, never scored
TENSOR_PIPES = ("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
                "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE")


def _tensor(row: dict, pipes: list[str], capped: list[int]) -> float:
    """The tensor pipe's activity from its sub-pipes' (IMMA + HMMA + DFMA); NaN when none
    has a value. A sub-pipe outside 0..1 makes the sum unknown, and IMPOSSIBLE is returned
    so that ``Recording.freeze`` drops and counts it. A sum above 1 (shares of one pipe
    cannot be) is unknown too, counted in ``capped`` for a note of its own."""
    values = [v for v in (text_value(row.get(c) or "") for c in pipes) if not math.isnan(v)]
    lo, hi = RANGES[TENSOR]
    if any(v < lo - RANGE_TOLERANCE or v > hi + RANGE_TOLERANCE for v in values):
        return IMPOSSIBLE
    if not values:
        return math.nan
    total = sum(values)
    if total > hi + RANGE_TOLERANCE:
        capped[0] += 1
        return math.nan
    return min(total, hi)


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
    tensor_from: set[str] = set()
    capped = [0]                            # samples whose sub-pipes summed above 1
    for f in files:
        m = _PROC.search(f.name)
        node = f"proc{m.group(1)}" if m else f.stem
        text = read_text(f, "a gssr-record CSV")
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            header = reader.fieldnames or []
            if "timestamp" not in header or "gpuId" not in header:
                raise UsageError("not a gssr-record CSV: no timestamp and gpuId columns", file=str(f))
            columns = {}
            for name, fid in DCGM_NAMES.items():
                if f"{name}_avg" in header:
                    # energy's column is DCGM's DIFF over the window, not the counter
                    columns[f"{name}_avg"] = ENERGY_WINDOW if fid == 156 else BY_ID[fid].name
            pipes = [] if TENSOR in columns.values() else [f"{n}_avg" for n in TENSOR_PIPES if f"{n}_avg" in header]
            if not columns and not pipes:
                raise UsageError("no DCGM_FI_*_avg columns", file=str(f))
            line = 1
            for line, row in enumerate(reader, start=2):
                try:
                    t = float(row["timestamp"])
                except (TypeError, ValueError):
                    raise UsageError(f"timestamp '{row['timestamp']}' is not a number", file=str(f),
                                     line=line) from None
                if not np.isfinite(t):
                    raise UsageError(f"timestamp '{row['timestamp']}' is not a finite number", file=str(f),
                                     line=line)
                g = rec.gpu(node, str(row["gpuId"]).strip())
                for col, name in columns.items():
                    g.add(t, name, text_value(row.get(col) or ""))
                if pipes:
                    g.add(t, TENSOR, _tensor(row, pipes, capped))
            if line == 1:
                empty.append(f)
            elif pipes:
                tensor_from.add(", ".join(c[len("DCGM_FI_PROF_PIPE_TENSOR_"):-len("_ACTIVE_avg")] for c in pipes))
        except csv.Error as exc:
            raise UsageError(f"cannot read: {exc}", file=str(f)) from None
    if not rec.gpus and empty:
        raise UsageError("a header and no samples (gssr-record ran 0 intervals or saw 0 GPUs): nothing to import",
                         file=str(empty[0]), line=1)
    if empty:
        rec.notes.append(f"{len(empty)} file(s) with a header and no samples: {', '.join(str(e) for e in empty[:5])}")
    if tensor_from:
        rec.notes.append(f"tensor activity is the sum of the tensor sub-pipes' ({'; '.join(sorted(tensor_from))}), "
                         "unknown above 1: gssr-record does not record the tensor pipe itself")
    if capped[0]:
        rec.notes.append(f"{capped[0]} sample(s) whose tensor sub-pipes summed above 1 (shares of one pipe cannot): "
                         "tensor unknown there")
    rec.notes.append("gssr-record writes 0 for values above 2e9: PCIe/NVLink rates above 2 GB/s read as 0")
    return rec
