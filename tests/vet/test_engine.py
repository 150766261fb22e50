from hpcml.vet.engine import _starved
from hpcml.vet.model import CheckResult, NodeReport, Outcome


def _report(node: str, starved: bool) -> NodeReport:
    details = {"starved": starved, "cpu_s": 0.1, "cpu_wait_s": 4.0 if starved else 0.0}
    return NodeReport(node=node, results=[CheckResult(node=node, check="memory", type="memory",
                                                      outcome=Outcome.ERROR, details=details)])


def test_a_note_names_the_nodes_whose_checks_starved_for_cpu():
    notes = _starved({"n1": _report("n1", True), "n2": _report("n2", False), "n3": _report("n3", True)})
    assert len(notes) == 1 and notes[0].startswith("2 checks on 2 nodes (n[1,3]) timed out waiting for a CPU")


def test_no_note_when_no_check_starved():
    assert _starved({"n1": _report("n1", False)}) == []
