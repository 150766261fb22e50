"""The time ledger (``hpcml.run.ledger``) on records made as the launcher makes them, with
heartbeats written by the recorder's own writer. Its agreement with a real run's own step
ledger: tests/run/test_recovery_local.py (``ledger_matches_the_scripts_own``)."""

from __future__ import annotations

from pathlib import Path

from hpcml.jobmodel import Fault, Restart, Resumed, RunRecord
from hpcml.observe.beat import BeatWriter, Progress
from hpcml.run import ledger
from hpcml.run.jobdir import observe_dir

T0 = 1_800_000_000.0


def _beats(d: Path, attempt: int, steps: list[float]) -> None:
    """Rank 0's record after completing a step at each of ``steps`` (epoch seconds)."""
    p = Progress()
    p.update(steps, ["metric"] * len(steps), ["loss"] * len(steps), [1.0] * len(steps), list(range(1, len(steps) + 1)))
    w = BeatWriter(observe_dir(d, attempt), 0, "n1")
    w.write(p, now=steps[-1])
    w.close()


def _job(d: Path, lost: int | None) -> RunRecord:
    """Attempt 0: started T0, steps 10..50 s, crashed at 52 s, ended 60 s; restarted at
    70 s (steps 80..120 s), ended 125 s. Its resume's steps lost: ``lost``."""
    _beats(d, 0, [T0 + t for t in range(10, 51)])
    _beats(d, 1, [T0 + t for t in range(80, 121)])
    restart = Restart(fault=Fault(kind="crash", what="rank 0 exited 1", nodes=["n1"], began=T0 + 52,
                                  detected=T0 + 53), action="restart",
                      resumed=Resumed(step=None if lost is None else 40 - lost, steps_lost=lost))
    first = RunRecord(command=["x"], mode="local", started=T0, ended=T0 + 60, first_step_at=T0 + 10, restart=restart)
    return RunRecord(command=["x"], mode="local", started=T0 + 70, ended=T0 + 125, attempt=1,
                     first_step_at=T0 + 80, attempts=[first.as_attempt()])


def test_the_parts_add_up_and_steps_done_again_come_off_the_productive_time(tmp_path):
    got = ledger.build(tmp_path, _job(tmp_path, lost=5), step_s=1.0)
    assert got is not None and got.total_s == 125.0
    parts = got.by_part()
    assert sum(parts.values()) == 125.0 and "other" not in parts
    # attempt 0: startup 10, productive 40 (10..50), detection 3 (50..53: from the last step), stopping 7;
    # relaunch 10; attempt 1: startup 10, 5 steps redone, productive 35, tail 5
    assert parts == {"startup": 20.0, "productive": 75.0, "detection": 3.0, "stopping": 7.0,
                     "relaunch": 10.0, "redone": 5.0, "tail": 5.0}
    assert got.ettr == round(75 / 125, 4) and got.ettr_bound is None
    assert ledger.line(got).startswith("time: 125 s, 60% training (ETTR 0.60); ")


def test_a_requeued_job_s_time_in_slurm_s_queue_holds_no_node_and_is_not_in_its_ettr(tmp_path):
    """A 4-node job preempted and requeued at +60 s runs again 3 hours later for 55 s: the
    3 hours are ``queued``, no node-seconds, out of ETTR's whole (the time it held its
    nodes), and the summary for the centre charges the 115 s it held 4 nodes, not 3 hours
    (was: 12.14 node-hours, 12.05 of them "not training", ETTR 0.0073)."""
    import time

    from hpcml.jobmodel import Requeued
    from hpcml.run import report, summary
    from hpcml.run.jobdir import write_run
    t0 = time.time() - 20_000                    # the collector takes no summary from the future
    queue = 3 * 3600.0
    nodes = ["n1", "n2", "n3", "n4"]
    _beats(tmp_path, 0, [t0 + t for t in range(10, 51)])
    _beats(tmp_path, 1, [t0 + queue + t for t in range(80, 121)])
    first = RunRecord(command=["x"], mode="slurm", job_id="42", started=t0, ended=t0 + 60, first_step_at=t0 + 10,
                      allocation=nodes, nodes=nodes, restart_count=0, slurm_state="PREEMPTED", ntasks=4,
                      requeued=Requeued(by="slurm", restart_count=0))
    rec = RunRecord(command=["x"], mode="slurm", job_id="42", started=t0 + queue + 70, ended=t0 + queue + 125,
                    attempt=1, restart_count=1, exit_code=0, first_step_at=t0 + queue + 80, allocation=nodes,
                    nodes=nodes, ntasks=4, attempts=[first.as_attempt()])
    write_run(tmp_path, rec)
    got = ledger.build(tmp_path, rec, step_s=1.0)
    assert got is not None and got.total_s == queue + 125
    queued = [p for p in got.parts if p.part == "queued"]
    assert [(p.seconds, p.node_s) for p in queued] == [(queue + 10, 0.0)]
    assert got.node_s == 4 * 115.0 and got.ettr == round(80 / 115, 4)
    assert "queued 10810 s" in ledger.line(got)
    doc = summary.build(tmp_path, report.build(tmp_path)).to_json()
    assert doc["node_hours"] == round(4 * 115 / 3600, 4) and doc["ettr"] == round(80 / 115, 4), doc
    assert doc["node_hours_not_training"] == round(4 * 35 / 3600, 4), doc


