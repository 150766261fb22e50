"""Real telemetry from other producers (../shared/testdata/gpu-telemetry, PROVENANCE.md):
each file imports as the GPUs, MIG instances and ticks that file's provenance gives, or,
where it is not raw output, is refused in one line that says why."""

from __future__ import annotations

import math
from pathlib import Path

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



def _report(path, tmp_path, *extra: str):
    """``hpcml score report`` on a fresh copy (the report's HTML is written beside its input)."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    copy = Path(tempfile.mkdtemp(dir=tmp_path)) / path.name
    (shutil.copytree if path.is_dir() else shutil.copy)(path, copy)
    p = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(copy), "--no-html", *extra],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout) if "--json" in extra else p.stdout


@pytest.mark.parametrize("path", [DMON / "llm-action_H800_dmon_i0_1011_1012_1009_1010_c5.txt",
                                  EXPORTER / "dcgm-exporter_README_L16-26.prom"], ids=lambda p: p.name)
def test_activity_not_recorded_is_not_called_idle(path, tmp_path):
    """NVLink/PCIe only, or clocks only: no field says whether the GPUs worked, so they are not "idle"."""
    rep = _report(path, tmp_path, "--json")
    assert rep["score"] is None and rep["span_s"] is None
    assert rep["findings"] == ["no activity recorded (sm_active, gr_engine_active, gpu_util): the active span, "
                               "and so the score, cannot be found; record SM activity (DCGM field 1002) or NVML "
                               "utilisation with the other fields."]
    text = _report(path, tmp_path)
    assert "→ no activity recorded" in text and "idle GPUs" not in text
    page = _page(path)
    assert "no activity recorded (sm_active, gr_engine_active, gpu_util)" in page and "idle GPUs" not in page


@pytest.mark.parametrize(("path", "missing"), [
    (DMON / "dcgm-user-guide_dmon_1001_1004_1005.txt", "fp64, fp32, fp16"),     # TENSO only
    # gssr-record's tensor comes from its IMMA/HMMA/DFMA sub-pipes: test_hostile_inputs
], ids=lambda x: getattr(x, "name", x))
def test_compute_from_some_pipes_is_named_a_lower_bound(path, missing, tmp_path):
    note = (f"pipe activity not recorded: {missing}; compute is the largest of the pipes that were, so compute "
            "and the score are at least the values shown")
    rep = _report(path, tmp_path, "--json")
    assert rep["breakdown"]["compute"] is not None and note in rep["notes"]
    assert f"note: {note}" in _report(path, tmp_path)
    assert note in _page(path)


def _page(path) -> str:
    """The HTML report of ``path``, unescaped, rendered in memory (nothing written beside it)."""
    import html

    from hpcml.score import html as score_html
    return html.unescape(score_html.render(build(importers.load(path))))
