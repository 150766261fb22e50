"""Unknown is never good: a node report that measured nothing is ``unchecked`` at the real
collector (SQLite and PostgreSQL), never resumes a drained node, never hides a failure, and
the centre report says "not checked" for it, never "vetted" nor "never caught".

The reports that checked nothing are made by the real prolog (``run_prolog``: a GPU check on
a node without a driver, recorded NVML, is skipped) and sent over HTTP; the handler reads
them back through ``StoreSource``, as ``hpcml centre handle --db`` does. Slurm's side is a
fake here (states and scontrol), as in test_rules.py; test_prolog_resume_slurm.py runs the
real one.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest

from hpcml import schemas
from hpcml.centre import handler
from hpcml.centre.collector.schema import parse
from hpcml.centre.collector.store import open_store
from hpcml.centre.handler import NodeState
from hpcml.centre.report import build, lines, next_action, render_html
from hpcml.centre.rules import DEFAULT_RULES, load
from hpcml.centre.sources import StoreSource
from hpcml.centre.summaries import Invalid
from tests.centre.collector.test_collector import call
from tests.centre.conftest import TRUSTED_TOKEN
from tests.centre.jobdocs import event, proven, summary
from tests.vet.reports import vet_report

ROOT = Path(__file__).resolve().parents[2]
HOUR, DAY = 3600.0, 86400.0
DRAINED = "hpcml: scratch: not a mount point"


def _unchecked(node: str, t: float, monkeypatch) -> dict:
    """What ``hpcml vet --prolog --report-to`` sends from a node whose every fast check was
    skipped (its GPU check, no driver), dated ``t``."""
    from hpcml.vet import prolog
    from hpcml.vet.protocol import loads
    monkeypatch.setenv("HPCML_VET_NVML_REPLAY", str(ROOT / "tests" / "fixtures" / "nvml" / "no_driver.json"))
    res = prolog.run_prolog(loads("name: site-prolog\nevals:\n  - {name: gpu, type: gpu}\n"), budget=5.0,
                            started=time.time(), env={"SLURMD_NODENAME": node})
    assert res.healthy is None and res.node == node, res.to_json()
    return res.node_report("site-prolog", t)


def _report(node: str, t: float, verdict: str, *results: tuple[str, str, str]) -> dict:
    return {"job_id": None, "node": node, "time": t, "protocol": "site-prolog", "verdict": verdict,
            "results": [{"name": c, "type": typ, "outcome": o, **({"message": DRAINED} if typ == "drain" else {})}
                        for c, typ, o in results]}


def _post(collector, body: dict) -> None:
    """As root's own report about its node (the centre's trusted token: node evidence)."""
    code, answer = call(collector, "POST", "/v1/reports", body, token=TRUSTED_TOKEN)
    assert code == 201, answer


class _Slurm:
    """n1 drained by hpcml's prolog; records every scontrol update."""

    def __init__(self) -> None:
        self.st = {"n1": NodeState("n1", "IDLE+DRAIN", DRAINED + " [root@now]"), "n2": NodeState("n2", "IDLE"),
                   "n3": NodeState("n3", "IDLE")}
        self.calls: list = []

    def states(self, name=None):
        return {k: v for k, v in self.st.items() if name is None or k == name}

    def update(self, names, **fields):
        self.calls.append((names, fields))
        for n in names:
            self.st[n] = NodeState(n, "IDLE")


def test_a_node_of_a_vet_report_that_measured_nothing_is_unchecked_and_a_contradiction_is_refused():
    doc = vet_report({"ok": [("mem", "memory", "pass")], "skipped": [("gpu", "gpu", "skipped")], "none": [],
                      "gone": None, "bad": [("mem", "memory", "fail")]})
    assert {r.node: r.verdict for r in parse(json.dumps(doc).encode())} == \
        {"ok": "good", "skipped": "unchecked", "none": "unchecked", "gone": "bad", "bad": "bad"}
    body = _report("n1", 1.0, "good", ("gpu", "gpu", "skipped"))       # an older prolog's "good"
    assert [r.verdict for r in parse(json.dumps(body).encode())] == ["unchecked"]
    lying = _report("n1", 1.0, "unchecked", ("gpu", "gpu", "skipped"), ("mem", "memory", "pass"))
    with pytest.raises(Invalid) as info:
        parse(json.dumps(lying).encode())
    assert "\n" not in str(info.value) and "'unchecked' but a check measured something" in str(info.value)