def test_steps_done_again_that_were_not_measured_make_the_ratio_a_bound_not_a_zero(tmp_path):
    got = ledger.build(tmp_path, _job(tmp_path, lost=None), step_s=1.0)
    assert got is not None and got.ettr_bound == "at most"
    redone = [p for p in got.parts if p.part == "redone"]
    assert [(p.seconds, p.note.startswith("steps done again after the restart: not measured")) for p in redone] == \
        [(None, True)]
    assert "at most 64% training" in ledger.line(got) and "not measured: redone" in ledger.line(got)


def test_a_job_that_recorded_no_step_has_its_training_unmeasured_not_0(tmp_path):
    """A script whose steps hpcml cannot see (it logs none and steps no torch optimizer: JAX,
    a binary, HPCML_RUN_OPTIMIZER_STEPS=0) ran 600 s and exited 0: whether it trained is not
    known. No "0% training (ETTR 0.00)", no start-up of 600 s, and nothing the centre would
    count as node time that did not train."""
    from hpcml.run.summary import _not_training
    rec = RunRecord(command=["python", "train_jax.py"], mode="local", started=T0, ended=T0 + 600, exit_code=0)
    got = ledger.build(tmp_path, rec, step_s=None)
    assert got is not None and got.ettr is None and got.productive_s is None and got.productive_node_s is None
    assert "startup" not in got.by_part() and got.by_part().get("other") == 600.0
    assert ledger.line(got).startswith("time: 600 s, training not measured (no step recorded)"), ledger.line(got)
    assert "0%" not in ledger.line(got) and "ETTR" not in ledger.line(got)
    assert _not_training(got.to_json(), gpus=0, nodes=1) == \
        {"node_hours_not_training": None, "gpu_hours_not_training": None, "not_training_why": None}


def test_an_attempt_that_completed_no_step_is_start_up_where_the_job_s_steps_were_seen(tmp_path):
    """The same job's steps were seen in its first attempt: its second, which crashed before
    its first step, spent its time starting up (a measured 0 for that attempt)."""
    _beats(tmp_path, 0, [T0 + t for t in range(10, 51)])
    restart = Restart(fault=Fault(kind="crash", what="rank 0 exited 1", nodes=["n1"], began=T0 + 52,
                                  detected=T0 + 53), action="restart", resumed=Resumed(step=35, steps_lost=5))
    first = RunRecord(command=["x"], mode="local", started=T0, ended=T0 + 60, first_step_at=T0 + 10, restart=restart)
    rec = RunRecord(command=["x"], mode="local", started=T0 + 70, ended=T0 + 100, attempt=1, exit_code=1,
                    attempts=[first.as_attempt()])
    got = ledger.build(tmp_path, rec, step_s=1.0)
    assert got is not None and got.ettr == round(40 / 100, 4)
    assert [(p.attempt, p.seconds, p.note) for p in got.parts if p.part == "startup"][-1] == (1, 30.0, "no step completed")


def test_a_job_still_running_has_no_ledger(tmp_path):
    assert ledger.build(tmp_path, RunRecord(command=["x"], mode="local", started=T0), step_s=None) is None


def test_the_incident_that_ended_an_attempt_comes_first_with_what_it_cost(tmp_path):
    """The lost-node job of issue 66: three straggler findings came before the restart that
    cost the attempt. Now the restart leads, priced from the ledger (attempt 0's detection
    and stopping, attempt 1's relaunch, start-up and steps done again: 3+7+10+10+5 s)."""
    from hpcml.run.report import _by_cost
    got = ledger.build(tmp_path, _job(tmp_path, lost=5), step_s=1.0)
    assert got is not None
    findings = [{"source": "observe", "kind": "live_straggler", "message": f"rank {r} slower", "advice": ""}
                for r in (1, 2, 3)]
    findings.append({"source": "run", "kind": "restarted", "message": "attempt 0: lost node n2; restarted", "advice": ""})
    out = _by_cost(findings, got.to_json(), current=1)
    assert [f["kind"] for f in out] == ["restarted", "live_straggler", "live_straggler", "live_straggler"]
    assert out[0]["cost_s"] == 35.0 and all("cost_s" not in f for f in out[1:])     # unpriced: no number, not 0


