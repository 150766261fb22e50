"""How a search's outcome lands in the run's results, without Slurm: the srun measurement is
replaced by a simulated fabric (group speed = its slowest member)."""

from __future__ import annotations

import pytest

from hpcml.vet import culprit_run
from hpcml.vet.model import CheckResult, NodeReport, Outcome
from hpcml.vet.protocol import loads

PROTO = """name: p
evals:
  - {name: ar, type: collective, min_bandwidth: 1 GB/s}
"""


def _reports(nodes, outcome=Outcome.FAIL):
    return {n: NodeReport(node=n, results=[CheckResult(
        node=n, check="ar", type="collective", outcome=outcome, value=0.1, unit="GB/s",
        message="allreduce: busbw 100 MB/s")]) for n in nodes}


@pytest.fixture
def fabric(monkeypatch):
    slow = set()

    class Fake:
        def __init__(self, *a, **kw):
            pass

        def __call__(self, groups):
            return {i: min(1e8 if n in slow else 1e10 for n in g) for i, g in enumerate(groups)}

    monkeypatch.setattr(culprit_run, "SrunMeasure", Fake)
    return slow


def test_culprit_fails_the_others_pass(fabric, tmp_path):
    nodes = [f"n{i}" for i in range(1, 9)]
    fabric.add("n6")
    reports = _reports(nodes)
    notes = culprit_run.find_culprits(loads(PROTO).evals, nodes, reports, 1e12,
                                      str(tmp_path), True, "python")
    assert len(notes) == 1 and "culprit n6 (2 rounds, 6 tests" in notes[0]
    for n, rep in reports.items():
        r = rep.results[0]
        if n == "n6":
            assert r.outcome is Outcome.FAIL
            assert r.message.startswith("culprit: slow in 2 group tests (rounds 2, ")
        else:
            assert r.outcome is Outcome.PASS and "held back by n6" in r.message


def test_fabric_wide_leaves_every_node_failed(fabric, tmp_path):
    nodes = ["a", "b", "c", "d"]
    fabric.update(nodes)
    reports = _reports(nodes)
    notes = culprit_run.find_culprits(loads(PROTO).evals, nodes, reports, 1e12,
                                      str(tmp_path), True, "python")
    assert "fabric-wide" in notes[0]
    assert all(rep.results[0].outcome is Outcome.FAIL for rep in reports.values())


def test_no_search_when_passing_disabled_or_outside_srun(fabric, tmp_path):
    nodes = ["a", "b"]
    evals = loads(PROTO).evals
    assert culprit_run.find_culprits(evals, nodes, _reports(nodes, Outcome.PASS), 1e12,
                                     str(tmp_path), True, "python") == []
    off = loads(PROTO.replace("1 GB/s}", "1 GB/s, culprit_search: false}")).evals
    assert culprit_run.find_culprits(off, nodes, _reports(nodes), 1e12, str(tmp_path),
                                     True, "python") == []
    assert culprit_run.find_culprits(evals, nodes, _reports(nodes), 1e12, str(tmp_path),
                                     False, "python") == ["ar: no culprit search outside srun"]


def test_rank_zero_line_to_bandwidth():
    line = culprit_run._MARK + '{"outcome": "fail", "value": 0.25, "message": ""}'
    assert culprit_run._bandwidth("noise\n" + line + "\n") == 0.25e9
    assert culprit_run._bandwidth(culprit_run._MARK + '{"outcome": "error", "value": null}') is None
    assert culprit_run._bandwidth("") is None
