"""``hpcml farm run`` on this machine (no Slurm): the same claims as under Slurm, through
the real CLI in subprocesses, real workers and real tasks. "Exactly once" is counted from a
side file each task appends its id and attempt to (see farmtools.assert_exactly_once)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import jsonschema
import psutil
import pytest

from hpcml import schemas
from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from hpcml.farm.status import Progress
from tests.farm.farmtools import assert_exactly_once, count_ends, ends, hpcml, side_lines, side_task, start, wait_for


def _farm(tmp_path: Path, commands: list[str], **settings) -> Path:
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(c) for c in commands], settings)
    return farm


def _valid(doc: dict, name: str) -> dict:
    assert next(iter(doc)) == "schema"
    jsonschema.validate(doc, schemas.load(name), cls=jsonschema.Draft202012Validator)
    return doc


def test_200_tasks_run_exactly_once_and_status_says_done(tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, str(i)) for i in range(200)])
    p = hpcml("farm", "run", farm, "--slots", "4")
    assert p.returncode == 0, p.stderr
    assert_exactly_once(farm, side, 200)
    assert len(side_lines(side)) == 200
    st = _valid(json.loads(hpcml("farm", "status", farm, "--json").stdout), "farm.status")
    assert st["done"] and st["counts"]["ok"] == 200 and st["eta_s"] == 0
    assert Progress(farm)() == (200, 200)
    for e in ends(farm).values():
        _valid(e, "farm.end")
    _valid(json.loads((farm / "farm.json").read_text()), "farm")
    assert (farm / "logs" / "0.1.out").exists() and (farm / "logs" / "0.1.err").exists()
    again = hpcml("farm", "run", farm, "--slots", "4")         # nothing left: nothing runs again
    assert again.returncode == 0 and len(side_lines(side)) == 200


def test_failed_tasks_are_retried_with_backoff_then_marked(tmp_path):
    side = tmp_path / "side"
    flaky = side_task(side, before='test "$HPCML_FARM_ATTEMPT" -ge 3 || exit 7; ')   # ok on attempt 3
    farm = _farm(tmp_path, [flaky, "exit 5", side_task(side)], retries=2, backoff=0.2)
    p = hpcml("farm", "run", farm, "--slots", "2", "--node-failures", "0")
    assert p.returncode == 1, p.stderr                          # task 1 never succeeds
    rec = ends(farm)
    assert [rec[(0, a)]["outcome"] for a in (1, 2, 3)] == ["failed", "failed", "ok"]
    assert rec[(0, 1)]["exit_code"] == 7
    assert rec[(0, 2)]["start"] - rec[(0, 1)]["end"] >= 0.2     # the backoff was waited
    assert rec[(0, 3)]["start"] - rec[(0, 2)]["end"] >= 0.4     # and doubled
    assert [rec[(1, a)]["outcome"] for a in (1, 2, 3)] == ["failed"] * 3 and (1, 4) not in rec
    st = json.loads(hpcml("farm", "status", farm, "--json").stdout)
    assert st["counts"]["failed"] == 1 and st["failed"][0]["id"] == 1 and st["failed"][0]["exit_code"] == 5
    assert sorted(side_lines(side)) == [(0, 3), (2, 1)]


def test_a_task_over_its_time_limit_is_terminated_and_marked(tmp_path):
    """At its time limit a task gets SIGTERM (time to save, as Slurm's KillWait gives a step),
    then SIGKILL after ``TIME_LIMIT_GRACE``: here the task saves and exits on the TERM."""
    side, saved = tmp_path / "side", tmp_path / "saved"
    task = f"trap 'echo saved >> {saved}; exit 143' TERM; sleep 30 & wait; echo late >> {side}"
    farm = _farm(tmp_path, [task, "true"], retries=0, time_limit=0.5)
    p = hpcml("farm", "run", farm, "--slots", "2")
    assert p.returncode == 1
    rec = ends(farm)
    assert rec[(0, 1)]["outcome"] == "timeout" and rec[(1, 1)]["outcome"] == "ok"
    assert saved.read_text() == "saved\n" and not side.exists()


def test_dependencies_run_prep_then_all_train_then_eval(tmp_path):
    side = tmp_path / "order"
    (tmp_path / "s.yaml").write_text(f"""
tasks:
  - {{group: prep, command: "echo prep >> {side}"}}
  - {{group: train, after: [prep], command: "sleep 0.{{n}}; echo train{{n}} >> {side}", product: {{n: [3, 1, 2]}}}}
  - {{group: eval, after: [train], command: "echo eval >> {side}"}}
  - {{group: last, after: [4], command: "echo last >> {side}"}}
""")
    (tmp_path / "s2.yaml").write_text(f"""
tasks:
  - {{group: bad, command: "exit 1"}}
  - {{group: after_bad, after: [bad], command: "echo after_bad >> {side}"}}
""")
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "s.yaml").returncode == 0
    assert hpcml("farm", "create", farm, tmp_path / "s2.yaml", "--retries", "0").returncode == 0
    p = hpcml("farm", "run", farm, "--slots", "3")
    assert p.returncode == 1, p.stderr
    order = side.read_text().split()
    assert order[0] == "prep" and sorted(order[1:4]) == ["train1", "train2", "train3"]
    assert order[4:] == ["eval", "last"]                  # task 5 waits for task 4 (eval) by id
    assert "after_bad" not in order
    st = json.loads(hpcml("farm", "status", farm, "--json").stdout)
    assert st["counts"]["blocked"] == 1 and st["counts"]["failed"] == 1 and st["counts"]["ok"] == 6


def test_one_gpu_per_worker_pinned_through_the_environment(tmp_path):
    side = tmp_path / "gpus"
    farm = _farm(tmp_path, [f"sleep 0.1; echo $HPCML_FARM_TASK_ID $CUDA_VISIBLE_DEVICES >> {side}"] * 40)
    p = hpcml("farm", "run", farm, "--gpus", "3", extra={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    assert p.returncode == 0, p.stderr
    seen = [line.split() for line in side.read_text().splitlines()]
    assert len(seen) == 40 and all(len(s) == 2 for s in seen)           # each task sees exactly one GPU
    assert {s[1] for s in seen} == {"0", "1", "2"}                        # three slots, one per GPU
    rec = ends(farm)
    assert all(rec[(int(t), 1)]["gpu"] == g for t, g in seen)             # and the record says which


def _worker_pids(farm: Path) -> list[int]:
    out = []
    for f in (farm / "workers").iterdir():
        try:
            out.append(json.loads(f.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            pass
    return out


def test_kill_9_of_a_worker_loses_nothing(tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before="sleep 0.2; ")] * 30)
    run = start("farm", "run", farm, "--slots", "2")
    wait_for(lambda: count_ends(farm) >= 3 and _worker_pids(farm), what="workers running")
    victim = _worker_pids(farm)[0]
    os.kill(victim, signal.SIGKILL)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert_exactly_once(farm, side, 30)
    lost = [k for k, e in ends(farm).items() if e["outcome"] == "lost"]
    assert lost and all(ends(farm)[k]["worker"].split(".")[2] == str(victim) for k in lost)


def test_kill_9_of_the_coordinator_then_rerun_is_exactly_once(tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before="sleep 0.3; ")] * 40)
    run = start("farm", "run", farm, "--slots", "3")
    wait_for(lambda: count_ends(farm) >= 6, what="some tasks done")
    workers = _worker_pids(farm)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    wait_for(lambda: not any(_alive(p) for p in workers), 10, "workers gone")
    # no process of the farm left (each has its HPCML_FARM_DIR): no task can append any more
    assert not _farm_processes(farm), "a task outlived its worker"
    assert len(side_lines(side)) < 40
    p = hpcml("farm", "run", farm, "--slots", "3")
    assert p.returncode == 0, p.stderr
    assert_exactly_once(farm, side, 40)
    assert any(e["outcome"] == "lost" for e in ends(farm).values())    # the rerun took over the dead claims


def _farm_processes(farm: Path) -> list[psutil.Process]:
    """Live processes whose environment names this farm: its workers and their tasks."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("HPCML_FARM_DIR") == str(farm.absolute()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_two_runs_on_one_farm_at_once_share_it_exactly_once(tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before="sleep 0.05; ")] * 150)
    a, b = start("farm", "run", farm, "--slots", "2"), start("farm", "run", farm, "--slots", "2")
    for r in (a, b):
        r.communicate(timeout=180)
        assert r.returncode == 0
    assert_exactly_once(farm, side, 150)
    by_worker = {e["worker"] for e in ends(farm).values()}
    assert len(by_worker) >= 3                          # both runs took tasks


def test_a_claim_whose_worker_stopped_beating_is_taken_over_after_the_lease(tmp_path):
    """A worker on another host (its record says so) claimed task 0 and went silent: the
    host check cannot apply, so only the lease (heartbeat standing still) can free it."""
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side), side_task(side)])
    wid = "elsewhere.local.1.abc"
    (farm / "workers" / wid).write_text(json.dumps({"schema": "hpcml.farm.worker/1", "worker": wid,
                                                    "host": "not-" + socket.gethostname(), "boot_id": "x",
                                                    "pid": 1, "job": None}))
    (farm / "claims" / "0.1").write_text(json.dumps({"schema": "hpcml.farm.claim/1", "id": 0, "attempt": 1,
                                                     "worker": wid, "node": "elsewhere", "start": time.time()}))
    p = hpcml("farm", "run", farm, "--slots", "1", "--lease", "1 s")
    assert p.returncode == 0, p.stderr
    rec = ends(farm)
    assert rec[(0, 1)]["outcome"] == "lost" and rec[(0, 2)]["outcome"] == "ok"
    assert sorted(side_lines(side)) == [(0, 2), (1, 1)]


