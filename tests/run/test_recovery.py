"""The restart policy of ``hpcml run --max-restarts`` (hpcml.run.recovery), on records shaped
as the launcher writes them; the real restarts are in test_recovery_local.py and
test_recovery_slurm.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcml.cluster.slurm import node_lost
from hpcml.jobmodel import Attempt
from hpcml.run import recovery
from hpcml.run.recovery import Pool, Recovery, describe, fault_of, time_lost


def rec(doc: dict) -> Attempt:
    """An attempt's record through the model the launcher writes it with."""
    return Attempt.model_validate({"command": ["python", "train.py"], "mode": "slurm", "started": 0.0, **doc})


def crashed(node: str, step: int | None, code: int = 3) -> Attempt:
    return rec({"exit_code": code, "furthest_step": step, "ended": 110.0,
            "timeline": [{"kind": "crash", "what": f"rank 1 exited {code}", "began": 100.0, "detected": 100.5,
                          "node": node, "rank": 1, "step": step, "stderr": "boom"}]})


def hung(nodes: list[str], step: int) -> Attempt:
    return rec({"exit_code": 5, "furthest_step": step,
                "hang": {"began": 50.0, "detected": 60.0, "timeout": 10.0, "ranks": len(nodes), "action": "stop",
                         "verdict": {"method": "stacks", "blocked": [],
                                     "culprits": [{"rank": i, "node": n, "why": "stuck"} for i, n in enumerate(nodes)]}},
                "timeline": [{"kind": "hang", "what": "culprit ranks 0", "detected": 60.0}]})


def test_the_faults_node_is_never_read_as_the_blocked_ranks():
    """The culprit (rank 1) is on n2, the rank blocked behind it on n1: the line names n2
    next to the fault, never after "blocked behind them" as if rank 0 were there."""
    a = rec({"exit_code": 5, "furthest_step": 9,
             "hang": {"began": 50.0, "detected": 60.0, "timeout": 10.0, "ranks": 2, "action": "stop",
                      "verdict": {"method": "stacks", "blocked": [0],
                                  "culprits": [{"rank": 1, "node": "n2", "why": "stuck"}]}},
             "timeline": [{"kind": "hang", "what": "culprit ranks 1 (stacks); ranks 0 blocked behind them",
                           "detected": 60.0}]})
    line = describe(policy(["n1", "n2", "n3"], spares=1).after(a, Path("x"), None))
    assert line.startswith("hang on n2: culprit ranks 1 (stacks); ranks 0 blocked behind them;"), line
    assert "behind them on" not in line


def policy(good: list[str], spares: int = 0, restarts: int = 3, min_nodes: int | None = None,
           revet: Path | None = None) -> Recovery:
    pool = Pool.start(good, spares)
    return Recovery(pool, restarts, want=len(pool.active), min_nodes=min_nodes or len(pool.active), revet=revet,
                    slurm=True)


def test_no_fault_no_restart():
    assert fault_of(rec({"exit_code": 0})) is None
    assert fault_of(rec({"exit_code": 143, "signals_forwarded": ["SIGTERM"]})) is None   # scancel, time limit
    assert fault_of(rec({"exit_code": 0, "requeued": {"by": "slurm"}})) is None
    assert policy(["n1", "n2"]).after(rec({"exit_code": 0}), Path("x"), None) is None


def test_fault_kinds_name_their_nodes():
    f = fault_of(crashed("n2", 29))
    assert (f.kind, f.nodes, f.step, f.what) == ("crash", ["n2"], 29, "rank 1 exited 3: boom")
    f = fault_of(hung(["n3", "n1"], 30))
    assert (f.kind, f.nodes, f.step, f.began) == ("hang", ["n1", "n3"], 30, 50.0)
    f = fault_of(rec({"exit_code": 1, "lost_nodes": {"n4": {"state": "DOWN+NOT_RESPONDING", "seen": 7.0}},
                  **{k: v for k, v in crashed("n1", 3).to_json().items() if k != "exit_code"}}))
    assert (f.kind, f.nodes) == ("node", ["n4"])          # a lost node explains the crashes it caused
    f = fault_of(rec({"exit_code": 143, "stopped_for": {"what": "rank 2 1.5x slower", "node": "n2", "detected": 9.0}}))
    assert (f.kind, f.nodes) == ("straggler", ["n2"])
    f = fault_of(rec({"exit_code": 127, "first_failure": {"rank": 0, "exit_code": 127, "node": "n1", "end": 3.0}}))
    assert (f.kind, f.nodes, f.step) == ("crash", ["n1"], None)


