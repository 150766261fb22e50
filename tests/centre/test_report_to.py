"""``hpcml vet run --report-to``: a real vetting run of this machine sends its results to
a live collector (SQLite and PostgreSQL); a dead collector only costs a warning."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from tests.centre.conftest import READ_TOKEN, TOKEN


def _vet(tmp_path, *extra, env_token=TOKEN):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HPCML_VET_TOKEN": env_token}
    return subprocess.run([sys.executable, "-m", "hpcml", "vet", "run", "--local", "--out", str(tmp_path / "out"),
                           *extra], capture_output=True, text=True, env=env, timeout=120)


def test_vet_run_reports_to_the_collector(collector, tmp_path):
    proc = _vet(tmp_path, "--report-to", collector.url)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    nodes = json.loads((tmp_path / "out" / "report.json").read_text())["nodes"]
    (name,) = nodes
    checks = {r.get("check", r.get("name")) for r in nodes[name]["results"]}
    req = urllib.request.Request(f"{collector.url}/v1/nodes/{name}/history",
                                 headers={"Authorization": f"Bearer {READ_TOKEN}"})
    history = json.loads(urllib.request.urlopen(req, timeout=10).read())
    reports = history if isinstance(history, list) else history.get("reports", history)
    assert len(reports) == 1 and reports[0]["node"] == name
    assert {r["name"] for r in reports[0]["results"]} == checks and len(checks) >= 5


def test_dead_collector_is_a_warning_not_a_failure(tmp_path):
    proc = _vet(tmp_path, "--report-to", "http://127.0.0.1:9/")
    assert proc.returncode == 0
    assert proc.stderr.count("warning: report not sent") == 1