def test_a_command_that_fails_on_the_only_node_that_vets_good_retires_nothing(tmp_path):
    """10 tasks of ``exit 1`` on one node: 3 in a row fail, nothing ran them elsewhere, and
    ``hpcml vet --prolog`` finds this machine good: the tasks' failure, said once; the node
    keeps working, every task runs and fails."""
    farm = _farm(tmp_path, ["exit 1"] * 10, retries=0)
    p = hpcml("farm", "run", farm, "--slots", "1", "--node-failures", "3")
    assert p.returncode == 1
    assert not list((farm / "nodes").glob("*.bad"))
    assert len(ends(farm)) == 10 and all(e["outcome"] == "failed" for e in ends(farm).values())
    assert p.stderr.count("the tasks' failure, not the node's") == 1, p.stderr


def _two_nodes(farm: Path, *args: str, env: dict | None = None) -> dict[str, subprocess.CompletedProcess]:
    """``farm run`` as two nodes at once (SLURMD_NODENAME names the node, as on a
    multiple-slurmd host): "bad" and "good"; their outputs."""
    runs = {n: start("farm", "run", farm, "--slots", "1", *args, extra={"SLURMD_NODENAME": n, **(env or {})})
            for n in ("bad", "good")}
    out = {}
    for n, r in runs.items():
        stdout, stderr = r.communicate(timeout=300)
        out[n] = subprocess.CompletedProcess(r.args, r.returncode, stdout, stderr)
    return out


