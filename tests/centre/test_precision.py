"""How often each check's and rule's verdict was right (``hpcml.centre.precision``): the
rules of confirmation on hand-made evidence, and a simulated fleet with known truth
(``hpcml.testing.fleet``: results and proven job summaries written through the collector's
store, the node handler's real ``plan`` draining and resuming) whose figures the centre
report computes are checked against that truth."""

from __future__ import annotations

import time

import jsonschema

from hpcml import schemas
from hpcml.centre.collector.store import open_store
from hpcml.centre.precision import HORIZON, Evidence, checks, rules, wilson
from hpcml.centre.report import build, lines
from hpcml.centre.rules import DEFAULT_RULES, load
from hpcml.testing.fleet import simulate

DAY = 86400.0


def test_wilson_interval_matches_its_formula_and_is_none_without_data():
    assert wilson(0, 0) == (None, None)
    lo, hi = wilson(9, 10)
    assert lo is not None and hi is not None and 0.59 < lo < 0.6 and 0.98 < hi < 0.99
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0


def test_a_flag_is_confirmed_only_by_independent_evidence():
    """n1's gemm fail is confirmed by a job that named n1 five days later; n2's by its Xid
    check failing twice (another type; n7's one Xid fail is noise, no witness); n3's pcie fail
    only by gpu-count fails, the same type: refuted once the horizon passed; n4's recent fail
    is pending; a crashed rank (n7's, the code's) confirms nothing and makes no bad node."""
    now = 100 * DAY
    t = now - 30 * DAY
    results = [
        {"node": "n1", "name": "gemm", "type": "compute", "outcome": "fail", "time": t},
        {"node": "n2", "name": "gemm", "type": "compute", "outcome": "fail", "time": t},
        {"node": "n2", "name": "xid", "type": "xid", "outcome": "fail", "time": t + DAY},
        {"node": "n2", "name": "xid", "type": "xid", "outcome": "fail", "time": t + 2 * DAY},
        {"node": "n3", "name": "pcie", "type": "gpu", "outcome": "fail", "time": t},
        {"node": "n3", "name": "gpu-count", "type": "gpu", "outcome": "fail", "time": t + DAY},
        {"node": "n3", "name": "gpu-count", "type": "gpu", "outcome": "fail", "time": t + 2 * DAY},
        {"node": "n7", "name": "gemm", "type": "compute", "outcome": "fail", "time": t},
        {"node": "n7", "name": "xid", "type": "xid", "outcome": "fail", "time": t + DAY},
        {"node": "n4", "name": "gemm", "type": "compute", "outcome": "fail", "time": now - DAY},
        {"node": "n5", "name": "gemm", "type": "compute", "outcome": "pass", "time": t},
    ]
    harms = [{"node": "n1", "role": "straggler", "time": t + 5 * DAY},
             {"node": "n6", "role": "culprit", "time": t + 2 * DAY},
             {"node": "n7", "role": "crashed", "time": t + 2 * DAY},      # the code's
             {"node": "n1", "role": "excluded", "time": t}]                # excluded is no harm
    ev = Evidence(results, harms)
    got = {c["check"]: c for c in checks(ev, now - 60 * DAY, now)}
    gemm = got["gemm"]
    assert (gemm["confirmed"], gemm["refuted"], gemm["pending"]) == (2, 1, 1) and gemm["precision"] == round(2 / 3, 4)
    assert gemm["bad_nodes"] == 2 and gemm["caught"] == 1 and gemm["lead_s_median"] == 5 * DAY    # n1 before, n6 never
    assert (got["pcie"]["confirmed"], got["pcie"]["refuted"]) == (0, 1)
    drains = [{"node": "n1", "rule": "slow", "time": t + DAY}, {"node": "n3", "rule": "slow", "time": t},
              {"node": "n3", "rule": "slow", "time": t + 20 * DAY}]
    r = rules(ev, drains, now - 60 * DAY, now,
              {"slow": {"matches": lambda typ, check: typ == "compute", "jobs": False, "floor": 0.9}})[0]
    # n1: a job named it; n3 at first: its gpu checks failing (another type than the rule's);
    # n3 again 20 days on: nothing within the horizon
    assert (r["confirmed"], r["refuted"], r["pending"]) == (2, 1, 0) and r["floor"] == 0.9
    assert r["below_floor"] is False                 # 3 decided: too few to call it


