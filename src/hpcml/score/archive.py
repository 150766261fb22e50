"""Write an imported recording as an hpcml job directory (the observe store's format).

One rank file per node, rows of kind ``gpu`` with the recording's own timestamps, and the
rank metadata the store importer reads back (node, GPU models, MIG instances' ids, which
sampler, whether the data can give a saturation score), so an imported gssr or dmon recording is kept, merged
and scored exactly like one recorded here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcml.errors import UsageError
from hpcml.observe.schema import arrow_schema
from hpcml.observe.store import JOB_META, JOB_SCHEMA, RANK_META, RANK_SCHEMA, RankWriter, write_json
from hpcml.score.recording import Recording


def _batch(rank: int, gpu: int, t: np.ndarray, values: dict[str, np.ndarray]):
    import pyarrow as pa
    ts, names, vals = [], [], []
    for name, v in values.items():
        ok = np.isfinite(v)                          # missing stays missing: no row
        ts.append(t[ok])
        vals.append(v[ok].astype(float))
        names.append(np.full(int(ok.sum()), name, dtype=object))
    ts_us = (np.concatenate(ts) * 1e6).astype("int64") if ts else np.array([], "int64")
    n = len(ts_us)
    return pa.record_batch([
        pa.array(ts_us, pa.timestamp("us", tz="UTC")),
        pa.array(np.full(n, rank, np.int32)),
        pa.array(np.full(n, "gpu", dtype=object), pa.string()),
        pa.array(np.concatenate(names) if names else [], pa.string()),
        pa.array(np.concatenate(vals) if vals else [], pa.float64()),
        pa.nulls(n, pa.int64()),
        pa.array(np.full(n, gpu, np.int16)),
    ], schema=arrow_schema())


def write_store(rec: Recording, out: Path) -> int:
    """Write ``rec`` under ``out``; returns the number of values written."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError("exists and is not an empty directory; give a new one", file=str(out))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create: {exc.strerror}", file=str(out)) from None
    rec.freeze()
    nodes = sorted({k[0] for k in rec.gpus})
    written = 0
    sampler = {"kind": rec.source.split(":", 1)[0], "saturation": not rec.temporal_only,
               "note": "imported"}
    for rank, node in enumerate(nodes):
        keys = sorted(k for k in rec.gpus if k[0] == node)
        ids, mig = {}, {}
        writer = RankWriter.create(out, rank)
        try:
            for pos, key in enumerate(keys):
                g = rec.gpus[key]
                gpu = int(key[1]) if key[1].isdigit() and int(key[1]) < 2 ** 15 else pos
                ids[str(gpu)] = key[1]
                if g.mig:
                    mig[str(gpu)] = g.mig
                # frozen above: asarray returns t and the columns as they are, as arrays
                batch = _batch(rank, gpu, np.asarray(g.t), {k: np.asarray(v) for k, v in g.values.items()})
                written += batch.num_rows
                if batch.num_rows:
                    writer.write_batch(batch)
        finally:
            writer.close()
        write_json(out / RANK_META.format(rank=rank), {
            "schema": RANK_SCHEMA, "rank": rank, "node": node, "gpus": list(ids.values()), "gpu_ids": ids,
            "gpu_models": {i: rec.gpus[(node, orig)].model for i, orig in ids.items() if rec.gpus[(node, orig)].model},
            "gpu_sampler": sampler, **({"gpu_mig": mig} if mig else {})})
    write_json(out / JOB_META, {"schema": JOB_SCHEMA, "job_id": rec.meta.get("job_id", "imported"),
                                "ntasks": len(nodes), "nodes": ",".join(nodes), "imported_from": rec.source,
                                "notes": rec.notes})
    return written
