"""Rules catalog loading and the handler's decisions, with fake node states (no Slurm)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hpcml.centre import handler
from hpcml.centre.handler import NodeState
from hpcml.centre.rules import DEFAULT_RULES, load, loads
from hpcml.centre.sources import JOB_CHECK, JsonDirSource, Reach, Result
from hpcml.errors import SlurmError, UsageError
from tests.vet.reports import vet_report

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
RULES = """\
name: test-rules
max_drain_fraction: 50%
min_nodes_kept: 1
rules:
  - name: gpu-failing
    match: {type: gpu}
    count: 3
    window: 24 h
    reason: "hpcml: {check} failed {count}x in {window}"
    resume_after: {passes: 2}
  - name: disk
    match: {check: "tmp-*", outcome: fail}
    count: 1
    window: 1 h
    reason: "disk {check} on {node}"
"""


def cat(text: str = RULES):
    return loads(text, "r.yaml")


def res(node, outcome, hours_ago, check="gpu", type_="gpu", job="1"):
    return Result(node, check, type_, outcome, NOW - timedelta(hours=hours_ago), job)


def nodes(n=4, **overrides):
    out = {f"n{i}": NodeState(f"n{i}", "IDLE") for i in range(1, n + 1)}
    for name, (state, reason) in overrides.items():
        out[name] = NodeState(name, state, reason)
    return out


# --- loading ------------------------------------------------------------------------------

def test_default_catalog_loads():
    c = load(DEFAULT_RULES)
    assert c.max_drain_fraction == pytest.approx(0.1) and c.min_nodes_kept == 1
    gpu = c.rule("gpu-failing")
    assert gpu.window == 86400 and gpu.count == 3 and gpu.resume_after.passes == 2
    assert all(r.reason.startswith("hpcml:") for r in c.rules)


def test_fields_and_defaults():
    c = cat()
    disk = c.rule("disk")
    assert c.max_drain_fraction == 0.5 and disk.match.outcome == ["fail"]
    assert disk.reason == "hpcml: disk {check} on {node}"  # the prefix marks our drains
    assert disk.resume_after is None and c.rule("gpu-failing").match.outcome == ["fail", "error"]
    assert c.rule("gpu-failing").render_reason(check="gpu", count=3) == "hpcml: gpu failed 3x in 24 h"


BAD = [
    ("name: x\nrules:\n  - name: a\n    count: 3\n    window: 24 hours\n",
     "r.yaml:5: key 'rules[0].window': expected a duration"),
    ("name: x\nrules:\n  - name: a\n    window: 1 h\n", "r.yaml:3: key 'rules[0].count': missing"),
    ("name: x\nrules:\n  - name: a\n    count: 0\n    window: 1 h\n",
     "r.yaml:4: key 'rules[0].count': Input should be greater than or equal to 1"),
    ("name: x\nrules:\n  - name: a\n    count: 1\n    window: 1 h\n    match: {outcome: [bad]}\n",
     "r.yaml:6: key 'rules[0].match.outcome[0]'"),
    ("name: x\nrules:\n  - name: a\n    count: 1\n    window: 1 h\n    reason: '{foo}'\n",
     "r.yaml:6: key 'rules[0].reason': unknown placeholder {foo}"),
    ("name: x\nrules:\n  - name: a\n    count: 1\n    window: 1 h\n    colour: red\n",
     "r.yaml:6: key 'rules[0].colour': unknown key"),
    ("name: x\nrules:\n  - name: a\n    count: 1\n    window: 1 h\n    action: reboot\n",
     "r.yaml:6: key 'rules[0].action': Input should be 'drain'"),
    ("name: x\nrules:\n  - name: a\n    count: 1\n    window: 1 h\n    resume_after: {passes: 0}\n",
     "r.yaml:6: key 'rules[0].resume_after.passes'"),
    ("name: x\nmax_drain_fraction: 150%\nrules:\n  - {name: a, count: 1, window: 1 h}\n",
     "r.yaml:2: key 'max_drain_fraction': Input should be less than or equal to 1"),
    ("name: x\nmin_nodes_kept: -1\nrules:\n  - {name: a, count: 1, window: 1 h}\n",
     "r.yaml:2: key 'min_nodes_kept'"),
    ("name: x\nrules: []\n", "r.yaml:2: key 'rules'"),
    ("name: x\nrules:\n  - {name: a, count: 1, window: 1 h}\n  - {name: a, count: 2, window: 1 h}\n",
     "r.yaml:4: key 'rules[1].name': duplicate rule name 'a'"),
    ("rules:\n  - {name: a, count: 1, window: 1 h}\n", "r.yaml:1: key 'name': missing"),
    ("- a\n- b\n", "r.yaml:1: expected a mapping"),
    ("name: [\n", "r.yaml:2: not valid YAML"),
]


@pytest.mark.parametrize("text,expected", BAD)
def test_bad_input_is_one_line_naming_file_line_and_key(text, expected):
    with pytest.raises(UsageError) as info:
        loads(text, "r.yaml")
    msg = str(info.value)
    assert msg.startswith(expected), msg
    assert "\n" not in msg and info.value.exit_code == 2


def test_missing_file():
    with pytest.raises(UsageError, match="nope.yaml: file not found"):
        load("nope.yaml")


# --- evaluation ---------------------------------------------------------------------------

def test_count_within_window_drains():
    results = [res("n1", "fail", 1), res("n1", "error", 5), res("n1", "fail", 20),
               res("n2", "fail", 1), res("n2", "fail", 2), res("n2", "fail", 30),  # one too old
               res("n3", "pass", 1), res("n3", "warn", 2), res("n3", "skipped", 3)]
    p = handler.plan(cat(), results, nodes(), {}, NOW)
    assert [(a.node, a.action) for a in p.actions] == [("n1", "drain")]
    a = p.actions[0]
    assert a.reason == "hpcml: gpu failed 3x in 24 h" and a.rule == "gpu-failing"
    assert a.evidence["results"] == 3 and a.evidence["window"] == "24 h"
    assert a.evidence["outcomes"] == ["error", "fail"]


def test_counts_are_per_check_and_glob_matches_names():
    results = [res("n1", "fail", 1, check="gpu-a"), res("n1", "fail", 2, check="gpu-b"),
               res("n1", "fail", 3, check="gpu-a"),
               res("n2", "fail", 0.5, check="tmp-disk", type_="disk")]
    p = handler.plan(cat(), results, nodes(), {}, NOW)
    assert [(a.node, a.action, a.rule) for a in p.actions] == [("n2", "drain", "disk")]
    assert p.actions[0].reason == "hpcml: disk tmp-disk on n2"


def test_duplicate_results_count_once():
    r = res("n1", "fail", 1)
    assert handler.plan(cat(), [r, r, r], nodes(), {}, NOW).actions == []


def test_results_before_the_last_resume_do_not_count_again():
    results = [res("n1", "fail", h) for h in (10, 9, 8)] + [res("n1", "fail", 1)]
    last = {"n1": handler.Record("resume", NOW - timedelta(hours=5))}
    assert handler.plan(cat(), results, nodes(), last, NOW).actions == []


def test_foreign_drain_and_down_nodes_are_never_touched():
    results = [res(n, "fail", h) for n in ("n1", "n2", "n5") for h in (1, 2, 3)]
    st = nodes(n1=("IDLE+DRAIN", "admin: maintenance [root@2025-06-01T10:00:00]"),
               n2=("DOWN*", "Not responding"))
    p = handler.plan(cat(), results, st, {}, NOW)
    acts = {a.node: a for a in p.actions}
    assert {n: a.action for n, a in acts.items()} == {"n1": "skip", "n2": "skip", "n5": "skip"}
    assert "someone else" in acts["n1"].note and "admin: maintenance" in acts["n1"].note
    assert acts["n5"].note == "not a node of this cluster"


def test_foreign_drain_is_not_resumed_even_with_passes():
    st = nodes(n1=("IDLE+DRAIN", "admin: maintenance"))
    last = {"n1": handler.Record("drain", NOW - timedelta(hours=3), "gpu-failing", "gpu")}
    p = handler.plan(cat(), [res("n1", "pass", h) for h in (1, 2)], st, last, NOW)
    assert p.actions == []


# --- recheck and resume -------------------------------------------------------------------

def _ours(state="IDLE+DRAIN"):
    return nodes(n1=(state, "hpcml: gpu failed 3x in 24 h [root@2025-06-01T09:00:00]"))


def test_resume_after_enough_passes_of_the_same_check():
    last = {"n1": handler.Record("drain", NOW - timedelta(hours=3), "gpu-failing", "gpu")}
    before = [res("n1", "fail", h) for h in (4, 5, 6)]
    one = handler.plan(cat(), before + [res("n1", "pass", 2)], _ours(), last, NOW)
    assert [(a.action, a.note) for a in one.actions] == [("hold", "gpu: 1/2 passes since the drain")]
    other = [res("n1", "pass", h, check="other") for h in (1, 2)]
    assert handler.plan(cat(), before + other + [res("n1", "pass", 2)], _ours(), last, NOW
                        ).actions[0].action == "hold"
    two = handler.plan(cat(), before + [res("n1", "pass", 2), res("n1", "pass", 1)],
                       _ours("DOWN+DRAIN"), last, NOW)
    a = two.actions[0]
    assert (a.action, a.rule, a.check) == ("resume", "gpu-failing", "gpu")
    assert a.evidence["passes"] == 2 and a.reason.startswith("hpcml:")


def test_a_failure_after_passes_restarts_the_count():
    last = {"n1": handler.Record("drain", NOW - timedelta(hours=5), "gpu-failing", "gpu")}
    results = [res("n1", "pass", 4), res("n1", "pass", 3), res("n1", "fail", 2), res("n1", "pass", 1)]
    assert handler.plan(cat(), results, _ours(), last, NOW).actions[0].action == "hold"


def test_no_record_or_no_resume_policy_holds():
    p = handler.plan(cat(), [], _ours(), {}, NOW)
    assert p.actions[0].action == "hold" and "neither the audit log nor the collector has a drain" in p.actions[0].note
    last = {"n1": handler.Record("drain", NOW - timedelta(minutes=30), "disk", "tmp-disk")}
    p = handler.plan(cat(), [res("n1", "pass", 0.1, check="tmp-disk", type_="disk")], _ours(), last, NOW)
    assert p.actions[0].action == "hold" and "no resume_after" in p.actions[0].note


def _prolog_drain(hours_ago: float, failed=("scratch",)) -> list:
    """A prolog's report that drained n1: its failing checks and its own drain result, one time."""
    at = NOW - timedelta(hours=hours_ago)
    return [Result("n1", c, "mounts", "fail", at, None) for c in failed] + \
        [Result("n1", "memory", "memory", "pass", at, None), Result("n1", "hpcml-drain", "drain", "fail", at, None)]