def test_an_unchecked_report_never_resumes_a_drained_node_nor_hides_a_failure(collector, db_url, tmp_path, monkeypatch):
    """The prolog drained n1 for its scratch. Since: a health check with the scratch back and
    the memory check failing; one that checked nothing at all; one with the scratch passing and
    the memory check skipped. Two scratch passes, but the memory check's last measurement
    failed and nothing measured it since: n1 stays drained. Once the memory check passes, the
    handler resumes it: the hold was the unchecked reports', not the setup's."""
    now = time.time()
    _post(collector, _report("n1", now - 5 * HOUR, "bad", ("scratch", "mounts", "fail"), ("memory", "memory", "pass"),
                             ("hpcml-drain", "drain", "fail")))
    _post(collector, _report("n1", now - 4 * HOUR, "bad", ("scratch", "mounts", "pass"), ("memory", "memory", "fail")))
    _post(collector, _unchecked("n1", now - 3 * HOUR, monkeypatch))
    _post(collector, _report("n1", now - 2 * HOUR, "good", ("scratch", "mounts", "pass"),
                             ("memory", "memory", "skipped")))
    slurm, audit = _Slurm(), tmp_path / "audit.jsonl"

    def handle():
        return {a.node: a for a in handler.handle(load(DEFAULT_RULES), StoreSource(db_url), audit_path=audit,
                                                  now=datetime.now(timezone.utc), states=slurm.states,
                                                  update=slurm.update).actions}
    n1 = handle()["n1"]
    assert (n1.action, n1.evidence.get("failing")) == ("hold", ["memory"]), n1
    assert slurm.calls == [] and "DRAIN" in slurm.st["n1"].state
    verdicts = [r["verdict"] for r in call(collector, "GET", "/v1/nodes/n1/history")[1]["reports"]]
    assert verdicts == ["good", "unchecked", "bad", "bad"], verdicts     # newest first
    _post(collector, _unchecked("n1", now - 1.5 * HOUR, monkeypatch))      # still nothing measured: still held
    assert handle()["n1"].action == "hold" and slurm.calls == []
    _post(collector, _report("n1", now - HOUR, "good", ("scratch", "mounts", "pass"), ("memory", "memory", "pass")))
    assert handle()["n1"].action == "resume" and slurm.calls == [(["n1"], {"state": "resume"})]


def test_the_centre_report_says_not_checked_never_vetted_or_good(collector, db_url, monkeypatch):
    """n2 hurt two users' jobs and every vetting of it measured nothing; n3's one vetting is a
    row an older collector stored as "good" with its check skipped. Neither is "vetted" nor
    "never caught"; the page says not checked; n3's history reads unchecked."""
    now = time.time()
    for t in (now - 2 * DAY, now - DAY):
        _post(collector, _unchecked("n2", t, monkeypatch))
    _post(collector, _unchecked("n3", now - DAY, monkeypatch))
    _post(collector, _report("n4", now - DAY, "good", ("mem", "memory", "pass")))
    store = open_store(db_url)
    try:
        with store._writing() as conn, store._transaction(conn):       # what an older collector stored
            conn.execute("UPDATE reports SET verdict = 'good' WHERE node = 'n3'")
        history = [r["verdict"] for r in store.history("n3")]
        store.add_jobs([proven(summary("1", ended=now - DAY, user="alice", stragglers=[event(n, 0) for n in
                                                                                       ("n2", "n3", "n4")])),
                        proven(summary("2", ended=now - DAY / 2, user="bob", culprits=[event("n2", 1)]))])
        rep = build(store, 30 * DAY)
    finally:
        store.close()
    line = {row.split(":")[0].strip(): row for row in lines(rep) if row.startswith("  n")}
    assert line["n2"].startswith("  n2: 2 jobs (straggler 1, culprit 1)"), line
    assert line["n2"].endswith("; not checked: 2 vettings in the window measured nothing"), line["n2"]
    assert line["n3"].endswith("; not checked: 1 vetting in the window measured nothing"), line["n3"]
    assert line["n4"].endswith("; vetted 1x, 0 bad: vetting never caught it"), line["n4"]       # measured
    assert history == ["unchecked"]
    jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
    vet = {n["node"]: n["vet"] for n in rep["nodes"]}
    assert (vet["n2"]["reports"], vet["n2"]["unchecked"], vet["n2"]["bad"], vet["n2"]["last_good"]) == (2, 2, 0, None)
    assert (vet["n3"]["unchecked"], vet["n3"]["last_good"]) == (1, None)
    assert (vet["n4"]["unchecked"], vet["n4"]["last_good"] is not None) == (0, True)
    page = render_html(rep)
    assert "not checked: 2 vettings in the window measured nothing" in page and "vetted 2x" not in page
    # a node two users' jobs named once each as a fault, whose every vetting measured nothing:
    # to be tested, not "vetting never caught it"
    seen = {"users": 2, "straggler": 1, "excluded": 1, "vet": vet["n2"]}
    assert next_action(seen) == "test: its vetting measured nothing in the window (not checked); vet it when it is idle"


def test_a_node_jobs_named_that_was_never_vetted_is_to_be_tested_not_watched():
    """"vetting never caught it" claims a vetting ran and passed: for a node the jobs named
    and no vetting in the window measured (none ran, or a job's vetting left it out for
    measuring nothing) the next step is to test it."""
    for vet in (None, {"reports": 0, "bad": 0, "unchecked": 0}):
        assert next_action({"users": 2, "straggler": 1, "vet": vet}) == "test: not vetted in the window; vet it when it is idle"
    assert next_action({"users": 2, "straggler": 1, "vet": {"reports": 2, "bad": 0, "unchecked": 0}}).startswith(
        "watch: vetting never caught it")