def test_a_spare_replaces_the_suspect_which_stays_out_without_a_protocol():
    p = policy(["n1", "n2", "n3"], spares=1)
    r = p.after(crashed("n2", 29), Path("x"), None)
    assert r.action == "restart" and r.nodes == ["n1", "n3"] and r.spares == []
    assert "n2" in r.excluded and "no --revet protocol" in r.excluded["n2"][0]


def test_shrinks_only_as_far_as_min_nodes_allows():
    r = policy(["n1", "n2"], min_nodes=1).after(crashed("n2", 29), Path("x"), None)
    assert r.action == "restart" and r.nodes == ["n1"]
    r = policy(["n1", "n2"]).after(crashed("n2", 29), Path("x"), None)          # default: as many as the first
    assert r.action == "stop" and "1 good node left, fewer than --min-nodes 2" in r.why


def test_the_same_fault_at_the_same_step_ends_after_two_restarts():
    p = policy([f"n{i}" for i in range(1, 6)], spares=3, restarts=10)
    actions = [p.after(crashed(p.pool.active[0], 30 + (i % 2)), Path("x"), None).action for i in range(3)]
    assert actions == ["restart", "restart", "stop"]            # within one step counts as the same
    assert p.restarts == 2


def test_a_fault_at_another_step_is_not_a_recurrence():
    p = policy([f"n{i}" for i in range(1, 6)], spares=3, restarts=10)
    for step in (10, 30, 50):
        assert p.after(crashed(p.pool.active[-1], step), Path("x"), None).action == "restart"
    assert p.recurrences == 0


def test_max_restarts_is_a_limit():
    p = policy(["n1", "n2", "n3", "n4"], spares=2, restarts=1)
    assert p.after(crashed("n1", 5), Path("x"), None).action == "restart"
    r = p.after(crashed("n2", 50), Path("x"), None)
    assert r.action == "stop" and "--max-restarts 1" in r.why


def test_revet_returns_a_node_that_passes_and_keeps_out_one_that_fails(monkeypatch):
    """vet_job is replaced by its verdict (the real re-vet runs in test_recovery_slurm.py)."""
    class Verdict:
        good, reasons = ["n2"], {"n3": ["gemm: too slow"]}

    class Run:
        verdict = Verdict()
    monkeypatch.setattr("hpcml.vet.session.vet_job", lambda *a, **k: (Run(), {}))
    p = policy(["n1", "n2", "n3", "n4"], spares=1, min_nodes=1, revet=Path("p.yaml"))
    r = p.after(hung(["n2", "n3"], 30), Path("x"), None)
    assert r.revet.passed == ["n2"] and r.nodes == ["n1", "n4", "n2"]
    assert list(r.excluded) == ["n3"] and "failed vetting" in r.excluded["n3"][0]
    r = p.after(crashed("n2", 70), Path("x"), None)          # a suspect again: out, whatever vetting says
    assert "second time" in r.excluded["n2"][0] and r.nodes == ["n1", "n4"]


def test_a_lost_node_is_not_vetted_again(monkeypatch):
    monkeypatch.setattr("hpcml.vet.session.vet_job", lambda *a, **k: pytest.fail("vetted a lost node"))
    p = policy(["n1", "n2", "n3"], spares=1, revet=Path("p.yaml"))
    r = p.after(rec({"exit_code": 1, "lost_nodes": {"n1": {"state": "DOWN", "seen": 1.0}}}), Path("x"), None)
    assert r.nodes == ["n2", "n3"] and list(r.excluded) == ["n1"]


def test_local_runs_restart_in_place():
    p = Recovery(Pool(["host"], []), 2, want=1, min_nodes=1, revet=None, slurm=False)
    r = p.after(crashed("host", 4), Path("x"), None)
    assert r.action == "restart" and r.nodes == ["host"] and not r.excluded


@pytest.mark.parametrize("state,lost", [("ALLOCATED", False), ("MIXED+DRAIN", False), ("IDLE", False),
                                        ("MIXED+NOT_RESPONDING", True), ("DOWN+NOT_RESPONDING", True),
                                        ("ALLOCATED*", True), ("DOWN", True), ("FAIL", True),
                                        ("ALLOCATED+FAILING", True), ("IDLE+POWERED_DOWN", True)])
def test_node_lost_states(state, lost):
    assert node_lost(state) is lost


