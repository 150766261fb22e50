"""Importers on samples in each tool's documented format."""

from __future__ import annotations

import math

import pytest

from hpcml.errors import UsageError
from hpcml.score.importers import exporter
from hpcml.score.model import score_job

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


@pytest.mark.parametrize("text, words", [
    ("hello world\n", "not"),
    ("# HELP x y\nnode_cpu_seconds_total 5\n", "no DCGM_FI_"),
])
def test_bad_files(tmp_path, text, words):
    f = tmp_path / "bad.prom"
    f.write_text(text)
    with pytest.raises(UsageError, match=words):
        exporter.load(f)
