"""The store importer: hpcml job directories -> a Recording per (node, GPU).

Job directories are written here with the store's own writer (RankWriter), or recorded by
``hpcml observe record`` with NVML replaying recorded samples (no GPU on these machines;
see tests/observe/test_recorder.py). DCGM runs are covered in test_dcgm_sampler.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcml.errors import UsageError  # noqa: E402
from hpcml.observe.store import JOB_META, RANK_META, RankWriter, rank_path, write_json  # noqa: E402
from hpcml.score.importers import store  # noqa: E402

T0 = 1_760_000_000_000_000_000          # ns


def _job(path: Path, ranks: dict[int, tuple[dict, list[tuple]]], **job) -> Path:
    """A job directory: {rank: (rank metadata, rows)}."""
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / JOB_META, {"job_id": "1", "ntasks": len(ranks), "interval": 1.0, **job})
    for r, (meta, rows) in ranks.items():
        w = RankWriter(rank_path(path, r), r)
        w.write_rows(rows)
        w.close()
        write_json(path / RANK_META.format(rank=r), {"rank": r, **meta})
    return path


DCGM = {"kind": "dcgm", "saturation": True, "note": "DCGM profiling fields: saturation"}


def test_nvml_replay_recording_is_temporal_only(tmp_path):
    """``hpcml observe record`` with its default NVML sampler replaying recorded samples."""
    replay = tmp_path / "nvml.jsonl"
    replay.write_text("\n".join(json.dumps({"gpus": [
        {"index": 0, "util_gpu_percent": 97, "power_w": 301.5, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
         "clocks_event_reasons": 0, "temperature_c": 60},
        {"index": 1, "util_gpu_percent": 40 + k, "power_w": 250.0}]}) for k in range(3)))
    env = {**os.environ, "HPCML_OBSERVE_NVML_REPLAY": str(replay), "SLURM_STEP_GPUS": "0,1",
           "SLURMD_NODENAME": "nid007", "SLURM_TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(tmp_path / "D"),
                          "--interval", "0.1", "--", sys.executable, "-c", "import time; time.sleep(0.8)"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rec = store.load(tmp_path / "D")
    assert rec.temporal_only and "temporal utilisation only, no saturation (NVML)" in rec.notes
    assert sorted(rec.gpus) == [("nid007", "0"), ("nid007", "1")]
    g0, g1 = rec.gpus[("nid007", "0")], rec.gpus[("nid007", "1")]
    assert set(g0.values) == {"gpu_util", "power_usage", "sm_clock", "mem_clock", "clocks_event_reasons",
                              "temperature_c"}
    assert len(g0) >= 3 and np.all(g0.values["gpu_util"] == 97) and np.all(g0.values["power_usage"] == 301.5)
    assert set(g1.values["gpu_util"].tolist()) <= {40.0, 41.0, 42.0} and "sm_clock" not in g1.values
    assert np.all(np.diff(g0.t) > 0.05) and abs(g0.t[0] - time.time()) < 600     # seconds since 1970
    assert rec.meta["samplers"]["0"]["kind"] == "nvml"


def test_dcgm_values_of_one_cycle_merge_and_missing_stays_missing(tmp_path):
    """DCGM stamps each field itself: values of one GPU a few ms apart are one sample."""
    rows = []
    for k in range(3):
        t = T0 + k * 1_000_000_000
        rows += [(t, "gpu", "sm_active", 0.5 + k / 10, None, 0),
                 (t + 1_500_000, "gpu", "gpu_util", 90.0 + k, None, 0)]        # 1.5 ms later
        if k != 1:
            rows.append((t, "gpu", "dram_active", 0.3, None, 0))              # blank in cycle 1
    rows.append((T0, "host", "cpu_percent", 50.0, None, None))
    rows.append((T0, "gpu", "power_usage", float("nan"), None, 0))
    job = _job(tmp_path / "D", {0: ({"node": "n1", "gpu_sampler": DCGM,
                                     "gpu_models": {"0": "NVIDIA A100-SXM4-80GB"}}, rows)})
    rec = store.load(job)
    g = rec.gpus[("n1", "0")]
    assert not rec.temporal_only and g.model == "NVIDIA A100-SXM4-80GB"
    assert np.allclose(g.t, [T0 / 1e9, T0 / 1e9 + 1, T0 / 1e9 + 2])
    assert np.allclose(g.values["sm_active"], [0.5, 0.6, 0.7])
    assert np.allclose(g.values["gpu_util"], [90, 91, 92])
    d = g.values["dram_active"]
    assert np.isnan(d[1]) and np.allclose(d[[0, 2]], 0.3)
    assert "power_usage" not in g.values and "cpu_percent" not in g.values


def test_a_gpu_recorded_by_two_ranks_is_kept_once_with_a_note(tmp_path):
    rows = [(T0 + k * 10**9, "gpu", "sm_active", 0.5, None, 0) for k in range(5)]
    job = _job(tmp_path / "D", {
        0: ({"node": "n1", "gpu_sampler": DCGM}, rows),
        1: ({"node": "n1", "gpu_sampler": DCGM}, rows[:3]),
        2: ({"node": "n2", "gpu_sampler": DCGM}, rows)})
    rec = store.load(job)
    assert sorted(rec.gpus) == [("n1", "0"), ("n2", "0")] and len(rec.gpus[("n1", "0")]) == 5
    assert rec.notes == ["GPU n1:0 was recorded by ranks [0, 1]; kept rank 0's samples"]


def test_labels_ids_and_models_from_the_rank_metadata(tmp_path):
    rows = [(T0, "gpu", "sm_active", 0.5, None, 0), (T0, "gpu", "sm_active", 0.6, None, 1)]
    old = [(T0, "gpu", "util_gpu_percent", 99.0, None, 0)]
    job = _job(tmp_path / "D", {
        0: ({"node": "n1", "gpu_ids": {"0": "4", "1": "GPU-x"}, "gpu_models": {"1": "NVIDIA H100"},
             "gpu_sampler": {"kind": "dcgm", "saturation": False,
                             "note": "DCGM profiling fields not watched: ...; no saturation"}},
            rows),
        1: ({"node": "n2"}, old),                                         # before sampler labels
        2: ({"node": "n3", "gpu_sampler": {"kind": "dmon", "saturation": False, "note": "imported"}}, old)},
        notes=["imported from gssr"])
    rec = store.load(job)
    assert sorted(rec.gpus) == [("n1", "4"), ("n1", "GPU-x"), ("n2", "0"), ("n3", "0")]
    assert "temporal utilisation only, no saturation (dmon: imported) (ranks 2)" in rec.notes
    assert rec.gpus[("n1", "GPU-x")].model == "NVIDIA H100" and rec.gpus[("n1", "4")].model is None
    assert rec.temporal_only
    assert "DCGM profiling fields not watched: ...; no saturation (ranks 0)" in rec.notes
    assert "temporal utilisation only, no saturation (NVML) (ranks 1)" in rec.notes
    assert "imported from gssr" in rec.notes
    assert rec.gpus[("n2", "0")].values["gpu_util"].tolist() == [99.0]


def test_no_gpu_rows_says_why(tmp_path):
    job = _job(tmp_path / "D", {0: ({"node": "n1", "gpu_sampler": {"kind": "none", "saturation": False,
                                                                   "note": "GPU sampling off"}},
                                    [(T0, "host", "cpu_percent", 1.0, None, None)])})
    with pytest.raises(UsageError, match="no GPU samples.*GPU sampling off"):
        store.load(job)
    with pytest.raises(UsageError, match="not a job directory"):
        store.load(tmp_path / "missing")


def test_a_large_job_loads_quickly(tmp_path):
    """256 GPUs x 600 samples x 22 fields (3.4 M rows) in whole-column operations."""
    import pyarrow as pa

    from hpcml.observe.schema import arrow_schema
    from hpcml.samplers.fields import FIELDS
    names = [f.name for f in FIELDS]
    out = tmp_path / "big"
    out.mkdir()
    ranks, gpus, samples = 32, 8, 600
    rng = np.random.default_rng(1)
    for r in range(ranks):
        k, g, f = np.meshgrid(np.arange(samples), np.arange(gpus), np.arange(len(names)), indexing="ij")
        ts = (T0 // 1000 + k * 1_000_000 + g * 211 + (f >= 12) * 1700).ravel()
        o = np.argsort(ts, kind="stable")                   # the sampler's order: by DCGM time
        n = ts.size
        batch = pa.record_batch([
            pa.array(ts[o], pa.timestamp("us", tz="UTC")), pa.array(np.full(n, r, np.int32)),
            pa.array(np.full(n, "gpu", object), pa.string()),
            pa.array(np.array(names, object)[f.ravel()[o]], pa.string()),
            pa.array(rng.random(n)), pa.nulls(n, pa.int64()), pa.array(g.ravel()[o].astype(np.int16))],
            schema=arrow_schema())
        w = RankWriter(rank_path(out, r), r)
        w.write_batch(batch)
        w.close()
        write_json(out / RANK_META.format(rank=r), {"rank": r, "node": f"nid{r:03d}", "gpu_sampler": DCGM})
    write_json(out / JOB_META, {"job_id": "big", "ntasks": ranks, "interval": 1.0})
    start = time.perf_counter()
    rec = store.load(out)
    took = time.perf_counter() - start
    assert len(rec.gpus) == ranks * gpus
    g = rec.gpus[("nid003", "5")]
    assert len(g) == samples and set(g.values) == set(names) and not np.isnan(g.values["sm_active"]).any()
    assert took < 20, took


def test_a_rank_that_recorded_nothing_is_named_not_scored_as_absent(tmp_path):
    """Two tasks, rank 1 left no file: the score is over rank 0's GPU, and the report says so."""
    rows = [(T0 + k * 1_000_000_000, "gpu", name, v, None, 0) for k in range(20)
            for name, v in (("sm_active", 0.9), ("pipe_tensor_active", 0.6), ("dram_active", 0.3))]
    job = _job(tmp_path / "D", {0: ({"node": "n1", "gpu_sampler": DCGM}, rows)})
    write_json(job / JOB_META, {"job_id": "1", "ntasks": 2, "interval": 1.0})
    note = "1 rank of 2 recorded nothing (rank 1): GPUs it held were not measured and are not in the score"
    p = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(job), "--no-html", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["gpus"] == 1 and rep["meta"]["missing_ranks"] == [1] and note in rep["notes"]
    p = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(job), "--no-html"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert f"note: {note}" in p.stdout, p.stdout
