"""Importers on samples in each tool's documented format."""

from __future__ import annotations

import math

import pytest

from hpcml.errors import UsageError
from hpcml.score.importers import exporter
from tests.score.synth import score_job

LABELS = 'gpu="{g}",UUID="GPU-{g}",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="nid001"'


def _scrape(sm: tuple[float, float], tensor: tuple[float, float], dram: tuple[float, ...] | None) -> str:
    out = ["# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.",
           "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge"]
    out += [f"DCGM_FI_PROF_SM_ACTIVE{{{LABELS.format(g=g)}}} {sm[g]}" for g in (0, 1)]
    out += ["# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.",
            "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge"]
    out += [f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{LABELS.format(g=g)}}} {tensor[g]}" for g in (0, 1)]
    if dram is not None:
        out += ["# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active.",
                "# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge"]
        out += [f"DCGM_FI_PROF_DRAM_ACTIVE{{{LABELS.format(g=g)}}} {dram[g]}" for g in (0, 1)]
    out += ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
            f"DCGM_FI_DEV_GPU_TEMP{{{LABELS.format(g=0)}}} 40"]
    return "\n".join(out) + "\n"


def test_dcgm_exporter_scrape_series(tmp_path):
    f = tmp_path / "scrapes.prom"
    f.write_text(_scrape((0.9, 0.8), (0.5, 0.1), (0.2, 0.3))
                 + _scrape((0.92, 0.81), (0.55, 0.12), None)         # DRAM missing in scrape 2
                 + _scrape((0.91, 0.79), (0.52, 0.11), (0.25, 0.35)))
    rec = exporter.load(f, interval=2.0)
    assert sorted(rec.gpus) == [("nid001", "0"), ("nid001", "1")]
    g0 = rec.gpus[("nid001", "0")]
    assert g0.t == [0.0, 2.0, 4.0] and g0.model == "NVIDIA H100 80GB HBM3"
    assert g0.values["sm_active"] == [0.9, 0.92, 0.91]
    assert math.isnan(g0.values["dram_active"][1])                   # missing stays missing
    t, gpus = rec.aligned()
    job = score_job(gpus, {k: g.model for k, g in rec.gpus.items()})
    assert {g.gpu: round(g.compute, 2) for g in job.gpus} == {"nid001:0": 0.52, "nid001:1": 0.11}


def test_sample_timestamps_are_used_when_present(tmp_path):
    f = tmp_path / "ts.prom"
    f.write_text(f"DCGM_FI_PROF_SM_ACTIVE{{{LABELS.format(g=0)}}} 0.5 1700000000000\n"
                 f"DCGM_FI_PROF_SM_ACTIVE{{{LABELS.format(g=0)}}} 0.6 1700000001000\n")
    g = exporter.load(f).gpus[("nid001", "0")]
    assert g.t == [1700000000.0, 1700000001.0] and g.values["sm_active"] == [0.5, 0.6]


def test_mig_series_blank_sentinels_label_spellings_and_elision(tmp_path):
    """dcgm-exporter as it writes a MIG GPU (the instance's series carry GPU_I_ID and
    GPU_I_PROFILE), DCGM's blank sentinels, ``hostname`` in lower case, a space after a comma."""
    whole = 'gpu="0", UUID="GPU-a", device="nvidia0", modelName="NVIDIA A100-SXM4-40GB", hostname="gpu-17"'
    mig = whole + ', GPU_I_PROFILE="3g.20gb", GPU_I_ID="2"'
    scrape = (f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{whole}}} 0.40\nDCGM_FI_DEV_FB_USED{{{whole}}} 2147483634\n"
              f"DCGM_FI_DEV_POWER_USAGE{{{whole}}} 140737488355330\n"
              f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{mig}}} 0.80\nDCGM_FI_DEV_FB_USED{{{mig}}} 9223372036854775792\n")
    f = tmp_path / "mig.prom"
    f.write_text(scrape + "...\n" + scrape.replace("0.40", "0.42"))
    rec = exporter.load(f)
    assert sorted(rec.gpus) == [("gpu-17", "0"), ("gpu-17", "0/gi2")]
    gpu, inst = rec.gpus[("gpu-17", "0")], rec.gpus[("gpu-17", "0/gi2")]
    assert gpu.t == [0.0, 1.0] and inst.t == [0.0, 1.0]               # two scrapes, each with both entities
    assert gpu.values["pipe_tensor_active"] == [0.40, 0.42] and inst.values["pipe_tensor_active"] == [0.80, 0.80]
    assert inst.mig == {"gpu_i_id": "2", "gpu_i_profile": "3g.20gb", "parent": "0"} and gpu.mig is None
    for g in (gpu, inst):                                               # INT32, FP64 and INT64 blanks
        assert all(math.isnan(v) for v in g.values["fb_used"])
    assert all(math.isnan(v) for v in gpu.values["power_usage"])
    assert any("line 6" in n and "'...'" in n for n in rec.notes)