def test_describe_and_time_lost():
    r = policy(["n1", "n2", "n3"], spares=1).after(hung(["n2"], 30), Path("x"), None)
    r.resumed = {"step": 20, "steps_lost": 10, "time_to_resume_s": 14.0}
    line = describe(r)
    assert line.startswith("hang on n2: culprit ranks 0;") and "detected 10 s after it began" in line
    assert "n2 out" in line and "restarted on n1, n3" in line and "resumed from step 20 (10 steps lost)" in line
    lost = time_lost([rec({"restart": r}), rec({})], step_s=0.5)
    assert lost["time_lost_s"] == 19.0 and lost["steps_lost"] == 10 and lost["restarts"] == 1
    assert time_lost([rec({})], 1.0) is None


def test_a_restart_whose_next_attempt_completed_no_step_leaves_the_cost_a_floor():
    """Two restarts: the first resumed 10 s after its fault; the second's next attempt loaded
    its checkpoint (2 steps lost) and crashed before its first step. What the second cost is
    not measured: the sum is "at least", never a total that leaves that fault out (the centre
    adds up time_lost_s)."""
    from hpcml.run.report import _attempt_lines
    first = policy(["n1", "n2", "n3"], spares=1).after(hung(["n2"], 30), Path("x"), None)
    first.resumed = {"step": 35, "steps_lost": 5, "time_to_resume_s": 10.0}
    second = policy(["n1", "n2", "n3"], spares=1).after(hung(["n2"], 30), Path("x"), None)
    second.resumed = {"step": 73, "steps_lost": 2, "time_to_resume_s": None}
    lost = time_lost([rec({"restart": first}), rec({"restart": second}), rec({})], step_s=1.0)
    assert lost["time_lost_s"] is None and lost["time_to_resume_s"] == 10.0 and lost["not_resumed"] == 1
    lines = _attempt_lines({"attempts": [{"attempt": 0, "nodes": ["n1", "n2"], "restart": first},
                                         {"attempt": 1, "nodes": ["n1", "n3"], "restart": second}],
                            "ending": {"exit_code": 1}, "job": {"nodes": ["n1", "n3"], "attempt": 2}, "recovery": lost})
    assert lines[-1].startswith("faults cost at least the time to resume: 10 s from faults to resumed steps "
                                "(not counted: 1 restart whose next attempt completed no step)"), lines


def test_steps_done_again_without_a_checkpoint_step_are_unknown_not_0():
    """A restart whose next attempt resumed without an hpcml.ckpt checkpoint (nanoGPT's own
    ckpt.pt): the steps done again are unknown, and so is the cost; the report says so and
    what would measure it, never "0 steps done again"."""
    from hpcml.run.report import _attempt_lines
    r = policy(["n1", "n2", "n3"], spares=1).after(hung(["n2"], 30), Path("x"), None)
    r.resumed = {"step": None, "steps_lost": None, "time_to_resume_s": 14.0}
    lost = time_lost([rec({"restart": r}), rec({})], step_s=0.5)
    assert lost["steps_lost"] is None and lost["time_lost_s"] is None and lost["time_to_resume_s"] == 14.0
    assert lost["steps_lost_unknown"].startswith("unknown: ")
    lines = _attempt_lines({"attempts": [{"attempt": 0, "nodes": ["n1", "n2"], "restart": r}], "ending": {"exit_code": 0},
                            "job": {"nodes": ["n1", "n3"], "attempt": 1}, "recovery": lost})
    assert lines[-1].startswith("faults cost at least the time to resume: 14 s from faults to resumed steps, "
                                "steps done again: unknown: "), lines
    assert not any("0 steps" in line for line in lines)
    assert recovery.RECURRENCES == 2


def test_on_straggler_restart_stops_the_job_once_for_the_first_straggler(tmp_path):
    from hpcml.run.watch import Watch
    w = Watch(tmp_path, 0, 4, on_straggler="restart")
    assert w._straggler_stop() is False                       # nobody named yet
    from hpcml.jobmodel import Straggler
    w.stragglers = {2: Straggler(rank=2, node="n2", score=1.8, since_step=410, detected=5.0),
                    3: Straggler(rank=3, node="n3", score=1.5, since_step=500, detected=9.0)}
    assert w._straggler_stop() is True and w._straggler_stop() is False
    f = fault_of(rec({"exit_code": 0, "stopped_at": 6.0, **w.to_json()}))      # ranks that leave on TERM with 0
    assert (f.kind, f.nodes, f.what) == ("straggler", ["n2"], "rank 2 1.8x slower since step 410")
    assert Watch(tmp_path, 0, 4, stragglers=w.stragglers)._straggler_stop() is False   # report: never stops


