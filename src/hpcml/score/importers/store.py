"""hpcml job directories (``hpcml observe record``, ``hpcml score record``, ``convert``).

The rows of kind ``gpu`` of every rank become one series per (node, GPU): the node from
the rank's metadata, the GPU's model from ``gpu_models`` when the sampler stored it, the
index from ``gpu_ids`` when the writer renumbered GPUs, a MIG instance's ids from ``gpu_mig``. NVML's row names are mapped to the
scorer's (``util_gpu_percent`` -> ``gpu_util`` ...). Timestamps are seconds since 1970.

DCGM stamps each field value itself, so the values of one GPU from one update cycle can
differ by a few milliseconds; values of one GPU closer than a quarter of the recording
interval (at most 0.25 s; exact matches only when the interval is unknown) are one
sample, stamped with the earliest of them.

A rank whose sampler says ``saturation: false`` (NVML, or DCGM without its profiling
fields) makes the recording ``temporal_only``. A GPU that two ranks recorded (the GPU
claims should prevent it) keeps the rank with more rows, and a note says so. Ranks the job
expected that recorded nothing are named in a note: their GPUs were not measured, and the
job's figures are over the GPUs that were.

Everything runs on whole columns (pyarrow compute, numpy), one rank at a time, never row
by row: 1,024 GPUs x 3,600 samples x 22 fields is 81 million rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcml.errors import UsageError
from hpcml.samplers import NONE_VISIBLE, UNAVAILABLE, NoGpuSamples
from hpcml.samplers.fields import BY_ID, PROFILING_IDS
from hpcml.score.recording import VALUE_DTYPE, Recording
from hpcml.words import plural

NVML_NAMES = {"util_gpu_percent": "gpu_util", "util_mem_percent": "mem_util", "power_w": "power_usage", "sm_clock_mhz": "sm_clock",
              "mem_clock_mhz": "mem_clock", "clocks_event_reasons": "clocks_event_reasons",
              "energy_mj": "total_energy_consumption"}
NVML_NOTE = "temporal utilisation only, no saturation (NVML)"
MAX_MERGE_S = 0.25
# More ranks than any machine runs (the largest jobs have ~10^5): an ntasks beyond it is
# not a job's, and looping over it would hang the report.
NTASKS_MAX = 1 << 22
_RANK_DICTS = ("gpu_ids", "gpu_models", "gpu_mig")


def _check_meta(path: Path, meta: dict) -> None:
    """The values of job.json and rank-*.json this importer uses, type-checked: the schema
    tag says which document it is, not that its values are sound. One-line UsageError."""
    from hpcml.observe.store import JOB_META, RANK_META
    job = str(path / JOB_META)
    n = meta.get("ntasks")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= NTASKS_MAX):
        raise UsageError(f"ntasks must be a whole number 0..{NTASKS_MAX}, not {n!r:.40}", file=job, key="ntasks")
    notes = meta.get("notes")
    if notes is not None and not (isinstance(notes, list) and all(isinstance(x, str) for x in notes)):
        raise UsageError("notes must be a list of strings", file=job, key="notes")
    ranks = meta.get("ranks")
    if ranks is None:
        return
    if not isinstance(ranks, dict):
        raise UsageError("ranks must be an object", file=job, key="ranks")
    for r, rm in ranks.items():
        where = str(path / RANK_META.format(rank=int(r))) if str(r).isdigit() else job
        if not isinstance(rm, dict):
            raise UsageError("rank metadata must be an object", file=where, key=str(r))
        if rm.get("node") is not None and not isinstance(rm["node"], str):
            raise UsageError("node must be a string", file=where, key="node")
        for key in _RANK_DICTS:
            v = rm.get(key)
            if v is not None and not isinstance(v, dict):
                raise UsageError("must be an object of GPU -> value", file=where, key=key)
        for g, v in (rm.get("gpu_ids") or {}).items():
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise UsageError("a GPU id must be a string or a whole number", file=where, key=f"gpu_ids.{g}")
        for g, v in (rm.get("gpu_models") or {}).items():
            if v is not None and not isinstance(v, str):
                raise UsageError("a GPU model must be a string", file=where, key=f"gpu_models.{g}")
        for g, v in (rm.get("gpu_mig") or {}).items():
            if v is not None and not (isinstance(v, dict) and all(isinstance(x, str) or x is None for x in v.values())):
                raise UsageError("a MIG entry must be an object of strings", file=where, key=f"gpu_mig.{g}")
PROFILING_NAMES = {BY_ID[i].name for i in PROFILING_IDS}


def _rank_columns(batches):
    """One rank's gpu rows as numpy arrays: ts (µs), gpu, name codes, names, values."""
    import pyarrow as pa
    import pyarrow.compute as pc
    t = pa.Table.from_batches(batches).select(["ts", "kind", "name", "value", "gpu"])
    keep = pc.and_(pc.equal(t["kind"], "gpu"), pc.is_valid(t["gpu"]))
    if not pc.all(keep).as_py():
        t = t.filter(keep)
    if not t.num_rows:
        return None
    value = t["value"].to_numpy()                 # nulls arrive as NaN
    names = pc.dictionary_encode(t["name"]).combine_chunks()
    codes = names.indices.to_numpy(zero_copy_only=False)
    ts = pc.cast(t["ts"], pa.int64()).to_numpy()
    gpu = t["gpu"].to_numpy().astype(np.int64)
    finite = np.isfinite(value)
    if not finite.all():
        ts, gpu, codes, value = ts[finite], gpu[finite], codes[finite], value[finite]
    if not len(ts):
        return None
    return ts, gpu, codes, [str(n) for n in names.dictionary.to_pylist()], value