def test_a_node_the_prolog_drained_is_resumed_once_its_failed_checks_pass_twice():
    """No audit record (the prolog drained it, not the handler): its report in the collector
    says which checks failed; the health check on the drained node reports them passing."""
    st = _ours()
    drained = _prolog_drain(3)
    once = [res("n1", "pass", 2, check="scratch", type_="mounts")]
    p = handler.plan(cat(), drained + once, st, {}, NOW)
    assert (p.actions[0].action, p.actions[0].rule) == ("hold", "prolog") and "scratch: 1/2" in p.actions[0].note
    twice = once + [res("n1", "pass", 1, check="scratch", type_="mounts")]
    (a,) = handler.plan(cat(), drained + twice, st, {}, NOW).actions
    assert a.action == "resume" and a.reason.startswith("hpcml: scratch passed 2x after the prolog's drain")
    assert a.evidence["drained_by"] == "prolog" and a.evidence["passes"] == {"scratch": 2}
    # passed, then failed again (the prolog drained it again): the count starts over
    again = twice + _prolog_drain(0.5)
    assert handler.plan(cat(), again, st, {}, NOW).actions[0].action == "hold"
    # passes only a token backs (evidence none) do not resume what the node's own evidence drained
    weak = [Result("n1", "scratch", "mounts", "pass", NOW - timedelta(hours=h), None, evidence="none") for h in (2, 1)]
    assert handler.plan(cat(), drained + weak, st, {}, NOW).actions[0].action == "hold"
    # the handler resumed it after that drain: an old prolog drain cannot resume it again
    resumed = {"n1": handler.Record("resume", NOW - timedelta(minutes=30), "prolog", "scratch")}
    (a,) = handler.plan(cat(), drained + twice, st, resumed, NOW).actions
    assert a.action == "hold" and "neither the audit log nor the collector has a drain" in a.note
    # the handler drained it for a GPU check; the prolog drained it later for its scratch: the
    # GPU check's passes alone do not bring it back
    gpu = {"n1": handler.Record("drain", NOW - timedelta(hours=5), "gpu-failing", "gpu")}
    gpu_passes = [res("n1", "pass", h) for h in (2.5, 2, 1.5)]
    (a,) = handler.plan(cat(), drained + once + gpu_passes, st, gpu, NOW).actions
    assert a.action == "hold" and a.rule == "prolog", a
    # a person's drain is never touched, whatever passed
    person = nodes(n1=("IDLE+DRAIN", "admin: new DIMMs"))
    assert all(a.node != "n1" or a.action == "skip" for a in handler.plan(cat(), drained + twice, person, {}, NOW).actions)


