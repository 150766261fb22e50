"""The job report's terminal lines: what was not measured is said, never printed as a
number or as Python's ``None``."""

from __future__ import annotations

from hpcml.run.report import _share, finding_line


def test_a_gpu_score_part_not_measured_reads_no_data_not_none():
    """The interconnect part of a GPU hpcml has no peak for is NaN (None in JSON): "no
    data", as ``hpcml score`` prints it (was: "interconnect None")."""
    assert [_share(v) for v in (0.41, None, float("nan"))] == ["0.41", "no data", "no data"]


def test_a_finding_the_ledger_could_not_price_has_no_cost():
    f = {"source": "run", "kind": "failed_rank", "message": "rank 1 failed", "advice": "see its log"}
    assert finding_line(f) == "→ [run] rank 1 failed  (see its log)"
    assert finding_line({**f, "cost_s": 12.4}).startswith("→ [run] rank 1 failed [cost 12 s]")