def test_a_bad_node_is_caught_by_any_flag_in_the_horizon_before_its_first_hurt_job():
    """A flag 20 days before the harm (outside the horizon) and another a day before it:
    caught, lead one day; a rule's own kind of evidence never confirms its drain."""
    now, h = 100 * DAY, 60 * DAY
    results = [{"node": "n1", "name": "gemm", "type": "compute", "outcome": "fail", "time": h - 20 * DAY},
               {"node": "n1", "name": "gemm", "type": "compute", "outcome": "fail", "time": h - DAY},
               {"node": "n2", "name": "gemm", "type": "compute", "outcome": "fail", "time": h}]
    ev = Evidence(results, [{"node": "n1", "role": "culprit", "time": h}])
    gemm = checks(ev, 0.0, now)[0]
    assert gemm["caught"] == 1 and gemm["lead_s_median"] == DAY
    r = rules(ev, [{"node": "n2", "rule": "slow", "time": h + 60}], 0.0, now,
              {"slow": {"matches": lambda typ, check: check.startswith("gemm"), "jobs": False, "floor": None}})[0]
    assert (r["confirmed"], r["refuted"]) == (0, 1)      # its gemm fails are the rule's own evidence


def test_a_simulated_fleet_s_figures_follow_the_truth(tmp_path):
    """160 nodes for 21 days, 8 bad or lied about (dead, intermittent, slow, a lying PCIe
    check), 150 jobs a day of 20 users. The check that lies is measured as one (precision
    under 0.25; its truth 0), the checks that see dead and failing GPUs as mostly right, each
    within 0.3 of its truth (4 health-check rounds a day); the tuned default xid-critical right
    in every drain; the rule that drains the nodes of a lying check called below its floor;
    the JSON is what its schema says and the terminal says it. The jobs also blame healthy
    nodes (buggy users' crashes, false stragglers), as real ones do."""
    store = open_store(f"sqlite:///{tmp_path}/centre.db")
    end = time.time() - 3600
    try:
        truth = simulate(store, nodes=160, days=21, bad_share=0.05, end=end, seed=3)
        catalog = load(DEFAULT_RULES)
        declared = {r.name: r.evidence for r in catalog.rules}
        rep = build(store, 21 * DAY, now=end, drains=truth.drains, declared=declared)
    finally:
        store.close()
    jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
    got = {c["check"]: c for c in rep["verdicts"]["checks"]}
    assert got["pcie-link"]["precision"] is not None and got["pcie-link"]["precision"] < 0.25, got["pcie-link"]
    assert (truth.precision("pcie-link") or 0.0) < 0.1
    for check in ("gpu-count", "xid"):
        assert got[check]["precision"] > 0.6 and (truth.precision(check) or 0) > 0.5, (check, got[check])
    for check, c in got.items():
        decided = c["confirmed"] + c["refuted"]
        if decided >= 15:
            assert abs(c["precision"] - (truth.precision(check) or 0.0)) <= 0.3, (check, c, truth.precision(check))
    by_rule = {r["rule"]: r for r in rep["verdicts"]["rules"]}
    # the tuned xid-critical (twice in 24 h) drains dead nodes only, and says so
    xid = by_rule["xid-critical"]
    assert xid["drains"] == sum(d["rule"] == "xid-critical" for d in truth.drains) > 0
    assert truth.rule_precision("xid-critical") == 1.0 and xid["precision"] == 1.0 and not xid["below_floor"], xid
    # gpu-failing (3 GPU-type fails in 24 h) drains the nodes whose PCIe check lies: the
    # truth's precision is 0, the report's too, and it is called below its floor
    gpu = by_rule["gpu-failing"]
    assert truth.rule_precision("gpu-failing") == 0.0 and gpu["precision"] == 0.0, gpu
    assert gpu["confirmed"] + gpu["refuted"] >= 5 and gpu["below_floor"], gpu
    assert any("gpu-failing" in line and "BELOW ITS FLOOR" in line for line in lines(rep))
    assert rep["verdicts"]["horizon_s"] == HORIZON


def test_the_audit_s_drains_end_at_their_resume_or_at_the_next_drain():
    """A drain the handler resumed ends there; one a person resumed by hand (not in the
    audit) ends when the node is drained again, never left open for ever."""
    import json
    from datetime import datetime, timezone

    from hpcml.centre.precision import drains_from_audit

    def line(action, node, hours):
        return json.dumps({"action": action, "node": node, "status": "done", "rule": "r", "check": "c",
                           "time": f"2026-11-{1 + hours // 24:02d}T{hours % 24:02d}:00:00+00:00"})
    got = drains_from_audit([line("drain", "n1", 0), line("resume", "n1", 5), line("drain", "n2", 0),
                             line("drain", "n2", 48)])
    spans = {(d["node"], d["time"]): d["until"] for d in got}
    t = {h: datetime(2026, 11, 1 + h // 24, h % 24, tzinfo=timezone.utc).timestamp() for h in (0, 5, 48)}
    assert spans == {("n1", t[0]): t[5], ("n2", t[0]): t[48], ("n2", t[48]): None}