def test_a_rule_drain_that_wants_a_person_is_not_resumed_by_the_health_check_s_passes():
    """hurts-jobs drained n1 (no resume_after: a person decides). The health check runs on
    the drained node, finds its scratch unmounted, leaves the drain as it is (no drain of its
    own, see drain_node), and later passes: the node stays held for the person."""
    rule_drain = {"n1": handler.Record("drain", NOW - timedelta(hours=5), "hurts-jobs", "@job")}
    at = NOW - timedelta(hours=3)
    found = [Result("n1", "scratch", "mounts", "fail", at, None)]          # the health check's report: no drain result
    passes = [res("n1", "pass", h, check="scratch", type_="mounts") for h in (2, 1)]
    (a,) = handler.plan(load(DEFAULT_RULES), found + passes, _ours(), rule_drain, NOW).actions
    assert a.action == "hold" and "resume it by hand" in a.note, a


def test_a_prolog_drained_node_whose_other_check_now_fails_is_held():
    """The prolog drained n1 for its scratch; while drained, the scratch came back but the
    memory check began to fail: not resumed."""
    drained = _prolog_drain(3)
    later = [res("n1", "pass", h, check="scratch", type_="mounts") for h in (2, 1)]
    later.append(res("n1", "fail", 0.5, check="memory", type_="memory"))
    (a,) = handler.plan(cat(), drained + later, _ours(), {}, NOW).actions
    assert a.action == "hold" and a.evidence["failing"] == ["memory"], a
    mended = later + [res("n1", "pass", 0.2, check="memory", type_="memory")]
    assert handler.plan(cat(), drained + mended, _ours(), {}, NOW).actions[0].action == "resume"
    # a check that failed (or could not finish) once, before the drained check's passes began,
    # and never ran again does not hold it for ever
    once = [res("n1", "error", 2.8, check="nccl-burnin", type_="collective"),
            res("n1", "fail", 2.7, check="memory", type_="memory")]
    assert handler.plan(cat(), drained + once + later[:2], _ours(), {}, NOW).actions[0].action == "resume"


def test_a_skipped_result_never_hides_a_check_s_last_failure_nor_counts_as_a_pass():
    """The prolog drained n1 for its scratch; since, the scratch passed twice, but the memory
    check failed and was then only skipped (a report that measured nothing of it): its last
    measurement is the failure, so n1 stays drained. A skipped scratch is no pass either."""
    drained = _prolog_drain(3)
    since = [res("n1", "pass", 2.5, check="scratch", type_="mounts"), res("n1", "fail", 2.5, check="memory", type_="memory"),
             res("n1", "skipped", 2, check="memory", type_="memory"),
             res("n1", "pass", 1.5, check="scratch", type_="mounts"), res("n1", "skipped", 1.5, check="memory", type_="memory")]
    (a,) = handler.plan(cat(), drained + since, _ours(), {}, NOW).actions
    assert (a.action, a.evidence.get("failing")) == ("hold", ["memory"]), a
    skipped = [res("n1", "pass", 2, check="scratch", type_="mounts"), res("n1", "skipped", 1, check="scratch", type_="mounts")]
    (a,) = handler.plan(cat(), drained + skipped, _ours(), {}, NOW).actions
    assert a.action == "hold" and "scratch: 0/2" in a.note, a


@pytest.mark.parametrize("after", ["skipped", "error"])
def test_a_failure_stands_while_the_check_only_skips_or_breaks_however_many_reports_follow(after):
    """The memory check failed after the prolog's drain and has since only been skipped (or
    broken: a sick node's checks time out). Two more reports whose scratch passed moved the
    passes' start past the failure, and n1 resumed (at once after an error): its memory's
    last measurement is still the failure. It stays drained while the check still reports."""
    drained = _prolog_drain(3)
    since = [res("n1", "pass", 2.5, check="scratch", type_="mounts"), res("n1", "fail", 2.5, check="memory", type_="memory")]
    for hours in (2, 1.5, 1, 0.5):
        since += [res("n1", "pass", hours, check="scratch", type_="mounts"),
                  res("n1", after, hours, check="memory", type_="memory")]
    (a,) = handler.plan(cat(), drained + since, _ours(), {}, NOW).actions
    assert (a.action, a.evidence.get("failing")) == ("hold", ["memory"]), a
    measured = since + [res("n1", "pass", 0.2, check="scratch", type_="mounts"), res("n1", "pass", 0.2, check="memory", type_="memory")]
    (a,) = handler.plan(cat(), drained + measured, _ours(), {}, NOW).actions
    assert a.action == "resume", a                  # measured again and passing: back


# --- the caps -----------------------------------------------------------------------------

def _drains(n):
    return [res(f"n{i}", "fail", h) for i in range(1, n + 1) for h in (1, 2, 3)]


def _capped(c, results, st, recent=frozenset()):
    p = handler.plan(c, results, st, {}, NOW)
    handler.cap(c, p, set(recent))
    return p