def _rank_series(batches, tol_us: int):
    """``{gpu: (rows, t seconds, {field: values}), ...}`` for one rank, and its field names."""
    cols = _rank_columns(batches)
    if cols is None:
        return {}, set()
    ts, gpu, codes, raw_names, value = cols
    final = [NVML_NAMES.get(n, n) for n in raw_names]
    names = list(dict.fromkeys(final))
    codes = np.array([names.index(n) for n in final], np.int32)[codes]
    gpus, gcode = _small_unique(gpu)
    # Order by (GPU, time): rows usually arrive in time order, and then a stable sort on
    # the small GPU code (a radix sort) is enough.
    if len(ts) < 2 or bool((ts[1:] >= ts[:-1]).all()):
        order = np.argsort(gcode, kind="stable")
    else:
        order = np.lexsort((ts, gcode))
    sg, st = gcode[order], ts[order]
    new = np.empty(len(order), bool)
    new[0] = True
    np.not_equal(sg[1:], sg[:-1], out=new[1:])
    new[1:] |= (st[1:] - st[:-1]) > tol_us
    sample = np.cumsum(new) - 1
    sample_t = st[new] / 1e6
    sample_g = sg[new]
    grid = np.full((len(names), len(sample_t)), np.nan, VALUE_DTYPE)
    grid[codes[order], sample] = value[order]
    rows = np.bincount(gcode, minlength=len(gpus))
    bounds = np.searchsorted(sample_g, np.arange(len(gpus) + 1))
    out = {}
    for k, g in enumerate(gpus):
        s, e = int(bounds[k]), int(bounds[k + 1])
        block = grid[:, s:e]
        have = np.flatnonzero(np.isfinite(block).any(axis=1))
        out[int(g)] = (int(rows[k]), sample_t[s:e], {names[j]: block[j].copy() for j in have})
    present = {names[j] for j in np.flatnonzero(np.bincount(codes, minlength=len(names)))}
    return out, present


def _rank_meta(meta: dict, rank: int) -> dict:
    return (meta.get("ranks") or {}).get(str(rank)) or {}


def _label(rank_meta: dict, names: set[str]) -> dict:
    """The rank's sampler label; older recordings had none (NVML was the only sampler)."""
    label = rank_meta.get("gpu_sampler")
    if isinstance(label, dict) and "saturation" in label:
        return label
    nvml = bool(names & set(NVML_NAMES.values())) and not (names & PROFILING_NAMES)
    return {"kind": "nvml" if nvml else "unknown", "saturation": not nvml,
            "note": NVML_NOTE if nvml else "sampler not recorded"}


def _merge_tolerance_us(meta: dict) -> int:
    interval = meta.get("interval")
    if interval is None:
        return 0
    try:
        interval = float(interval)
    except (TypeError, ValueError):
        return 0
    return int(min(0.25 * interval, MAX_MERGE_S) * 1e6) if interval > 0 else 0


