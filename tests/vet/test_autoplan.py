"""``--vet auto``'s model (``hpcml.vet.autoplan``): vetting sized to the job, each figure
with its source; and Slurm's time format, which gives the model the job's time left."""

from __future__ import annotations

import pytest

from hpcml.centre.plan import CheckFacts, Plan
from hpcml.cluster.slurm import parse_slurm_time
from hpcml.vet import autoplan
from hpcml.vet.protocol import load

CPU = autoplan.builtin_protocol()


def _decide(nodes: int, hours: float | None, *, gpus: int = 4, restarts: bool = False, plan: Plan | None = None):
    return autoplan.decide(load(CPU), nodes=nodes, gpus=gpus, seconds_left=None if hours is None else hours * 3600,
                           restarts=restarts, plan=plan)


def test_a_short_small_job_vets_less_than_a_long_large_one():
    small, large = _decide(1, 0.1), _decide(256, 24 * 7)
    assert small.chosen == "none" and large.chosen == "full"
    full = next(t for t in large.tiers if t.name == "full")
    assert full.saved_h > full.cost_h > 0 and full.net_h == pytest.approx(full.saved_h - full.cost_h, abs=1e-3)
    assert large.expected_hurts == pytest.approx(autoplan.DEFAULT_RATE * 256 * 7, rel=1e-3)
    assert large.unit == "GPU-h" and _decide(2, 1, gpus=0).unit == "node-h"


def test_recovering_in_the_allocation_makes_vetting_worth_less():
    """With --max-restarts a hurt costs the recovery, not half the job: the same job vets less."""
    nodes, hours = 16, 6
    plain, recovering = _decide(nodes, hours), _decide(nodes, hours, restarts=True)
    assert recovering.loss_h < plain.loss_h
    saved = [{t.name: t.saved_h for t in a.tiers} for a in (plain, recovering)]
    assert saved[1]["full"] < saved[0]["full"] and saved[1]["quick"] < saved[0]["quick"]
    assert "max-restarts" in recovering.loss_source and "half the time left" in plain.loss_source


def _measured(recalls: dict[str, float], mean_s: float = 0.2, bad: int = 10) -> list[CheckFacts]:
    return [CheckFacts(name=e.name, type=e.type, runs=900, mean_s=12.0 if e.name == "gemm" else mean_s,
                       recall=recalls.get(e.name, 0.1), caught=round(recalls.get(e.name, 0.1) * bad), bad_nodes=bad)
            for e in load(CPU).evals]


def test_the_centres_measurements_replace_the_defaults_and_say_so():
    plan = Plan(generated=0, window_s=30 * 86400, node_days=5000, hurt_jobs=50, checks=_measured({"gemm": 0.8}))
    auto = _decide(64, 48, plan=plan)
    assert auto.rate_per_node_day == 0.01 and auto.rate_source.startswith("collector: 50 jobs hurt")
    full = next(t for t in auto.tiers if t.name == "full")
    assert full.catch == 0.8 and "gemm caught 8 of the 10 bad nodes it ran on" in full.catch_source
    quick = next(t for t in auto.tiers if t.name == "quick")
    assert "gemm" not in quick.checks and quick.catch == 0.1      # memory is quick; gemm is not
    assert full.seconds > quick.seconds and full.seconds >= 12.0 + 0.2
    text = "\n".join(autoplan.lines(auto))
    assert "collector: 50 jobs hurt" in text and "<- chosen" in text


def test_a_check_the_centre_did_not_measure_keeps_the_default_and_full_never_catches_less_than_quick():
    checks = [c for c in _measured({"gemm": 0.0, "memory": 0.7}) if c.name in ("gemm", "memory")]
    plan = Plan(generated=0, window_s=30 * 86400, node_days=5000, hurt_jobs=50, checks=checks)
    tiers = {t.name: t for t in _decide(64, 48, plan=plan).tiers}
    assert tiers["quick"].catch == 0.7 and "memory caught 7" in tiers["quick"].catch_source
    assert tiers["full"].catch == autoplan.DEFAULT_CATCH["full"]          # its other checks are unmeasured
    everything = Plan(generated=0, window_s=30 * 86400, node_days=5000, hurt_jobs=50,
                      checks=_measured({"gemm": 0.0, "memory": 0.7}, bad=10))
    tiers = {t.name: t for t in _decide(64, 48, plan=everything).tiers}
    assert tiers["full"].catch >= tiers["quick"].catch == 0.7