def test_cap_keeps_what_max_drain_fraction_allows_and_defers_the_rest():
    c = cat()  # 50% of 4 nodes: 2 drains in 24 h
    assert [a.action for a in _capped(c, _drains(2), nodes(4)).actions] == ["drain", "drain"]
    p = _capped(c, _drains(3), nodes(4))
    assert [(a.node, a.action) for a in p.actions] == [("n1", "drain"), ("n2", "drain"), ("n3", "defer")]
    deferred = p.of("defer")[0]
    assert deferred.status == "deferred" and "max_drain_fraction 50% of 4 nodes allows 2" in deferred.note
    assert "\n" not in deferred.note
    # two drained earlier in the window: nothing more now
    assert [a.action for a in _capped(c, _drains(1), nodes(4), {"n3", "n4"}).actions] == ["defer"]


def test_cap_min_nodes_kept_counts_nodes_already_out():
    c = cat()
    st = nodes(4, n3=("IDLE+DRAIN", "admin: x"), n4=("DOWN", "dead"))
    assert [a.action for a in _capped(c, _drains(1), st).actions] == ["drain"]  # leaves n2 up
    p = _capped(c, _drains(2), st)
    assert [(a.node, a.action) for a in p.actions] == [("n1", "drain"), ("n2", "defer")]
    assert "min_nodes_kept 1" in p.of("defer")[0].note


def test_weak_evidence_cannot_block_strong():
    """Over the cap, a node's own failing checks go before what jobs said of other nodes,
    and the catalog's order ranks rules (a site lists its critical ones first)."""
    c = cat(JOB_RULES.replace("50%", "25%"))         # 1 drain of 4 nodes
    jobs = [job_event("n1", "culprit", d, f"j{d}", user=u) for d, u in ((1, "a"), (2, "b"), (3, "a"))]
    failing = [res("n4", "fail", h) for h in (1, 2)]
    p = _capped(c, jobs + failing, nodes(4))
    assert {(a.node, a.action) for a in p.actions} == {("n4", "drain"), ("n1", "defer")}


# --- the whole run with fakes -------------------------------------------------------------

class FakeSlurm:
    def __init__(self, st):
        self.st, self.calls = st, []

    def states(self, name=None):
        return {k: v for k, v in self.st.items() if name is None or k == name}

    def update(self, names, **fields):
        self.calls.append((names, fields))
        for n in names:
            if fields["state"] == "drain":
                self.st[n] = NodeState(n, "IDLE+DRAIN", fields["reason"] + " [root@now]")
            else:
                self.st[n] = NodeState(n, "IDLE")


class ListSource:
    def __init__(self, results):
        self.results = results

    def results_since(self, since):
        reach = Reach.of(since)
        return [r for r in self.results if reach.wants(r.node, r.time, r.from_job)]


def _audit(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_handle_drains_then_resumes_and_audits(tmp_path):
    fake, audit = FakeSlurm(nodes(4)), tmp_path / "audit.jsonl"
    results = _drains(1)
    kw = dict(audit_path=audit, states=fake.states, update=fake.update)
    p = handler.handle(cat(), ListSource(results), now=NOW, **kw)
    assert [(a.action, a.status, a.scontrol) for a in p.actions] == [("drain", "done", "ok")]
    assert fake.calls == [(["n1"], {"state": "drain", "reason": "hpcml: gpu failed 3x in 24 h"})]
    # the next run changes nothing: the node is ours and not rechecked yet
    later = NOW + timedelta(minutes=1)
    assert handler.handle(cat(), ListSource(results), now=later, **kw).actions[0].action == "hold"
    results += [Result("n1", "gpu", "gpu", "pass", later + timedelta(minutes=i)) for i in (1, 2)]
    p = handler.handle(cat(), ListSource(results), now=later + timedelta(minutes=3), **kw)
    assert [(a.action, a.status) for a in p.actions] == [("resume", "done")]
    assert fake.st["n1"].state == "IDLE"
    # resumed: the old failures do not drain it again
    assert handler.handle(cat(), ListSource(results), now=later + timedelta(minutes=4), **kw).actions == []
    log = _audit(audit)
    assert [(e["node"], e["action"], e["dry_run"], e["scontrol"]) for e in log] == \
        [("n1", "drain", False, "ok"), ("n1", "resume", False, "ok")]
    assert log[0]["evidence"]["results"] == 3 and log[0]["rule"] == "gpu-failing"
    assert log[0]["state_before"] == "IDLE" and log[0]["rules"] == "r.yaml"


def test_dry_run_changes_nothing_but_audits(tmp_path):
    fake, audit = FakeSlurm(nodes(4)), tmp_path / "audit.jsonl"
    p = handler.handle(cat(), ListSource(_drains(1)), now=NOW, audit_path=audit, dry_run=True,
                       states=fake.states, update=fake.update)
    assert p.actions[0].status == "dry-run" and fake.calls == []
    assert [(e["action"], e["dry_run"], e["status"]) for e in _audit(audit)] == [("drain", True, "dry-run")]
    assert handler.history(audit.read_text().splitlines()) == {}  # dry runs are no history


def test_deferred_drains_are_done_up_to_the_cap_and_audited(tmp_path):
    fake, audit = FakeSlurm(nodes(4)), tmp_path / "audit.jsonl"
    p = handler.handle(cat(), ListSource(_drains(3)), now=NOW, audit_path=audit,
                       states=fake.states, update=fake.update)
    assert [c[0] for c in fake.calls] == [["n1"], ["n2"]]
    assert sorted((e["node"], e["action"], e["status"]) for e in _audit(audit)) == \
        [("n1", "drain", "done"), ("n2", "drain", "done"), ("n3", "defer", "deferred")]
    assert [a.node for a in p.of("defer")] == ["n3"]


def test_the_cap_holds_over_its_window_across_handler_runs(tmp_path):
    """Three handler runs an hour apart, each with new failing nodes: the cap counts the
    drains of the earlier runs (from the audit log), even of nodes resumed since."""
    fake, audit = FakeSlurm(nodes(10)), tmp_path / "audit.jsonl"
    c = cat(RULES.replace("50%", "20%"))                  # 2 of 10 nodes in 24 h
    kw = dict(audit_path=audit, states=fake.states, update=fake.update)
    for hour, node in enumerate(("n1", "n2", "n3")):
        when = NOW + timedelta(hours=hour)
        fails = [Result(node, "gpu", "gpu", "fail", when - timedelta(minutes=m)) for m in (1, 2, 3)]
        handler.handle(c, ListSource(fails), now=when, **kw)
        fake.st[node] = NodeState(node, "IDLE") if node == "n1" else fake.st[node]   # n1 repaired by hand
    assert [c_[0] for c_ in fake.calls] == [["n1"], ["n2"]]
    assert [(e["node"], e["action"]) for e in _audit(audit)][-1] == ("n3", "defer")
    later = NOW + timedelta(hours=26)                      # the window has moved on
    fails = [Result("n3", "gpu", "gpu", "fail", later - timedelta(minutes=m)) for m in (1, 2, 3)]
    handler.handle(c, ListSource(fails), now=later, **kw)
    assert fake.calls[-1][0] == ["n3"]


def test_node_drained_by_someone_between_plan_and_act_is_skipped(tmp_path):
    fake = FakeSlurm(nodes(4))

    def racing(name=None):
        if name == "n1":
            fake.st["n1"] = NodeState("n1", "IDLE+DRAIN", "admin: now")
        return fake.states(name)

    p = handler.handle(cat(), ListSource(_drains(1)), now=NOW, audit_path=tmp_path / "a",
                       states=racing, update=fake.update)
    assert p.actions[0].action == "skip" and fake.calls == []


def test_scontrol_failure_is_recorded(tmp_path):
    fake = FakeSlurm(nodes(4))

    def broken(names, **fields):
        raise SlurmError("scontrol update: exit 1: Invalid node name")

    p = handler.handle(cat(), ListSource(_drains(1)), now=NOW, audit_path=tmp_path / "a",
                       states=fake.states, update=broken)
    assert p.actions[0].status == "failed"
    entry = _audit(tmp_path / "a")[0]
    assert entry["status"] == "failed" and "Invalid node name" in entry["scontrol"]
    assert handler.history([json.dumps(entry)]) == {}


def test_audit_log_is_locked_against_a_second_handler(tmp_path):
    with handler.audit_log(tmp_path / "a"):
        with pytest.raises(UsageError, match="another hpcml centre handle"):
            with handler.audit_log(tmp_path / "a"):
                pass


# --- report files -------------------------------------------------------------------------

def _report(started_at, node_results, job="42"):
    return vet_report(node_results, started_at=started_at, job_id=job)


def test_json_dir_source_reads_reports(tmp_path):
    t = NOW.timestamp()
    for i, when in enumerate((t - 7200, t - 60)):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "report.json").write_text(json.dumps(_report(when, {"n1": [("gpu", "gpu", "fail")],
                                                                  "n2": None})))
    got = list(JsonDirSource([tmp_path]).results_since(NOW - timedelta(hours=1)))
    assert sorted((r.node, r.check, r.outcome) for r in got) == \
        [("n1", "gpu", "fail"), ("n2", "unreachable", "error")]
    assert got[0].time == NOW - timedelta(seconds=60) and got[0].job == "42"