def test_a_node_where_tasks_fail_that_pass_on_another_is_retired_with_its_evidence(tmp_path):
    """20 tasks that fail on node "bad" only (``test $SLURMD_NODENAME != bad``), run by two
    nodes at once with --retries 5: "bad" is retired once tasks that failed there passed on
    "good", the reason says so, the evidence reaches the centre's collector (a real ``hpcml
    centre serve``) as a node report of the farm, and every task ends ok (on "good")."""
    import sqlite3

    from tests.run.test_summary import TOKEN, Collector
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before='sleep 0.2; test "$SLURMD_NODENAME" != bad && ')] * 20,
                 retries=5, backoff=0.1)
    centre = Collector(tmp_path).start()
    try:
        _two_nodes(farm, "--node-failures", "3", env={"HPCML_COLLECTOR": centre.url, "HPCML_COLLECTOR_TOKEN": TOKEN})
    finally:
        centre.stop()
    bad = list((farm / "nodes").glob("*.bad"))
    assert [b.name for b in bad] == ["bad.bad"], bad
    retired = json.loads(bad[0].read_text())
    assert "passed on another node" in retired["reason"], retired
    assert retired["centre"] == f"sent to {centre.url}", retired
    with sqlite3.connect(centre.db) as conn:
        told = conn.execute("SELECT r.node, r.name, r.type, r.outcome, r.message FROM results r").fetchall()
    assert told == [("bad", "farm-tasks", "farm", "fail", retired["reason"])], told
    rec = ends(farm)
    ok = {tid for (tid, _), e in rec.items() if e["outcome"] == "ok"}
    assert ok == set(range(20)) and all(e["node"] == "good" for e in rec.values() if e["outcome"] == "ok")


