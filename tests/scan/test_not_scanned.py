"""The ``not-scanned`` verdict (issue 47): a format hpcml recognises but does not read is
never ``safe``: its own exit code (8, after 6, 5 and 7), in the table, JSON and SARIF, and
``safe_load`` refuses it."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import FileResult, Verdict
from hpcml.scan.policy import default_policy
from hpcml.scan.scanner import exit_code
from tests.scan.formats.hdf5files import LAMBDA_CONFIG, PLAIN_CONFIG, keras_h5


def _hpcml(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True, timeout=120)


def test_verdict_ranks_above_safe_and_below_error():
    assert Verdict.worst([Verdict.SAFE, Verdict.NOT_SCANNED]) is Verdict.NOT_SCANNED
    assert Verdict.worst([Verdict.NOT_SCANNED, Verdict.ERROR]) is Verdict.ERROR


@pytest.mark.parametrize("verdicts, block, code", [
    ([Verdict.NOT_SCANNED, Verdict.SAFE], True, 8),
    ([Verdict.NOT_SCANNED, Verdict.ERROR], True, 7),
    ([Verdict.NOT_SCANNED, Verdict.UNKNOWN], True, 5),
    ([Verdict.NOT_SCANNED, Verdict.UNKNOWN], False, 8),          # unknown allowed: still not scanned
    ([Verdict.NOT_SCANNED, Verdict.DANGEROUS], True, 6),
    ([Verdict.SAFE], True, 0),
])
def test_exit_code_order(verdicts, block, code):
    policy = default_policy()
    policy.block_unknown = block
    assert exit_code([FileResult(path=str(i), format="x", verdict=v) for i, v in enumerate(verdicts)], policy) == code


def test_cli_exit_8_json_sarif_and_table(tmp_path):
    (tmp_path / "model.h5").write_bytes(keras_h5(PLAIN_CONFIG))
    (tmp_path / "state.pkl").write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=4))
    out = _hpcml("scan", "--json", "--sarif", str(tmp_path / "scan.sarif"), str(tmp_path))
    assert out.returncode == 8, out.stderr
    doc = json.loads(out.stdout)
    by_name = {Path(f["path"]).name: f for f in doc["files"]}
    assert by_name["model.h5"]["verdict"] == "not-scanned" and by_name["state.pkl"]["verdict"] == "safe"
    assert doc["exit_code"] == 8 and doc["summary"]["not-scanned"] == 1
    sarif = json.loads((tmp_path / "scan.sarif").read_text())
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["HPCML-SCAN-NOT-SCANNED"]
    table = _hpcml("scan", str(tmp_path / "model.h5"))
    assert table.returncode == 8
    assert "not-scanned" in table.stdout and "HDF5 weights" in table.stdout and "Not scanned" in table.stdout


def test_cli_dangerous_wins_over_not_scanned(tmp_path):
    (tmp_path / "a.h5").write_bytes(keras_h5(PLAIN_CONFIG))
    (tmp_path / "b.h5").write_bytes(keras_h5(LAMBDA_CONFIG))
    assert _hpcml("scan", str(tmp_path)).returncode == 6


def test_safe_load_refuses_a_file_it_did_not_read(tmp_path):
    path = tmp_path / "model.h5"
    path.write_bytes(keras_h5(PLAIN_CONFIG))
    with pytest.raises(UnsafeFileError) as info:
        safe_load(path)
    assert info.value.exit_code == 8
    assert "(not-scanned)" in str(info.value) and "does not read keras-h5 files" in str(info.value)