def test_report_files_count_only_as_their_owner_proves_them(tmp_path):
    """``hpcml centre handle --results DIR`` on a shared drop directory (1777, as a help text
    example invites): three report files written by another user (``nobody``) failing n7's GPU
    check are that user's say-so, counted for nothing; root's own file with a result filed
    under n1 that names n7 counts only as n1's, and n7 gets nothing from it. Nothing is
    drained (was: n7 drained on node evidence)."""
    import os
    import pwd
    nobody = pwd.getpwnam("nobody").pw_uid
    shared = tmp_path / "vet-reports"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    t = NOW.timestamp()
    for i in range(3):
        f = shared / f"u{i}" / "report.json"
        f.parent.mkdir()
        f.write_text(json.dumps(_report(t - 60 * (i + 1), {"n7": [("gpu", "gpu", "fail")]}, job=str(50 + i))))
        os.chown(f, nobody, -1)
    moved = _report(t - 30, {"n1": [("gpu", "gpu", "fail")]}, job="60")
    moved["nodes"]["n1"]["results"][0]["node"] = "n7"
    (shared / "root" / "report.json").parent.mkdir()
    (shared / "root" / "report.json").write_text(json.dumps(moved))
    got = list(JsonDirSource([shared]).results_since(NOW - timedelta(hours=1)))
    assert sorted((r.node, r.evidence) for r in got) == [("n7", "none")] * 3
    assert handler.plan(load(DEFAULT_RULES), got, nodes(8), {}, NOW).actions == []
    os.chmod(shared / "u0" / "report.json", 0o644)
    os.chown(shared / "u0" / "report.json", 0, -1)       # root's file: the node's evidence ...
    os.chmod(shared / "u1" / "report.json", 0o666)       # ... but not one anyone may rewrite
    os.chown(shared / "u1" / "report.json", 0, -1)
    got = list(JsonDirSource([shared]).results_since(NOW - timedelta(hours=1)))
    assert sorted((r.job, r.evidence) for r in got) == [("50", "node"), ("51", "none"), ("52", "none")]


@pytest.mark.parametrize("content,problem", [("{", "cannot read results"),
                                             ('{"schema": "x"}', "not an hpcml.vet document"),
                                             ('{"nodes": {}}', "no schema tag"),
                                             ('{"schema": "hpcml.vet/2"}', r"newer hpcml \(schema hpcml.vet/2\)"),
                                             ('{"schema": "hpcml.vet/1"}', "protocol: Field required")])
def test_json_dir_source_bad_files(tmp_path, content, problem):
    (tmp_path / "report.json").write_text(content)
    with pytest.raises(UsageError, match=problem) as info:
        list(JsonDirSource([tmp_path]).results_since(NOW))
    assert str(tmp_path / "report.json") in str(info.value)
    with pytest.raises(UsageError, match="no such file"):
        list(JsonDirSource([tmp_path / "nope"]).results_since(NOW))


# --- command line -------------------------------------------------------------------------

