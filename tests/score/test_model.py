"""The score model on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcml.score.model import active_span, gssr_score, parts
from tests.score.synth import score_job


def _s(**fields):
    n = max(len(v) if hasattr(v, "__len__") else 1 for v in fields.values())
    return {k: np.array(v if hasattr(v, "__len__") else [v] * n, float) for k, v in fields.items()}


def test_compute_memory_interconnect_by_hand():
    s = _s(pipe_tensor_active=[0.6], pipe_fp32_active=[0.1], dram_active=[0.4],
           pcie_tx_bytes=[16e9], pcie_rx_bytes=[16e9], nvlink_tx_bytes=[300e9], nvlink_rx_bytes=[150e9])
    p = parts(s, "NVIDIA H100 80GB HBM3")           # PCIe 128 GB/s, NVLink 900 GB/s bidirectional
    assert p["compute"][0] == pytest.approx(0.6)
    assert p["memory"][0] == pytest.approx(0.5)      # 0.4 / 0.8
    assert p["interconnect"][0] == pytest.approx(0.5)   # max(32/128, 450/900)
    assert p["score"][0] == pytest.approx(0.6)


def test_occupancy_without_floating_point_work_does_not_score_high():
    s = _s(sm_active=[0.95], sm_occupancy=[0.9], pipe_tensor_active=[0.0], pipe_fp64_active=[0.0],
           pipe_fp32_active=[0.0], pipe_fp16_active=[0.0], dram_active=[0.05])
    assert parts(s)["score"][0] < 0.1
    assert gssr_score(s)[0] == pytest.approx(0.73, abs=0.01)   # gssr's formula does score it high


def test_gssr_values_from_the_note():
    for a, f, o, want in ((0.9, 0.5, 0.3, 0.65), (0.9, 0.05, 0.3, 0.25)):
        s = _s(sm_active=[a], sm_occupancy=[o], pipe_tensor_active=[f], pipe_fp64_active=[0.0],
               pipe_fp32_active=[0.0], pipe_fp16_active=[0.0])
        assert gssr_score(s)[0] == pytest.approx(want, abs=0.01)


def test_missing_values_stay_missing():
    s = _s(pipe_tensor_active=[np.nan, 0.5], dram_active=[np.nan, np.nan])
    p = parts(s)
    assert math.isnan(p["compute"][0]) and math.isnan(p["memory"][0]) and math.isnan(p["score"][0])
    assert p["score"][1] == pytest.approx(0.5)
    assert np.isnan(parts(s, "unknown GPU")["interconnect"]).all()


def test_warm_up_and_tail_are_trimmed():
    sm = np.array([[0.0, 0.02, 0.3, 0.8, 0.82, 0.79, 0.81, 0.2, 0.0]])
    sp = active_span(sm)
    assert (sp.start, sp.stop) == (3, 7)


def test_job_score_bound_imbalance_and_gaps():
    n = 20
    busy = np.r_[np.zeros(3), np.full(n, 0.9), np.zeros(2)]
    gpus = {}
    for node in ("n1", "n2"):
        for idx in ("0", "1"):
            tensor = np.r_[np.zeros(3), np.full(n, 0.7 if node == "n1" else 0.3), np.zeros(2)]
            gpus[(node, idx)] = {"sm_active": busy.copy(), "pipe_tensor_active": tensor,
                                 "dram_active": np.full(n + 5, 0.2)}
    gpus[("n2", "1")]["pipe_tensor_active"][10:20] = np.nan     # this GPU lost samples
    job = score_job(gpus)
    assert job.span == (3, 23)
    assert job.bound == "compute"
    # n2:1 has no pipe data for half the span: there S = M = 0.2 / 0.8 = 0.25, so its median
    # over (0.3 x 10, 0.25 x 10) is 0.275
    assert {g.gpu: round(g.score, 3) for g in job.gpus} == {"n1:0": 0.7, "n1:1": 0.7, "n2:0": 0.3, "n2:1": 0.275}
    assert job.imbalance_nodes > 0.3
    n21 = next(g for g in job.gpus if g.gpu == "n2:1")
    assert n21.coverage == pytest.approx(1.0)     # dram still gives a score where the pipes are missing
    assert any(f.startswith("GPUs well below the job's median score 0.50: n2:1 (0.28), n2:0 (0.30)") for f in job.findings)


def test_tensor_cores_unused_finding():
    n = 30
    g = {"sm_active": np.full(n, 0.95), "pipe_tensor_active": np.full(n, 0.01),
         "pipe_fp32_active": np.full(n, 0.6), "dram_active": np.full(n, 0.2)}
    job = score_job({("n1", "0"): g})
    assert job.findings and job.findings[0].startswith("SM active 0.95 but tensor pipe 0.01")


def test_energy_from_the_counter_and_from_windows():
    from hpcml.score.report import energy_used_mj
    # a counter in mJ with a reset (driver reload) and a gap: increments only
    counter = np.array([1000, 4600, np.nan, 8200, 100, 3700], float)
    assert energy_used_mj({"total_energy_consumption": counter}) == 3600 + 3600 + 3600
    assert energy_used_mj({"energy_window_mj": np.array([3600.0, np.nan, 3600.0])}) == 7200
    assert energy_used_mj({"power_usage": np.array([300.0])}) is None