def test_a_node_is_retired_by_evidence_that_comes_after_its_last_failure(tmp_path):
    """Three tasks fail on "bad", which runs alone first (it vets good, and nothing ran them
    elsewhere: it says it keeps working); it is then frozen (SIGSTOP, its whole tree) before their
    retry back-off ends, and "good" passes all three. Thawed, "bad" has no failure left to
    judge them by, yet the evidence retires it before the farm ends (was: it ended with the
    farm, not retired, and the centre never heard of the node)."""
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before='test "$SLURMD_NODENAME" != bad && ')] * 3,
                 retries=1, backoff=5)
    bad = start("farm", "run", farm, "--slots", "1", "--node-failures", "3", extra={"SLURMD_NODENAME": "bad"})
    said = []                  # its vetting ends with the line that it keeps working
    while not any("keeps working" in line for line in said[-1:]) and (line := bad.stderr.readline()):
        said.append(line)
    assert said and "keeps working" in said[-1], (said, bad.poll())
    tree = [psutil.Process(bad.pid)]
    tree += tree[0].children(recursive=True)
    for p in tree:
        p.suspend()
    try:
        assert sorted(ends(farm)) == [(0, 1), (1, 1), (2, 1)], ends(farm)
        good = start("farm", "run", farm, "--slots", "1", extra={"SLURMD_NODENAME": "good"})
        assert good.wait(timeout=300) == 0, good.communicate()
    finally:
        for p in tree:
            try:
                p.resume()
            except psutil.NoSuchProcess:
                pass
    bad.communicate(timeout=300)
    retired = [json.loads(b.read_text()) for b in (farm / "nodes").glob("*.bad")]
    assert [r["node"] for r in retired] == ["bad"] and "3 of them passed on another node" in retired[0]["reason"], retired
    assert sorted(side_lines(side)) == [(0, 2), (1, 2), (2, 2)]


def test_a_command_that_fails_the_same_way_on_every_node_retires_none(tmp_path):
    """12 tasks of ``exit 3`` on two nodes at once: tasks fail with the same code on both,
    the command's fault: no node is retired, every task fails for good."""
    farm = _farm(tmp_path, ["sleep 0.1; exit 3"] * 12, retries=1, backoff=0.1)
    out = _two_nodes(farm, "--node-failures", "2")
    assert not list((farm / "nodes").glob("*.bad")), [(n, o.stderr[-500:]) for n, o in out.items()]
    rec = ends(farm)
    assert {tid for tid, _ in rec} == set(range(12)) and all(e["outcome"] == "failed" for e in rec.values())


@pytest.mark.parametrize("shell", [False, True])
def test_a_missing_program_fails_like_in_a_shell(tmp_path, shell):
    """The task's exit code is the one /bin/sh gives the same line: 127 for the program
    alone, the pipeline's last command (0) for ``... | cat``; only a non-zero one fails."""
    import subprocess
    command = "no-such-program-xyz" + (" | cat" if shell else "")
    said = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=30).returncode
    assert said == (0 if shell else 127)
    farm = _farm(tmp_path, [command], retries=0)
    hpcml("farm", "run", farm, "--slots", "1")
    rec = ends(farm)[(0, 1)]
    assert rec["exit_code"] == said
    assert rec["outcome"] == ("ok" if said == 0 else "failed")
    assert "no-such-program-xyz" in (farm / "logs" / "0.1.err").read_text()


def test_a_claim_left_empty_by_a_worker_killed_while_writing_it_is_freed_after_the_lease(tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side)])
    (farm / "claims" / "0.1").write_bytes(b"")
    p = hpcml("farm", "run", farm, "--slots", "1", "--lease", "0.5 s")
    assert p.returncode == 0, p.stderr
    rec = ends(farm)
    assert rec[(0, 1)]["outcome"] == "lost" and rec[(0, 2)]["outcome"] == "ok"
    assert side_lines(side) == [(0, 2)]