def _app():
    from hpcml.centre.cli import app  # `rules` is the command that validates a catalog
    return app


def test_cli_validate_and_input_errors(tmp_path):
    from typer.testing import CliRunner
    run = CliRunner().invoke
    ok = run(_app(), ["rules", str(DEFAULT_RULES)])
    assert ok.exit_code == 0 and "valid rules catalog 'default-node-rules'" in ok.output
    (tmp_path / "bad.yaml").write_text("name: x\nrules:\n  - {name: a, count: 1, window: soon}\n")
    bad = run(_app(), ["rules", str(tmp_path / "bad.yaml")])
    assert bad.exit_code == 2 and "bad.yaml:3: key 'rules[0].window'" in bad.output
    neither = run(_app(), ["handle", "--audit", str(tmp_path / "a")])
    assert neither.exit_code == 2 and "either --results" in neither.output
    rules_bad = run(_app(), ["handle", "--rules", str(tmp_path / "bad.yaml"), "--results", str(tmp_path)])
    assert rules_bad.exit_code == 2 and not (tmp_path / "a").exists()


def test_cli_human_table_and_dry_run(tmp_path, monkeypatch):
    from typer.testing import CliRunner
    fake = FakeSlurm(nodes(4, n2=("IDLE+DRAIN", "admin: x [root@2025-06-01T10:00:00]")))
    monkeypatch.setattr(handler, "read_node_states", fake.states)
    monkeypatch.setattr(handler.slurm, "scontrol_update_node", fake.update)
    t = datetime.now(timezone.utc).timestamp()
    for i in range(3):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "report.json").write_text(json.dumps(
            _report(t - i, {"n1": [("gpu", "gpu", "fail")], "n2": [("gpu", "gpu", "fail")]})))
    (tmp_path / "rules.yaml").write_text(RULES)
    args = ["handle", "--rules", str(tmp_path / "rules.yaml"), "--results", str(tmp_path),
            "--audit", str(tmp_path / "audit.jsonl")]
    out = CliRunner().invoke(_app(), args + ["--dry-run"])
    assert out.exit_code == 0, out.output
    assert "hpcml centre handle (dry run)" in out.output and "drain" in out.output and "someone else" in out.output
    assert fake.calls == []
    out = CliRunner().invoke(_app(), args)
    assert out.exit_code == 0 and fake.st["n1"].ours and fake.st["n2"].reason.startswith("admin: x")


def test_store_source_reads_the_collectors_sqlite_store(tmp_path):
    """Reports stored by the collector come back as the handler's results, by time."""
    import json

    from hpcml.centre.collector.schema import parse
    from hpcml.centre.collector.store import open_store
    from hpcml.centre.sources import StoreSource
    url = f"sqlite:///{tmp_path / 'c.db'}"
    store = open_store(url)
    old, new = (NOW - timedelta(hours=3)).timestamp(), NOW.timestamp()
    body = [{"job_id": "7", "node": "n1", "time": t, "verdict": "bad",
             "results": [{"name": "gpu", "type": "gpu", "outcome": outcome}]}
            for t, outcome in ((old, "fail"), (new, "error"))]
    reports = parse(json.dumps(body).encode())
    reports[1].proven("node", "root")
    store.add(reports)
    store.close()
    got = list(StoreSource(url).results_since(NOW - timedelta(hours=1)))
    assert got == [Result("n1", "gpu", "gpu", "error", NOW, "7", evidence="node")]


# --- job outcomes (hpcml run's summaries in the collector) --------------------------------

JOB_RULES = """\
name: jobs
max_drain_fraction: 50%
rules:
  - name: hurts-jobs
    match: {job: [straggler, culprit], users: 2}
    count: 3
    window: 7 d
    reason: "hpcml: straggler or hang culprit in {count} jobs in {window}"
  - name: any-failure
    match: {check: "*"}
    count: 2
    window: 7 d
"""


def job_event(node, role, days_ago, job, user=None):
    return Result(node, JOB_CHECK, role, "fail", NOW - timedelta(days=days_ago), job, from_job=True,
                  user=user or f"user-of-{job}", evidence="job")


def test_a_node_named_in_three_jobs_in_a_week_is_drained_and_each_job_counts_once():
    events = [job_event("n1", "straggler", 1, "a"), job_event("n1", "culprit", 2, "b"),
              job_event("n1", "straggler", 6, "c"),
              job_event("n2", "straggler", 1, "a"), job_event("n2", "culprit", 1, "a"),   # one job, twice
              job_event("n2", "straggler", 2, "b"), job_event("n2", "straggler", 9, "c"),  # out of the week
              job_event("n3", "excluded", 1, "a"), job_event("n3", "lost", 2, "b"),        # other roles
              job_event("n3", "excluded", 3, "c")]
    p = handler.plan(cat(JOB_RULES), events, nodes(), {}, NOW)
    assert [(a.node, a.action, a.rule) for a in p.actions] == [("n1", "drain", "hurts-jobs")]
    a = p.actions[0]
    assert a.reason == "hpcml: straggler or hang culprit in 3 jobs in 7 d"
    assert a.evidence["jobs"] == ["a", "b", "c"] and a.evidence["results"] == 3


def test_vetting_rules_do_not_count_job_events_and_job_rules_do_not_count_results():
    only_jobs = [job_event("n1", "straggler", d, str(d)) for d in (1, 2)]
    assert handler.plan(cat(JOB_RULES), only_jobs, nodes(), {}, NOW).actions == []    # 'any-failure' ignores them
    # a site's check named like a job event, whose type is a role, is a vetting result, never a job
    results = [res("n1", "fail", h, check=JOB_CHECK, type_="straggler", job=str(h)) for h in (1, 2, 3)]
    assert [a.rule for a in handler.plan(cat(JOB_RULES), results, nodes(), {}, NOW).actions] == ["any-failure"]


