"""modelaudit's Keras pair (``../shared/testdata/scan-peers/modelaudit``), through the
command a user runs: the Lambda model is ``dangerous`` (exit 6) and names the layer, the
plain model is ``not-scanned`` (exit 8) with no dangerous finding. Scanned, never loaded.
A machine without ``../shared`` skips this module in one line."""

from __future__ import annotations

import json
import subprocess
import sys

from tests import needs

MODELAUDIT = needs.shared_testdata("scan-peers", "modelaudit")


def _scan(name: str) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", "--json", str(MODELAUDIT / name)],
                         capture_output=True, text=True, timeout=120)
    return out.returncode, json.loads(out.stdout)["files"][0]


def test_malicious_lambda_is_dangerous():
    code, result = _scan("keras__malicious_lambda.h5")
    assert (code, result["verdict"], result["format"]) == (6, "dangerous", "keras-h5")
    assert [f["name"] for f in result["findings"] if f["verdict"] == "dangerous"] == ["keras Lambda"]


def test_safe_model_is_not_scanned_never_safe():
    code, result = _scan("keras__safe_model.h5")
    assert (code, result["verdict"], result["format"]) == (8, "not-scanned", "keras-h5")
    assert not [f for f in result["findings"] if f["verdict"] == "dangerous"]
