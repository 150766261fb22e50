from hpcml.vet import relative, verdict
from hpcml.vet.model import CheckResult, Decision, NodeReport, Outcome


def _rep(node, *outcomes, reachable=True):
    return NodeReport(node=node, reachable=reachable, results=[
        CheckResult(node=node, check=f"c{i}", type="t", outcome=o) for i, o in enumerate(outcomes)])


def _decide(reports, min_nodes=None, count_errors=None):
    return verdict.decide([r.node for r in reports], {r.node: r for r in reports},
                          count_errors or {}, min_nodes)


def test_all_good_continues():
    v = _decide([_rep("n1", Outcome.PASS, Outcome.WARN, Outcome.SKIPPED), _rep("n2", Outcome.PASS)])
    assert v.decision is Decision.CONTINUE and v.exit_code == 0 and v.bad == []


def test_one_failed_node_shrinks_when_enough_remain():
    v = _decide([_rep("n1", Outcome.PASS), _rep("n2", Outcome.FAIL)], min_nodes=1)
    assert v.decision is Decision.SHRINK and v.bad == ["n2"] and v.good == ["n1"] and v.exit_code == 3


def test_default_min_nodes_is_the_whole_allocation():
    v = _decide([_rep("n1", Outcome.PASS), _rep("n2", Outcome.FAIL)])
    assert v.decision is Decision.ABORT and v.min_nodes == 2 and v.exit_code == 4


def test_error_counts_against_the_node_unless_opted_out():
    reps = [_rep("n1", Outcome.PASS), _rep("n2", Outcome.ERROR)]
    assert _decide(reps, 1).bad == ["n2"]
    assert _decide(reps, 1, {"c0": False}).decision is Decision.CONTINUE


def test_unreachable_is_bad_and_all_bad_aborts():
    v = _decide([_rep("n1", reachable=False), _rep("n2", Outcome.FAIL)], min_nodes=1)
    assert v.decision is Decision.ABORT and v.good == [] and "unreachable" in v.reasons["n1"][0]


def test_missing_report_is_unreachable():
    v = verdict.decide(["n1", "n2"], {"n1": _rep("n1", Outcome.PASS)}, {}, 1)
    assert v.bad == ["n2"] and v.decision is Decision.SHRINK


def _vals(**values):
    return {n: CheckResult(node=n, check="g", type="t", outcome=Outcome.PASS, value=v)
            for n, v in values.items()}


def test_relative_min_catches_the_slow_node():
    res = _vals(n1=100.0, n2=98.0, n3=60.0)
    relative.apply(res, 0.8, None)
    assert [n for n, r in res.items() if r.outcome is Outcome.FAIL] == ["n3"]
    assert res["n3"].details["relative_to_others"] == round(60 / 99, 4)


def test_relative_with_two_nodes_compares_with_the_other():
    res = _vals(n1=100.0, n2=70.0)
    relative.apply(res, 0.8, None, severity="warn")
    assert res["n2"].outcome is Outcome.WARN and res["n1"].outcome is Outcome.PASS


def test_relative_max_and_single_node():
    res = _vals(n1=1.0, n2=1.1, n3=5.0)
    relative.apply(res, None, 2.0)
    assert res["n3"].outcome is Outcome.FAIL and res["n2"].outcome is Outcome.PASS
    one = _vals(n1=1.0)
    relative.apply(one, 0.9, None)
    assert one["n1"].outcome is Outcome.PASS


def test_relative_limit_not_judged_is_said_not_passed_silently():
    """Alone, or against a median of 0, the relative limit cannot be judged: the pass is the
    absolute limits' only, and the result says so."""
    one = _vals(n1=61.3)
    one["n1"].message = "256x256 float64 on cpu: 61.3 GFLOP/s"
    relative.apply(one, 0.5, None)
    assert one["n1"].outcome is Outcome.PASS and one["n1"].details["relative_to_others"] is None
    assert one["n1"].message == ("256x256 float64 on cpu: 61.3 GFLOP/s; not compared with the other nodes "
                                 "(no other node's value)")
    zero = _vals(n1=5.0, n2=0.0, n3=0.0)
    relative.apply(zero, 0.5, None)
    assert zero["n1"].message == "not compared with the other nodes (the other nodes' median is 0)"
    assert zero["n1"].details["relative_to_others"] is None