def test_one_user_alone_never_drains_a_node_through_a_job_rule():
    """Summaries are what their sender says: three jobs of one user name n1 (a fabricated
    summary, or that user's own bug); with ``users: 2`` nothing happens until a second
    user's job names it too."""
    mine = [job_event("n1", "culprit", d, f"j{d}", user="mallory") for d in (1, 2, 3)]
    assert handler.plan(cat(JOB_RULES), mine, nodes(), {}, NOW).actions == []
    theirs = mine + [job_event("n1", "straggler", 1, "k1", user="alice")]
    (a,) = handler.plan(cat(JOB_RULES), theirs, nodes(), {}, NOW).actions
    assert (a.node, a.action, a.evidence["users"]) == ("n1", "drain", 2)


def _evidenced(node, outcome, hours_ago, evidence, user=None, job="1", check="gpu"):
    return Result(node, check, "gpu", outcome, NOW - timedelta(hours=hours_ago), job, user=user, evidence=evidence)


def test_reports_only_a_token_backs_never_drain_and_never_spend_the_budget():
    """Three failures of n1 whose reports only the write token backed (any user can send
    them): nothing is planned, so nothing is drained and no drain is deferred for them."""
    forged = [_evidenced("n1", "fail", h, "none") for h in (1, 2, 3)]
    assert handler.plan(cat(RULES), forged, nodes(), {}, NOW).actions == []
    real = [_evidenced("n2", "fail", h, "node") for h in (1, 2, 3)]
    (a,) = handler.plan(cat(RULES), forged + real, nodes(), {}, NOW).actions
    assert (a.node, a.action, a.evidence["strength"]) == ("n2", "drain", "node")


def test_users_reports_count_by_people_and_only_where_the_rule_says_so():
    """A user's proven report of their own job is job evidence: a check rule takes it only
    with ``match.users``, from that many users (one user's reports never drain alone)."""
    mallory = [_evidenced("n1", "fail", h, "job", user="mallory", job=f"j{h}") for h in (1, 2, 3)]
    assert handler.plan(cat(RULES), mallory, nodes(), {}, NOW).actions == []
    two = RULES.replace("match: {type: gpu}", "match: {type: gpu, users: 2}")
    assert handler.plan(loads(two, "r.yaml"), mallory, nodes(), {}, NOW).actions == []
    both = mallory + [_evidenced("n1", "fail", 1, "job", user="alice", job="k1")]
    (a,) = handler.plan(loads(two, "r.yaml"), both, nodes(), {}, NOW).actions
    assert (a.node, a.action, a.evidence["strength"]) == ("n1", "drain", "job")


def test_a_resume_needs_evidence_as_strong_as_the_drain():
    """n1 was drained on its own checks (node evidence): passes from token-only or users'
    reports do not resume it; the node's own passes do."""
    when = NOW - timedelta(hours=5)
    last = {"n1": handler.Record("drain", when, "gpu-failing", "gpu", "node")}
    drained = nodes(n1=("DRAIN", "hpcml: gpu fail 3x in 24 h"))
    weak = [_evidenced("n1", "pass", h, ev, user="mallory") for h in (1, 2, 3) for ev in ("none", "job")]
    (a,) = handler.plan(cat(RULES), weak, drained, last, NOW).actions
    assert a.action == "hold", a
    strong = weak + [_evidenced("n1", "pass", h, "node") for h in (0.5, 0.4, 0.3)]
    (a,) = handler.plan(cat(RULES), strong, drained, last, NOW).actions
    assert a.action == "resume", a


def test_a_drain_users_made_is_undone_by_as_many_users_not_one():
    """alice and bob (``users: 2``) drained n1 on their jobs' reports; mallory's job, still
    running on the drained node, reports passes: one user does not undo what two made. A
    second user's passes (or the node's own) do."""
    two = loads(RULES.replace("match: {type: gpu}", "match: {type: gpu, users: 2}"), "r.yaml")
    when = NOW - timedelta(hours=5)
    last = {"n1": handler.Record("drain", when, "gpu-failing", "gpu", "job")}
    drained = nodes(n1=("DRAIN", "hpcml: gpu fail 3x in 24 h"))
    mallory = [_evidenced("n1", "pass", h, "job", user="mallory", job=f"m{h}") for h in (3, 2, 1)]
    (a,) = handler.plan(two, mallory, drained, last, NOW).actions
    assert (a.action, a.evidence["users"]) == ("hold", 1), a
    both = mallory + [_evidenced("n1", "pass", 0.5, "job", user="alice", job="a1")]
    (a,) = handler.plan(two, both, drained, last, NOW).actions
    assert a.action == "resume", a
    own = mallory + [_evidenced("n1", "pass", 0.5, "node")]
    (a,) = handler.plan(two, own, drained, last, NOW).actions
    assert a.action == "resume", a


def test_a_job_rule_cannot_resume_by_passes():
    text = JOB_RULES.replace('    reason: "hpcml: straggler', "    resume_after: {passes: 1}\n    reason: \"hpcml: straggler")
    with pytest.raises(UsageError, match="resume_after: a rule on job outcomes"):
        loads(text, "r.yaml")
    with pytest.raises(UsageError, match="job"):
        loads(JOB_RULES.replace("[straggler, culprit]", "[slowpoke]"), "r.yaml")


def test_the_default_catalog_drains_on_job_summaries_from_the_collector(tmp_path):
    """Summaries in a real store, read by the handler's StoreSource, through the default rules."""
    import time as _time

    from hpcml.centre.collector.store import open_store
    from hpcml.centre.sources import StoreSource
    from hpcml.centre.summaries import Proven
    from hpcml.centre.summaries import Received as JobSummary
    from tests.centre.jobdocs import event, summary
    url = f"sqlite:///{tmp_path}/c.db"
    store = open_store(url)
    now = _time.time()
    docs = [JobSummary.model_validate(summary(str(j), ended=now - 3600 * j, nodes=["n1", "n2"],
                                              user=f"u{j % 2}", stragglers=[event("n2", 1)] if j < 3 else [],
                                              culprits=[event("n2", 0)] if j == 3 else [event("n1", 0)] if j == 5
                                              else [], excluded=[event("n1", 0)]))
            for j in range(6)]
    for j, d in enumerate(docs[:5]):      # what the collector proved of each sender
        d.proven(Proven(how="munge", user=f"u{j % 2}", uid=1000 + j % 2, verified=True))
    store.add_jobs(docs)                  # job 5 names n1 a culprit, unproven: it never counts
    store.close()
    results = list(StoreSource(url).results_since(datetime.now(timezone.utc) - timedelta(days=8)))
    assert {(r.node, r.type, r.from_job) for r in results} == {("n2", "straggler", True), ("n2", "culprit", True),
                                                               ("n1", "excluded", True)}
    assert {r.user for r in results} == {"uid:1000", "uid:1001"}
    p = handler.plan(load(DEFAULT_RULES), results, nodes(), {}, datetime.now(timezone.utc))
    assert [(a.node, a.action, a.rule) for a in p.actions] == [("n2", "drain", "hurts-jobs")]
    assert a_reason_names_jobs(p.actions[0].reason)