def test_a_ctrl_c_while_vetting_again_ends_the_restarts(monkeypatch):
    """vet's own SIGINT handler takes the Ctrl-C and returns a verdict; the policy asks it."""
    class Run:
        class verdict:  # noqa: N801 - the shape vet_job returns
            good, reasons = ["n2"], {}
    monkeypatch.setattr("hpcml.vet.session.vet_job", lambda *a, **k: (Run(), {}))
    monkeypatch.setattr("hpcml.vet.isolate.interrupted", lambda: True)
    r = policy(["n1", "n2", "n3"], spares=1, revet=Path("p.yaml")).after(crashed("n2", 3), Path("x"), None)
    assert r.action == "stop" and "interrupted" in r.why


def test_spares_never_leave_the_first_attempt_without_a_node():
    assert Pool.start(["n1"], 2).active == ["n1"] and Pool.start(["a", "b"], 3).active == ["a"]


def test_a_straggler_is_worth_a_stop_only_when_it_can_be_replaced():
    p = policy(["n1", "n2"], restarts=1)                       # no spare, --min-nodes 2
    assert p.can_replace("n2") is False
    assert policy(["n1", "n2"], restarts=1, min_nodes=1).can_replace("n2") is True
    assert policy(["n1", "n2", "n3"], spares=1, restarts=1).can_replace("n2") is True
    assert policy(["n1", "n2", "n3"], spares=1, restarts=0).can_replace("n2") is False


def test_resume_is_read_from_the_job_directory_when_the_launcher_did_not_write_it(tmp_path, monkeypatch):
    """A launcher killed during the next attempt: the report still says where it resumed."""
    from hpcml.cluster import requeue
    from hpcml.run.recovery import resume_of
    monkeypatch.setenv(requeue.ENV_DIR, str(tmp_path / "attempts" / "1"))
    (tmp_path / "attempts" / "1").mkdir(parents=True)
    requeue.note_resumed(20, tmp_path / "ckpt")
    prev = rec({"furthest_step": 29, "ended": 12.0,
                "restart": {"action": "restart", "decided": 12.5,
                            "fault": {"kind": "crash", "what": "rank 1 exited 3", "nodes": [], "began": 10.0,
                                      "detected": 11.0}}})
    got = resume_of(tmp_path, prev, rec({"attempt": 1}))
    assert got.step == 20 and got.steps_lost == 9 and got.split_s.detection == 1.0
    assert got.first_step_at is None and got.time_to_resume_s is None      # no step yet: unknown, not 0


def test_the_ranks_first_step_is_taken_only_from_ranks_the_attempt_started_and_after_it_started(tmp_path):
    """Without the launcher's record the first step comes from the ranks' heartbeats, which
    the user's program could have written: one for a rank the attempt did not start, or one
    dated before the attempt began, says nothing about when it resumed."""
    from hpcml.observe.beat import BeatWriter, Progress
    from hpcml.run.jobdir import observe_dir
    from hpcml.run.recovery import resume_of
    prev = rec({"furthest_step": 29, "ended": 12.0,
                "restart": {"action": "restart", "decided": 12.5,
                            "fault": {"kind": "crash", "what": "rank 1 exited 3", "nodes": [], "began": 10.0,
                                      "detected": 11.0}}})
    for rank, first in ((0, 40.0), (1, 41.0), (7, 14.0)):      # rank 7: not one of the 2 started
        p = Progress()
        p.update([first], ["metric"], ["loss"], [1.0], [1])
        BeatWriter(observe_dir(tmp_path, 1), rank, "n1").write(p)
    got = resume_of(tmp_path, prev, rec({"attempt": 1, "ntasks": 2, "started": 30.0}))
    assert got.first_step_at == 40.0 and got.time_to_resume_s == 30.0
    early = Progress()
    early.update([20.0], ["metric"], ["loss"], [1.0], [1])                  # before the attempt started
    BeatWriter(observe_dir(tmp_path, 1), 1, "n1").write(early)
    BeatWriter(observe_dir(tmp_path, 1), 0, "n1").write(early)
    assert resume_of(tmp_path, prev, rec({"attempt": 1, "ntasks": 2, "started": 30.0})).first_step_at is None