def test_bad_line_is_named(tmp_path):
    f = tmp_path / "bad.prom"
    f.write_text('DCGM_FI_PROF_SM_ACTIVE{gpu="0"} 0.5\nDCGM_FI_PROF_SM_ACTIVE{gpu="0" 0.6\n')
    with pytest.raises(UsageError, match=r"bad\.prom:2: not Prometheus exposition text") as err:
        exporter.load(f)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, words", [
    ("hello world\n", "not"),
    ("# HELP x y\nnode_cpu_seconds_total 5\n", "no DCGM_FI_"),
])
def test_bad_files(tmp_path, text, words):
    f = tmp_path / "bad.prom"
    f.write_text(text)
    with pytest.raises(UsageError, match=words):
        exporter.load(f)


def _gssr_csv(path, rows, order=("min", "avg", "max")):
    fields = ["DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"]
    header = ["timestamp", "gpuId"] + [f"{f}_{s}" for f in fields for s in order]
    lines = [",".join(header)]
    for t, gpu, vals in rows:
        cells = [str(t), str(gpu)]
        for v in vals:
            cells += [v] * 3
        lines.append(",".join(cells))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_gssr_record_csv_directory(tmp_path):
    from hpcml.score.importers import gssr_record
    out = tmp_path / "clariden_123" / "step_0"
    _gssr_csv(out / "proc_0.csv", [(1700000000, 0, ("0.90", "0.50", "0.20")),
                                   (1700000001, 0, ("0.91", "", "0.21"))])
    _gssr_csv(out / "proc_4.csv", [(1700000000, 1, ("0.80", "0.40", "0.10"))], order=("min", "max", "avg"))
    rec = gssr_record.load(tmp_path)
    assert sorted(rec.gpus) == [("proc0", "0"), ("proc4", "1")]
    g = rec.gpus[("proc0", "0")]
    assert g.t == [1700000000.0, 1700000001.0] and g.values["sm_active"] == [0.9, 0.91]
    assert math.isnan(g.values["pipe_tensor_active"][1])
    assert rec.gpus[("proc4", "1")].values["dram_active"] == [0.1]
    assert "2 GB/s" in rec.notes[0]


def test_gssr_record_bad_input(tmp_path):
    from hpcml.score.importers import gssr_record
    bad = tmp_path / "proc_0.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="not a gssr-record CSV"):
        gssr_record.load(bad)
    _gssr_csv(tmp_path / "x" / "proc_1.csv", [("soon", 0, ("1", "1", "1"))])
    with pytest.raises(UsageError, match=r"proc_1\.csv:2: timestamp .soon."):
        gssr_record.load(tmp_path / "x")
    with pytest.raises(UsageError, match="no gssr-record"):
        gssr_record.load(tmp_path / "empty")
    _gssr_csv(tmp_path / "n0" / "proc_0.csv", [])                 # gssr's -n 0 / -g 0: a header only
    with pytest.raises(UsageError, match=r"proc_0\.csv:1: a header and no samples"):
        gssr_record.load(tmp_path / "n0")
    _gssr_csv(tmp_path / "n0" / "proc_1.csv", [(1700000000, 0, ("0.5", "0.5", "0.5"))])
    rec = gssr_record.load(tmp_path / "n0")                        # one empty rank among others: noted
    assert list(rec.gpus) == [("proc1", "0")] and any("no samples" in n for n in rec.notes)