def test_kill_9_of_a_task_is_a_failure_that_is_retried(tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before='test "$HPCML_FARM_ATTEMPT" -ge 2 || kill -9 $$; ')],
                 retries=1, backoff=0)
    p = hpcml("farm", "run", farm, "--slots", "1")
    assert p.returncode == 0, p.stderr
    rec = ends(farm)
    assert rec[(0, 1)]["outcome"] == "failed" and rec[(0, 1)]["signal"] == signal.SIGKILL
    assert rec[(0, 2)]["outcome"] == "ok" and side_lines(side) == [(0, 2)]


def test_a_worker_fenced_off_by_a_false_suspicion_stops_its_copy(tmp_path):
    """Another worker wrongly judged this one dead and recorded its attempt as lost: the
    owner sees that at its next heartbeat, kills its copy, and its own end is refused."""
    side, pid = tmp_path / "side", tmp_path / "copy1.pid"
    farm = _farm(tmp_path, [side_task(side, before=f'test "$HPCML_FARM_ATTEMPT" -ge 2 || {{ echo $$ > {pid}; sleep 2; }}; ')])
    run = start("farm", "run", farm, "--slots", "1", "--lease", "0.6 s")
    wait_for(lambda: (farm / "claims" / "0.1").exists(), what="attempt 1 claimed")
    # the copy runs before the suspicion comes (a loaded machine started it after the claim)
    wait_for(lambda: pid.exists() and pid.read_text().strip() != "", what="attempt 1's copy running")
    (farm / "ends" / "0.1").write_text(json.dumps({"schema": "hpcml.farm.end/1", "id": 0, "attempt": 1,
                                                   "outcome": "lost", "end": time.time(), "reason": "test"}))
    run.communicate(timeout=60)
    assert run.returncode == 0
    copy = int(pid.read_text())                       # attempt 1's shell: it appends as its last act
    wait_for(lambda: not psutil.pid_exists(copy), what="attempt 1's copy gone")
    assert side_lines(side) == [(0, 2)]
    assert ends(farm)[(0, 1)]["reason"] == "test"      # the owner's own end was refused


def test_a_fenced_attempt_that_succeeded_anyway_is_not_counted_and_the_task_reruns(tmp_path):
    """The suspicion came between two heartbeats and the copy finished: its "ok" is refused
    (the "lost" record stands), so the task runs again and the farm records it ok once."""
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before='test "$HPCML_FARM_ATTEMPT" -ge 2 || sleep 1; ')])
    run = start("farm", "run", farm, "--slots", "1")          # lease 60 s: no heartbeat within the task
    wait_for(lambda: (farm / "claims" / "0.1").exists(), what="attempt 1 claimed")
    (farm / "ends" / "0.1").write_text(json.dumps({"schema": "hpcml.farm.end/1", "id": 0, "attempt": 1,
                                                   "outcome": "lost", "end": time.time(), "reason": "test"}))
    run.communicate(timeout=60)
    assert run.returncode == 0
    rec = ends(farm)
    assert rec[(0, 1)]["outcome"] == "lost" and rec[(0, 2)]["outcome"] == "ok"
    assert_exactly_once(farm, side, 1)


def test_tasks_appended_while_the_farm_runs_are_picked_up(tmp_path):
    """The farm's last original tasks wait until the append is done (at most 60 s), so that
    the farm is still running when it lands, however slowly a loaded machine starts the
    appending command (with sleeps of 1 s, a loaded suite once saw the farm end first)."""
    side, appended = tmp_path / "side", tmp_path / "appended"
    wait = f"for _ in $(seq 600); do [ -e {appended} ] && break; sleep 0.1; done; "
    (tmp_path / "a.txt").write_text("".join(side_task(side, str(i), before="sleep 0.3; " if i == 0 else wait)
                                            + "\n" for i in range(3)))
    (tmp_path / "b.txt").write_text("".join(side_task(side, str(i), before="sleep 0.3; ") + "\n" for i in range(3, 5)))
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "a.txt").returncode == 0
    run = start("farm", "run", farm, "--slots", "1")
    wait_for(lambda: count_ends(farm) >= 1, what="first task done")
    added = json.loads(hpcml("farm", "create", farm, tmp_path / "b.txt", "--json").stdout)
    appended.touch()
    assert added["schema"] == "hpcml.farm.create/1" and (added["added"], added["total"]) == (2, 5)
    run.communicate(timeout=60)
    assert run.returncode == 0
    assert_exactly_once(farm, side, 5)
