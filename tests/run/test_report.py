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


def test_a_contended_rank_named_by_its_arrivals_is_not_given_a_ratio_or_a_step_nobody_measured(tmp_path):
    """The Flight Recorder's arrivals named rank 3, then its GPU's throttling explained it:
    no step ratio and no step measured it, so the finding says what did (was: "1.0x slower
    than the others from step 0 or earlier")."""
    from hpcml.run.report import _watch_findings
    st = {"rank": 3, "node": "n2", "score": 1.0, "since_step": 0, "since_before": True, "detected": 1.0,
          "measure": "arrivals", "gpu_throttled": 0.64, "gpu_throttle": ["hw_thermal_slowdown"]}
    (f,) = _watch_findings({"hang": None, "stragglers": [], "contended": [st]}, tmp_path, 0)
    assert f["message"].startswith("rank 3 on n2 was the last to start most collectives (Flight Recorder arrivals) "
                                   "while its GPU's clocks were held back 64%"), f["message"]
    assert "1.0x" not in f["message"] and "step 0" not in f["message"]
    (g,) = _watch_findings({"hang": None, "stragglers": [], "contended": [{**st, "measure": "step", "score": 1.8,
                                                                          "since_step": 31, "since_before": False}]},
                           tmp_path, 0)
    assert "was 1.8x slower than the others from step 31 while" in g["message"], g["message"]


def test_the_summary_says_an_unknown_throughput_median_is_unknown():
    """The job's throughput buckets were all empty (NaN): the observe report's median is null,
    and the job-end summary says "unknown", not "None" (was: "throughput: median None")."""
    from hpcml.run.report import summary
    rep = {"job": {"job_id": "7", "mode": "local", "command": ["train"]}, "ending": {"exit_code": 0, "first_failure": None},
           "vet": None, "env": None, "observe": {"throughput": {"median": None, "unit": "steps/s"}, "progress": None},
           "score": None, "score_missing": "no GPU samples", "attempts": [], "findings": []}
    said = summary(rep)
    assert "  throughput: median unknown steps/s" in said and not any("None" in line for line in said), said