def test_a_young_collector_does_not_turn_vetting_off():
    """Two node-days without a hurt are no rate of 0: the default stands; a large fleet
    without a hurt gives the rule of three's bound, not 0."""
    young = Plan(generated=0, window_s=86400, node_days=2, hurt_jobs=0)
    auto = _decide(256, 24 * 7, plan=young)
    assert auto.rate_per_node_day == pytest.approx(autoplan.DEFAULT_RATE, rel=1e-3) and "held 2.0 node-days" in auto.rate_source
    quiet = Plan(generated=0, window_s=30 * 86400, node_days=30_000, hurt_jobs=0)
    auto = _decide(256, 24 * 7, plan=quiet)
    assert auto.rate_per_node_day == pytest.approx(1e-4) and "rule of three" in auto.rate_source


def test_a_job_that_expects_to_be_hurt_without_restarts_runs_every_check_and_is_told_why():
    big = _decide(4096, 24 * 14, gpus=8)
    assert big.expected_hurts > 100 and big.chosen == "full" and "--max-restarts" in big.note
    assert any("note:" in line for line in autoplan.lines(big))
    assert _decide(4096, 24 * 14, gpus=8, restarts=True).note == ""


def test_a_protocol_of_fast_checks_only_is_its_own_full_tier(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("name: fast-only\nevals:\n  - {name: memory, type: memory, min_available_fraction: 1%}\n")
    auto = autoplan.decide(load(p), nodes=256, gpus=4, seconds_left=7 * 86400, restarts=True)
    assert [t.name for t in auto.tiers] == ["none", "full"] and auto.chosen == "full"


def test_a_recall_from_too_few_bad_nodes_is_not_used():
    plan = Plan(generated=0, window_s=86400, node_days=10, hurt_jobs=1, rate_per_node_day=0.1,
                checks=[CheckFacts(name="gemm", type="compute", runs=9, mean_s=1.0, recall=1.0, caught=1, bad_nodes=1)])
    full = next(t for t in _decide(8, 10, plan=plan).tiers if t.name == "full")
    assert full.catch == autoplan.DEFAULT_CATCH["full"] and "assumed" in full.catch_source


def test_without_a_plan_the_defaults_are_named_with_why():
    auto = autoplan.decide(load(CPU), nodes=4, gpus=0, seconds_left=None, restarts=False,
                           why_no_plan="http://c:8787/v1/plan: Connection refused")
    assert "Llama 3" in auto.rate_source and "Connection refused" in auto.rate_source
    assert auto.hours == autoplan.DEFAULT_HOURS and "no time limit" in auto.hours_source


def test_the_chosen_tier_cuts_the_protocol():
    proto = load(CPU)
    auto = _decide(256, 24 * 7)
    assert autoplan.chosen_protocol(proto, auto).evals == proto.evals
    assert autoplan.chosen_protocol(proto, _decide(1, 0.1)) is None


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("30:15", 1815), ("01:00:00", 3600), ("1-00:00:00", 86400), ("2-3", 2 * 86400 + 3 * 3600),
    ("2-3:30", 2 * 86400 + 3 * 3600 + 1800), ("UNLIMITED", None), ("INVALID", None), ("", None), ("1-x", None),
    ("1:2:3:4", None), ("-5", None), ("0", None), ("00:00:00", None), ("\u0661", None),
])
def test_slurm_times_read_as_sbatch_documents_them(text, seconds):
    assert parse_slurm_time(text) == seconds


def test_vet_auto_is_told_from_a_protocol_path():
    from pathlib import Path
    assert autoplan.split("auto") is None and autoplan.split("auto:gpu.yaml") == Path("gpu.yaml")
    for other in ("auto:", "autox", "p.yaml"):
        with pytest.raises(ValueError):
            autoplan.split(other)


def test_a_check_costs_at_most_its_timeout_and_a_tier_at_most_the_deadline():
    """The fleet's figure is the collector's; the job stops a check at its timeout and the
    vetting at the protocol's deadline, so no figure can price a tier past those."""
    proto = load(CPU)
    dear = [CheckFacts(name=e.name, type=e.type, runs=900, mean_s=86400.0) for e in proto.evals]
    auto = _decide(64, 24, restarts=True, plan=Plan(generated=0, window_s=30 * 86400, node_days=5000, hurt_jobs=50,
                                                     checks=dear))
    limit = autoplan.OVERHEAD_S + proto.deadline
    assert {t.name: t.seconds <= limit for t in auto.tiers if t.name != "none"} == {"quick": True, "full": True}
    quick = next(t for t in auto.tiers if t.name == "quick")
    fast = [e for e in proto.evals if e.name in quick.checks]
    assert quick.seconds == pytest.approx(autoplan.OVERHEAD_S + min(sum(e.timeout for e in fast), proto.deadline))