def test_a_restart_whose_steps_done_again_went_unmeasured_costs_at_least_what_was_measured(tmp_path):
    """The same restart, resumed at a step nobody read (no checkpoint step, no --step-pattern):
    the steps done again are not measured, so the 30 s measured (3+7+10+10) is a lower
    bound: ``cost_bound`` "at least" and "[cost ≥ 30 s]" (was: "[cost 30 s]", as if exact)."""
    from hpcml.run.report import _by_cost, finding_line
    got = ledger.build(tmp_path, _job(tmp_path, lost=None), step_s=1.0)
    assert got is not None and any(p.part == "redone" and p.seconds is None for p in got.parts)
    findings = [{"source": "run", "kind": "restarted", "message": "attempt 0: rank 0 exited 1; restarted", "advice": ""}]
    (out,) = _by_cost(findings, got.to_json(), current=1)
    assert out["cost_s"] == 30.0 and out["cost_bound"] == "at least"
    measured = _by_cost(findings, ledger.build(tmp_path, _job(tmp_path, lost=5), step_s=1.0).to_json(), current=1)
    assert "cost_bound" not in measured[0]
    assert finding_line(out) == "→ [run] attempt 0: rank 0 exited 1; restarted [cost ≥ 30 s]"
    assert finding_line(measured[0]).endswith("[cost 35 s]")


def test_a_failure_whose_cost_the_ledger_did_not_measure_has_no_cost_not_0(tmp_path):
    """A rank failed and nothing restarted: the ledger has launch, start-up, productive and
    tail, no detection or stopping part. The failure is still first, with no ``cost_s``
    (was: "[cost 0 s]")."""
    from hpcml.run.report import _by_cost
    _beats(tmp_path, 0, [T0 + t for t in range(10, 51)])
    job = RunRecord(command=["x"], mode="local", started=T0, ended=T0 + 60, first_step_at=T0 + 10, exit_code=1)
    got = ledger.build(tmp_path, job, step_s=1.0)
    assert got is not None
    assert not {p.part for p in got.parts} & {"detection", "stopping"}
    findings = [{"source": "observe", "kind": "live_straggler", "message": "rank 1 slower", "advice": ""},
                {"source": "run", "kind": "failed_rank", "message": "rank 1 failed first with exit code 1", "advice": ""}]
    out = _by_cost(findings, got.to_json(), current=0)
    assert [f["kind"] for f in out] == ["failed_rank", "live_straggler"]
    assert all("cost_s" not in f for f in out)


def test_spare_and_excluded_nodes_are_the_allocation_time_no_rank_used(tmp_path):
    """4 nodes held, 1 excluded by vetting, 1 spare, the ranks on 2: the idle part is 2 nodes
    for as long as the ranks ran, and the node-seconds of the parts add up to the allocation's."""
    _beats(tmp_path, 0, [T0 + t for t in range(10, 51)])
    alloc = ["n1", "n2", "n3", "n4"]
    rec = RunRecord(command=["x"], mode="slurm", started=T0, ended=T0 + 60, first_step_at=T0 + 10,
                    allocation=alloc, nodes=["n1", "n2"], excluded={"n4": ["gpu: xid 79"]})
    got = ledger.build(tmp_path, rec, step_s=1.0)
    assert got is not None
    idle = [p for p in got.parts if p.part == "idle"]
    assert [(p.seconds, p.node_s) for p in idle] == [(0.0, 2 * 60.0)]
    assert "1 spare, 1 excluded" in idle[0].note
    assert got.node_s == 4 * 60.0 and got.productive_node_s == 2 * 40.0
    assert sum(p.node_s or 0 for p in got.parts) == got.node_s
    assert "idle nodes 120 node-s" in ledger.line(got)
    assert got.lost()[0] == ("idle", 120.0)


def _store(d: Path, rank: int, rows: list[tuple]) -> None:
    from hpcml.observe.store import RankWriter
    observe_dir(d, 0).mkdir(parents=True, exist_ok=True)
    w = RankWriter.create(observe_dir(d, 0), rank)
    w.write_rows(rows)
    w.close()


