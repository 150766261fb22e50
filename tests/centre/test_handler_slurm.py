"""`hpcml centre handle` against the real local cluster (n1, n2): repeated failures drain n1,
an admin's drain of n2 is never touched, a recheck resumes n1, --dry-run changes nothing.

Every node drained here is resumed in the fixture's teardown: the cluster is shared.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcml.centre.cli import app as centre_app
from tests.vet.reports import vet_report

pytestmark = pytest.mark.slurm

RULES = """\
name: slurm-test-rules
max_drain_fraction: 50%
min_nodes_kept: 0
rules:
  - name: gpu-failing
    match: {type: gpu}
    count: 3
    window: 1 h
    reason: "hpcml: {check} failed {count}x in {window}"
    resume_after: {passes: 1}
"""


def _node(name: str, env) -> str:
    return subprocess.run(["scontrol", "show", "node", name], capture_output=True, text=True,
                          env=env, timeout=10, check=True).stdout


def _reason(name: str, env) -> str:
    text = _node(name, env)
    return text.split("Reason=", 1)[1].splitlines()[0].strip() if "Reason=" in text else ""


def _drained(name: str, env) -> bool:
    return "DRAIN" in _node(name, env).split("State=", 1)[1].split()[0]


def _scontrol(env, *args):
    subprocess.run(["scontrol", "update", *args], env=env, timeout=10, check=True)


@pytest.fixture
def nodes(slurm_cluster, slurm_env):
    for n in ("n1", "n2"):
        assert not _drained(n, slurm_env), f"{n} drained before the test: {_reason(n, slurm_env)}"
    try:
        yield slurm_env
    finally:
        for n in ("n1", "n2"):
            if _drained(n, slurm_env):
                subprocess.run(["scontrol", "update", f"nodename={n}", "state=resume"],
                               env=slurm_env, timeout=10)


def _write_report(root: Path, name: str, outcomes: dict[str, str]) -> None:
    d = root / name
    d.mkdir(parents=True)
    report = vet_report({n: [("gpu", "gpu", o)] for n, o in outcomes.items()}, started_at=time.time(), job_id=name)
    (d / "report.json").write_text(json.dumps(report))


def _run(*args):
    return CliRunner().invoke(centre_app, ["handle", *args])


def test_failures_drain_recheck_resumes_foreign_drain_left_alone(nodes, tmp_path):
    env = nodes
    rules, reports, audit = tmp_path / "rules.yaml", tmp_path / "reports", tmp_path / "audit.jsonl"
    rules.write_text(RULES)
    _scontrol(env, "nodename=n2", "state=drain", "reason=admin: maintenance")
    for i in range(3):
        _write_report(reports, f"fail{i}", {"n1": "fail", "n2": "fail"})
    args = ["--rules", str(rules), "--results", str(reports), "--audit", str(audit), "--json"]

    dry = _run(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert not _drained("n1", env)
    assert [(e["node"], e["action"], e["dry_run"]) for e in _lines(audit)] == [("n1", "drain", True)]

    out = _run(*args)
    assert out.exit_code == 0, out.output
    acts = {a["node"]: a for a in json.loads(out.output)["actions"]}
    assert acts["n1"]["action"] == "drain" and acts["n1"]["status"] == "done"
    assert acts["n2"]["action"] == "skip" and "someone else" in acts["n2"]["note"]
    assert _drained("n1", env) and _reason("n1", env).startswith("hpcml: gpu failed 3x in 1 h")
    assert _drained("n2", env) and _reason("n2", env).startswith("admin: maintenance")

    again = _run(*args)  # still drained, no recheck yet: nothing changes
    assert again.exit_code == 0 and json.loads(again.output)["actions"][0]["action"] == "hold"
    assert len(_lines(audit)) == 2

    _write_report(reports, "recheck", {"n1": "pass", "n2": "pass"})
    out = _run(*args)
    assert out.exit_code == 0, out.output
    assert not _drained("n1", env)
    assert _drained("n2", env) and _reason("n2", env).startswith("admin: maintenance")

    log = _lines(audit)
    assert [(e["node"], e["action"], e["dry_run"], e["scontrol"]) for e in log] == \
        [("n1", "drain", True, None), ("n1", "drain", False, "ok"), ("n1", "resume", False, "ok")]
    assert log[1]["evidence"]["results"] == 3 and log[1]["evidence"]["window"] == "1 h"
    assert log[1]["state_before"].startswith("IDLE") and "DRAIN" in log[2]["state_before"]


def test_drains_over_the_cap_are_deferred_and_reported(nodes, tmp_path):
    env = nodes
    reports, audit = tmp_path / "reports", tmp_path / "audit.jsonl"
    for i in range(3):
        _write_report(reports, f"fail{i}", {"n1": "fail", "n2": "fail"})
    (tmp_path / "rules.yaml").write_text(RULES.replace("50%", "10%"))
    out = _run("--rules", str(tmp_path / "rules.yaml"), "--results", str(reports),
               "--audit", str(audit))
    assert out.exit_code == 0, out.output
    assert out.output.count("defer") >= 2               # printed, not silently dropped
    assert not _drained("n1", env) and not _drained("n2", env)
    assert sorted((e["node"], e["action"], e["status"]) for e in _lines(audit)) == \
        [("n1", "defer", "deferred"), ("n2", "defer", "deferred")]
    assert all("max_drain_fraction 10% of 2 nodes allows 0" in e["note"] for e in _lines(audit))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