def load(job_dir: str | Path) -> Recording:
    from hpcml.observe.store import iter_ranks, missing_ranks, read_meta
    path, meta, files = read_meta(job_dir)
    _check_meta(path, meta)
    tol = _merge_tolerance_us(meta)
    rec = Recording(source=f"store:{path}")
    owners: dict[tuple[str, str], list] = {}          # (node, index) -> [(rows, rank, gpu, t, values)]
    names_by_rank: dict[int, set[str]] = {}
    problems: dict[int, str] = {}
    with_data: set[int] = set()
    for data in iter_ranks(files):                    # one rank in memory at a time
        r = data.rank
        if data.problem:
            problems[r] = data.problem
        if not data.batches:
            continue
        with_data.add(r)
        series, names = _rank_series(data.batches, tol)
        data.batches = []
        if not series:
            continue
        names_by_rank[r] = names
        rm = _rank_meta(meta, r)
        node = str(rm.get("node") or f"rank{r}")
        ids = rm.get("gpu_ids") or {}
        for g, (rows, t, values) in series.items():
            owners.setdefault((node, str(ids.get(str(g), g))), []).append((rows, r, g, t, values))
    if not owners:
        labels = [rm["gpu_sampler"] for rm in (meta.get("ranks") or {}).values()
                  if isinstance(rm, dict) and isinstance(rm.get("gpu_sampler"), dict)]
        why = sorted({f"rank {r}: {rm['gpu_sampler'].get('note')}"
                      for r, rm in (meta.get("ranks") or {}).items()
                      if isinstance(rm, dict) and isinstance(rm.get("gpu_sampler"), dict)})
        raise NoGpuSamples("no GPU samples in this job directory" + (f" ({'; '.join(why)})" if why else ""),
                           reasons=frozenset(map(_reason, labels)), file=str(path))

    # A GPU recorded by two ranks (claims should prevent it): keep the fuller one.
    kept_ranks: set[int] = set()
    for (node, index) in sorted(owners):
        found = owners[(node, index)]
        rows, r, g, t, values = max(found, key=lambda o: (o[0], -o[1]))
        kept_ranks.add(r)
        if len(found) > 1:
            rec.notes.append(f"GPU {node}:{index} was recorded by ranks {sorted(o[1] for o in found)}; "
                             f"kept rank {r}'s samples")
        model = (_rank_meta(meta, r).get("gpu_models") or {}).get(str(g))
        mig = (_rank_meta(meta, r).get("gpu_mig") or {}).get(str(g))   # an imported MIG instance
        entity = rec.instance(node, index, mig, model) if isinstance(mig, dict) else rec.gpu(node, index, model)
        entity.set_columns(t, values)

    # What the data can show, from each contributing rank's sampler label.
    temporal: dict[str, list[int]] = {}
    samplers = {}
    for r in sorted(kept_ranks):
        label = _label(_rank_meta(meta, r), names_by_rank.get(r, set()))
        samplers[str(r)] = label
        if not label.get("saturation", False):
            kind, said = label.get("kind"), str(label.get("note") or "")
            note = (NVML_NOTE if kind == "nvml" else said if "no saturation" in said
                    else f"temporal utilisation only, no saturation ({kind}{': ' + said if said else ''})")
            temporal.setdefault(note, []).append(r)
    if temporal:
        rec.temporal_only = True
        for note, rs in temporal.items():
            rec.notes.append(note if len(rs) == len(kept_ranks) else f"{note} (ranks {_ranges(rs)})")
    rec.notes += [str(n) for n in meta.get("notes") or []]
    rec.notes += [f"rank {r}: {why}" for r, why in sorted(problems.items())]
    missing = missing_ranks(meta, with_data)
    if missing:                       # their GPUs were not measured: the job's figures leave them out
        of = meta.get("ntasks") or f"at least {max(missing) + 1}"
        rec.notes.append(f"{plural(len(missing), 'rank')} of {of} recorded nothing (rank "
                         f"{_ranges(missing)}): GPUs it held were not measured and are not in the score")
    rec.notes = list(dict.fromkeys(rec.notes))
    rec.meta = {"job_id": meta.get("job_id"), "interval": meta.get("interval"),
                "command": meta.get("command"), "samplers": samplers, "missing_ranks": missing}
    return rec


def _small_unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(..., return_inverse=True)`` for small non-negative ints, without a sort."""
    offset = int(values.min())
    present = np.bincount(values - offset)
    uniq = np.flatnonzero(present)
    lookup = np.zeros(len(present), np.int64)
    lookup[uniq] = np.arange(len(uniq))
    return uniq + offset, lookup[values - offset]


def _ranges(ranks: list[int]) -> str:
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def _reason(label: dict) -> str:
    """A rank's recorded reason for no GPU samples; stores written before labels carried
    one say it only in their note."""
    if label.get("reason"):
        return str(label["reason"])
    return NONE_VISIBLE if "none visible" in str(label.get("note")) else UNAVAILABLE