def test_saves_in_one_stall_count_once_and_a_nan_save_is_none(tmp_path):
    """Rank 0 steps each second from 10 s to 49 s, then none until 150 s, saving twice in
    between (40 s each), then steps to 199 s; rank 1's store has a NaN save (damaged or
    forged). The stall is the gap less one step less the 80 s of saves; the parts add up."""
    ns = 1_000_000_000
    steps = [t for t in range(10, 50)] + [t for t in range(150, 200)]
    rows = [(int((T0 + t) * ns), "section", "step", 1.0, k + 1, None) for k, t in enumerate(steps)]
    rows += [(int((T0 + 90) * ns), "section", "checkpoint", 40.0, 40, None),
             (int((T0 + 140) * ns), "section", "checkpoint", 40.0, 40, None)]
    _store(tmp_path, 0, rows)
    _store(tmp_path, 1, [(int((T0 + 60) * ns), "section", "checkpoint", float("nan"), 40, None)])
    _beats(tmp_path, 0, [T0 + t for t in steps])
    run = RunRecord(command=["x"], mode="local", started=T0, ended=T0 + 200, first_step_at=T0 + 10)
    got = ledger.build(tmp_path, run, step_s=1.0)
    assert got is not None
    parts = got.by_part()
    # the gap: the step at 49 s to the one at 150 s, 101 s, less one step, less the two saves
    assert parts["checkpoint"] == 80.0 and parts["stalls"] == 101.0 - 1.0 - 80.0, parts
    assert parts["productive"] == 189.0 - 80.0 - 20.0 and abs(sum(parts.values()) - 200.0) < 1e-6, parts


def test_an_attempt_whose_heartbeats_were_lost_has_its_training_unmeasured_not_start_up(tmp_path):
    """Attempt 1's first step completed at +80 s (run.json says so) and it ran to +125 s, but
    its heartbeat is gone (a node-local store lost): its training is not measured, so the job's
    ETTR and its node-hours not training are unknown (was: "no step completed", 55 s of
    start-up, ETTR 0.32 as if measured)."""
    from hpcml.run.summary import _not_training
    _beats(tmp_path, 0, [T0 + t for t in range(10, 51)])
    restart = Restart(fault=Fault(kind="crash", what="rank 0 exited 1", nodes=["n1"], began=T0 + 52,
                                  detected=T0 + 53), action="restart", resumed=Resumed(step=35, steps_lost=5))
    first = RunRecord(command=["x"], mode="local", started=T0, ended=T0 + 60, first_step_at=T0 + 10, restart=restart)
    rec = RunRecord(command=["x"], mode="local", started=T0 + 70, ended=T0 + 125, attempt=1, exit_code=0,
                    first_step_at=T0 + 80, attempts=[first.as_attempt()])
    got = ledger.build(tmp_path, rec, step_s=1.0)
    assert got is not None and got.ettr is None
    mine = [(p.part, p.seconds) for p in got.parts if p.attempt == 1]
    assert ("startup", 10.0) in mine and ("productive", None) in mine, mine
    assert "not measured: productive" in ledger.line(got) and "training (ETTR" not in ledger.line(got)
    assert _not_training(got.to_json(), gpus=4, nodes=1)["node_hours_not_training"] is None


def test_an_attempt_whose_end_was_never_recorded_keeps_the_steps_its_heartbeat_saw(tmp_path):
    """Attempt 0 trained from +10 to +50 s (its heartbeat says so) and was requeued, its
    launcher killed before it recorded its end: its 40 s count as productive, its tail is not
    measured (was: productive 0.0 and tail 0.0, ETTR 0.32)."""
    from hpcml.jobmodel import Requeued
    _beats(tmp_path, 0, [T0 + t for t in range(10, 51)])
    _beats(tmp_path, 1, [T0 + t for t in range(80, 121)])
    first = RunRecord(command=["x"], mode="slurm", started=T0, ended=None, first_step_at=T0 + 10,
                      requeued=Requeued(by="slurm", restart_count=1), end_recorded_by_next_attempt=True)
    rec = RunRecord(command=["x"], mode="slurm", started=T0 + 70, ended=T0 + 125, attempt=1, restart_count=1,
                    exit_code=0, first_step_at=T0 + 80, attempts=[first.as_attempt()])
    got = ledger.build(tmp_path, rec, step_s=1.0)
    assert got is not None and got.productive_s == 80.0 and got.ettr == round(80 / 125, 4)
    assert [(p.part, p.seconds) for p in got.parts if p.attempt == 0 and p.part in ("productive", "tail")] == \
        [("productive", 40.0), ("tail", None)]