def a_reason_names_jobs(reason: str) -> bool:
    return reason.startswith("hpcml:") and "4 jobs in 7 d" in reason


def test_a_naive_time_in_the_audit_log_is_utc_not_a_crash(tmp_path):
    audit = tmp_path / "audit.jsonl"
    audit.write_text(json.dumps({"time": (NOW - timedelta(hours=1)).replace(tzinfo=None).isoformat(), "node": "n1",
                                 "action": "drain", "status": "done", "dry_run": False}) + "\n")
    fake = FakeSlurm(nodes(4))
    p = handler.handle(cat(), ListSource(_drains(3)[3:]), now=NOW, audit_path=audit, states=fake.states,
                       update=fake.update)
    assert [(a.node, a.action) for a in p.actions] == [("n2", "drain"), ("n3", "defer")]   # n1's drain counts
    assert handler.drained_since(audit.read_text().splitlines(), NOW - timedelta(hours=2)) == {"n1", "n2"}


def test_a_run_reads_each_kind_for_its_rules_window_and_a_drained_node_since_its_drain(tmp_path):
    """The default rules count check results over at most 24 h and job events over 7 d: a run
    reads the store that far back, except for a node drained by us, whose passes since its
    drain (10 days ago here) are read and resume it. Another node's results from before the
    window are not read (the handler of a fleet with one node drained for weeks read weeks
    of every node's results at every run)."""
    import json
    import time as _time

    from hpcml.centre.collector.schema import parse
    from hpcml.centre.collector.store import open_store
    from hpcml.centre.sources import StoreSource
    from hpcml.centre.summaries import Proven
    from hpcml.centre.summaries import Received as JobSummary
    from tests.centre.jobdocs import event, summary
    now = datetime.fromtimestamp(int(_time.time()), timezone.utc)
    day = 86400
    url = f"sqlite:///{tmp_path}/c.db"
    store = open_store(url)
    body = [{"node": node, "time": (now - timedelta(seconds=ago)).timestamp(), "verdict": "good" if ok else "bad",
             "results": [{"name": "gpu-count", "type": "gpu", "outcome": "pass" if ok else "fail"}]}
            for node, ago, ok in (("n1", 9 * day, True), ("n1", 5 * day, True), ("n2", 3 * day, False),
                                  ("n2", 2 * day, False), ("n2", 3600, True))]
    reports = parse(json.dumps(body).encode())
    for r in reports:
        r.proven("node", "root")
    store.add(reports)
    doc = JobSummary.model_validate(summary("7", ended=(now - timedelta(days=3)).timestamp(), nodes=["n3"],
                                            user="u0", stragglers=[event("n3", 0)]))
    doc.proven(Proven(how="munge", user="u0", uid=1000, verified=True))
    store.add_jobs([doc])
    store.close()
    catalog = load(DEFAULT_RULES)
    states = nodes(3, n1=("IDLE+DRAIN", "hpcml: gpu-count fail 3x in 24 h"))
    last = {"n1": handler.Record("drain", now - timedelta(days=10), "gpu-failing", "gpu-count")}
    reach = handler.reach(catalog, states, last, now)
    got = list(StoreSource(url).results_since(reach))
    assert sorted((r.node, r.outcome, round((now - r.time).total_seconds() / day)) for r in got) == \
        [("n1", "pass", 5), ("n1", "pass", 9), ("n2", "pass", 0), ("n3", "fail", 3)]
    assert [r.type for r in got if r.from_job] == ["straggler"]
    p = handler.plan(catalog, got, states, last, now)
    assert [(a.node, a.action) for a in p.actions] == [("n1", "resume")]


def test_a_node_the_prolog_drained_a_day_ago_without_an_audit_record_still_resumes(tmp_path):
    """The prolog drained n2 30 h ago (its report holds the drain; the handler's audit log
    has no record of it) and its scratch check passed twice since: the run reads back as far
    as any rule does for a node of ours it has no record of, finds the drain, resumes it
    (reading check results over the check rules' 24 h alone, it held the node for good)."""
    import time as _time

    from hpcml.centre.collector.schema import CheckResult, NodeReport
    from hpcml.centre.collector.store import open_store
    from hpcml.centre.sources import StoreSource
    url = f"sqlite:///{tmp_path}/c.db"
    store = open_store(url)
    now, hour = _time.time(), 3600

    def report(t, *results):
        r = NodeReport(node="n2", time=t, protocol="p", job_id=None,
                       verdict="bad" if any(o == "fail" for *_, o in results) else "good",
                       results=[CheckResult(name=n, type=ty, outcome=o) for n, ty, o in results])
        r.proven("node", "root")
        return r
    store.add([report(now - 30 * hour, ("scratch", "mounts", "fail"), ("hpcml-drain", "drain", "fail")),
               report(now - 20 * hour, ("scratch", "mounts", "pass")), report(now - 10 * hour, ("scratch", "mounts", "pass"))])
    store.close()
    states = {"n1": NodeState("n1", "IDLE"), "n2": NodeState("n2", "DRAIN", "hpcml: drained by prolog: scratch")}
    p = handler.handle(load(DEFAULT_RULES), StoreSource(url), audit_path=tmp_path / "audit.jsonl", dry_run=True,
                       now=datetime.fromtimestamp(now, timezone.utc), states=lambda *a: states,
                       update=lambda *a, **k: None)
    assert [(a.node, a.action) for a in p.actions] == [("n2", "resume")], [(a.node, a.note) for a in p.actions]
