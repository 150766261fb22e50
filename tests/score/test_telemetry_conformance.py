"""Real telemetry from other producers (../shared/testdata/gpu-telemetry, PROVENANCE.md):
each file imports as the GPUs, MIG instances and ticks that file's provenance gives, or,
where it is not raw output, is refused in one line that says why."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcml.errors import UsageError
from hpcml.score import importers
from hpcml.score.report import build
from tests.needs import shared_testdata

DATA = shared_testdata("gpu-telemetry")
EXPORTER, DERIVED, DMON, GSSR = (DATA / d for d in ("dcgm-exporter", "dcgm-exporter-derived", "dcgmi-dmon",
                                                    "gssr-record"))

# file -> (format, {entity index: ticks}, MIG entities)
EXPECTED = {
    DMON / "dcgm-user-guide_dmon_1001_1004_1005.txt": ("dmon", {"0": 15}, set()),
    DMON / "dcgm-user-guide_dmon_mig_1001_1004_g8.txt": ("dmon", {"0": 10, "GPU-I0": 10, "GPU-I1": 10},
                                                         {"GPU-I0", "GPU-I1"}),
    DMON / "llm-action_H800_dmon_i0_1011_1012_1009_1010_c5.txt": ("dmon", {"0": 5}, set()),
    DMON / "llm-action_H800_dmon_i0-3_1011_1012.txt": ("dmon", {str(i): 6 for i in range(4)}, set()),
    DMON / "llm-action_H800_dmon_1011_1012.txt": ("dmon", {str(i): 2 for i in range(8)}, set()),
    DMON / "llm-action_H800_dmon_1011_1012_1009_1010_g18.txt": ("dmon", {"7": 4, "0": 3}, set()),
    EXPORTER / "cloud-native-docs_dcgm-exporter.rst_L245-266_mig.prom": ("exporter", {"0": 1, "0/gi13": 1},
                                                                         {"0/gi13"}),
    EXPORTER / "dcgm-exporter_README_L16-26.prom": ("exporter", {"0": 1}, set()),
    EXPORTER / "dcgm-exporter_README_L68-78.prom": ("exporter", {"0": 1}, set()),
    DERIVED / "dcgm-exporter_README_L16-26.no-ellipsis.prom": ("exporter", {"0": 1}, set()),
    DERIVED / "dcgm-exporter_README_L68-78.no-ellipsis.prom": ("exporter", {"0": 1}, set()),
    GSSR / "short-n1-g1": ("gssr-record", {"0": 1}, set()),
    GSSR / "short-n100-g1": ("gssr-record", {"0": 100}, set()),
    GSSR / "fake-n100-g4": ("gssr-record", {str(i): 100 for i in range(4)}, set()),
    GSSR / "gendata-layout": ("gssr-record", {str(i): 100 for i in range(4)}, set()),
}
# not raw output, or nothing in it: one line naming the file and line, and why
REFUSED = {
    DMON / "llm-action_H800_dmon_1011_1012_1009_1010_annotated.txt": r"annotated\.txt:1: no '#Entity' header .*"
                                                                      r"not raw dcgmi dmon output",
    GSSR / "short-n0-g1": r"proc_0\.csv:1: a header and no samples",
    GSSR / "short-n10-g0": r"proc_0\.csv:1: a header and no samples",
}


def test_every_file_is_covered():
    files = {p for p in DATA.glob("*/*")}
    assert files == set(EXPECTED) | set(REFUSED)


@pytest.mark.parametrize("path", list(EXPECTED), ids=lambda p: p.name)
def test_imports_as_provenance_says(path):
    fmt, ticks, mig = EXPECTED[path]
    assert importers.detect(path) == fmt
    rec = importers.load(path).freeze()
    assert {k[1]: len(g) for k, g in rec.gpus.items()} == ticks
    assert {k[1] for k, g in rec.gpus.items() if g.mig} == mig
    rep = build(rec)                                  # and the report is built, apart for instances
    assert rep["gpus"] == len(ticks) - len(mig)
    assert (rep["instances"] or {}).get("count", 0) == len(mig)


@pytest.mark.parametrize("path", list(REFUSED), ids=lambda p: p.name)
def test_refused_in_one_line(path):
    with pytest.raises(UsageError, match=REFUSED[path]) as err:
        importers.load(path)
    assert "\n" not in str(err.value)


def test_annotated_copy_is_detected_as_dmon_and_refused_for_its_reason():
    path = DMON / "llm-action_H800_dmon_1011_1012_1009_1010_annotated.txt"
    assert importers.detect(path) == "dmon"
    fake = path.read_text()
    with pytest.raises(UsageError, match=r":4: value '38735656050\(36.07GB/s\)' has a note glued on"):
        _load_text("#Entity   NVLTX  NVLRX  PCITX  PCIRX\nID\n" + fake)


def _load_text(text: str):
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "copy.txt"
        f.write_text(text)
        return importers.load(f)


def test_mig_instance_is_an_entity_not_a_second_sample():
    rec = importers.load(EXPORTER / "cloud-native-docs_dcgm-exporter.rst_L245-266_mig.prom")
    gpu, inst = rec.gpus[("ub20-a100-k8s", "0")], rec.gpus[("ub20-a100-k8s", "0/gi13")]
    assert gpu.t == [0.0] and inst.t == [0.0]         # one scrape, not two
    assert gpu.mig is None and inst.mig == {"gpu_i_id": "13", "gpu_i_profile": "1g.5gb", "parent": "0"}
    assert math.isclose(gpu.values["dram_active"][0], 0.690789, rel_tol=1e-6)
    assert math.isclose(inst.values["dram_active"][0], 0.800339, rel_tol=1e-6)
    rep = build(rec)
    assert [g["gpu"] for g in rep["per_gpu"]] == ["ub20-a100-k8s:0"]
    only = rep["instances"]["per_instance"][0]
    assert only["gpu"] == "ub20-a100-k8s:0/gi13" and only["mig"]["gpu_i_profile"] == "1g.5gb"
    assert rep["score"] == pytest.approx(0.929, abs=1e-3)            # the GPU's tensor pipe
    assert rep["instances"]["score"] == pytest.approx(1.0)            # the instance's DRAM 0.80 / 0.8


def test_dmon_mig_parent_and_instances_kept_apart():
    rec = importers.load(DMON / "dcgm-user-guide_dmon_mig_1001_1004_g8.txt")
    rep = build(rec)
    assert rep["gpus"] == 1 and rep["score"] == pytest.approx(0.816, abs=1e-3)
    assert rep["instances"]["score"] == pytest.approx(0.952, abs=1e-3)
    assert [g["mig"] for g in rep["instances"]["per_instance"]] == [{"gpu_i_id": "0"}, {"gpu_i_id": "1"}]


def test_instances_stay_instances_in_a_job_directory(tmp_path):
    from hpcml.score.archive import write_store
    rec = importers.load(EXPORTER / "cloud-native-docs_dcgm-exporter.rst_L245-266_mig.prom")
    write_store(rec, tmp_path / "job")
    back = importers.load(tmp_path / "job")
    assert {k[1]: g.mig for k, g in back.gpus.items()} == {
        "0": None, "0/gi13": {"gpu_i_id": "13", "gpu_i_profile": "1g.5gb", "parent": "0"}}
    assert build(back)["instances"]["count"] == 1


def test_dcgm_blank_sentinel_is_missing_and_elision_noted():
    for path in (EXPORTER / "dcgm-exporter_README_L16-26.prom", DERIVED / "dcgm-exporter_README_L68-78.no-ellipsis.prom"):
        rec = importers.load(path)
        g = rec.gpus[("node", "0")]
        assert g.values["sm_clock"] == [139.0] and g.values["mem_clock"] == [405.0]
        assert math.isnan(g.values["memory_temp"][0])                  # 9223372036854775794: not a temperature
        assert any("blank sentinel" in n for n in rec.notes)
        assert any("'...'" in n for n in rec.notes) == ("derived" not in str(path))


def test_dmon_values_na_and_old_header():
    rec = importers.load(DMON / "llm-action_H800_dmon_i0_1011_1012_1009_1010_c5.txt")
    g = next(g for k, g in rec.gpus.items() if k[1] == "0")
    assert np.isnan(g.values["nvlink_tx_bytes"][:2]).all() and g.values["pcie_tx_bytes"][2] == 498948
    rec = importers.load(DMON / "dcgm-user-guide_dmon_1001_1004_1005.txt")
    g = next(iter(rec.gpus.values()))
    assert set(g.values) == {"gr_engine_active", "pipe_tensor_active", "dram_active"}
    assert math.isclose(g.values["pipe_tensor_active"][-1], 0.930, rel_tol=1e-6)
    assert build(rec)["bound"] == "compute"
