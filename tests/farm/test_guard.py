"""A task's whole process tree dies with its attempt (guard.py): under kill -9 of the farm's
process group at random moments, at the end of an attempt that daemonised something, and
before a lost attempt is rerun. "Nothing left running" is checked by looking for the task's
own processes (a unique marker in their command line); "exactly once" by the side file the
tasks append to (farmtools.assert_exactly_once)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from tests.farm.farmtools import assert_exactly_once, count_ends, ends, env, hpcml, side_lines, wait_for


def _marked(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(marker in a for a in p.info["cmdline"] or ()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _script(tmp_path: Path, body: str) -> tuple[str, Path]:
    """A task script in a directory named by a unique marker; the task runs it under an
    outer ``sh -c`` (the ``cd``), so the marked process is a grandchild of the worker."""
    marker = f"tree-{uuid.uuid4().hex[:10]}"
    d = tmp_path / marker
    d.mkdir()
    (d / "task.sh").write_text(body)
    return marker, d / "task.sh"


def _farm(tmp_path: Path, command: str, n: int, **settings) -> Path:
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(f"{command} #{i}") for i in range(n)], settings)
    return farm


def _start_in_own_group(*args) -> subprocess.Popen:
    """``hpcml farm run`` as a shell starts a job: leader of its own process group."""
    return subprocess.Popen([sys.executable, "-m", "hpcml", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env(), start_new_session=True)


def _farm_processes(farm: Path) -> list[psutil.Process]:
    return _marked(str(farm))


def test_kill_9_of_the_farms_group_at_random_moments_leaves_no_task_running(tmp_path):
    side = tmp_path / "side"
    marker, script = _script(tmp_path, f"sleep 0.5\necho $HPCML_FARM_TASK_ID $HPCML_FARM_ATTEMPT >> {side}\n")
    farm = _farm(tmp_path, f"cd /tmp && sh {script}", 40)
    rng = random.Random(28)
    kills = 0
    while kills < 10 and count_ends(farm) < 30:
        run = _start_in_own_group("farm", "run", farm, "--slots", "2")
        wait_for(lambda: bool(_marked(marker)), 60, "a task running")
        time.sleep(rng.uniform(0.0, 0.6))                 # a random moment of a task's life
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        kills += 1
        # the guards clean up and exit; then nothing of any task may be left
        wait_for(lambda: not _farm_processes(farm), 60, "the farm's workers and guards gone")
        left = _marked(marker)
        assert not left, f"kill {kills}: tasks outlived the farm: {[p.info['cmdline'] for p in left]}"
    p = hpcml("farm", "run", farm, "--slots", "2")
    assert p.returncode == 0, p.stderr
    assert kills >= 3
    assert_exactly_once(farm, side, 40)
    assert any(e["outcome"] == "lost" for e in ends(farm).values())


def test_a_task_whose_attempts_are_lost_again_and_again_is_never_failed_for_good(tmp_path):
    """kill -9 of the farm's process group while its one task runs, 5 times (each attempt
    lost: the farm killed, nothing the task did); then the farm runs the task to "ok" with
    --retries 0: lost attempts never count against its retries."""
    side = tmp_path / "side"
    marker, script = _script(tmp_path, f"sleep 30\necho $HPCML_FARM_TASK_ID $HPCML_FARM_ATTEMPT >> {side}\n")
    farm = _farm(tmp_path, f"sh {script}", 1)
    for _ in range(5):
        run = _start_in_own_group("farm", "run", farm, "--slots", "1", "--retries", "0")
        wait_for(lambda: bool(_marked(marker)), 60, "the task running")
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        wait_for(lambda: not _farm_processes(farm), 60, "the farm's workers and guards gone")
    (tmp_path / marker / "task.sh").write_text(f"echo $HPCML_FARM_TASK_ID $HPCML_FARM_ATTEMPT >> {side}\n")
    p = hpcml("farm", "run", farm, "--slots", "1", "--retries", "0")
    assert p.returncode == 0, p.stderr
    rec = ends(farm)
    assert [e["outcome"] for _, e in sorted(rec.items())] == ["lost"] * 5 + ["ok"], rec
    assert side_lines(side) == [(0, 6)]


def test_what_a_task_daemonises_is_killed_at_the_attempts_end(tmp_path):
    marker, daemon = _script(tmp_path, "sleep 987\n")
    cmds = [f"setsid sh {daemon} & true", f"nohup sh {daemon} >/dev/null 2>&1 &",
            f"(setsid sh {daemon} &) ; exit 3"]
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(c) for c in cmds], {"retries": 0})
    p = hpcml("farm", "run", farm, "--slots", "2", "--node-failures", "0")
    assert p.returncode == 1, p.stderr                    # the third exits 3: leftovers die on failure too
    assert [ends(farm)[(i, 1)]["outcome"] for i in range(3)] == ["ok", "ok", "failed"]
    left = _marked(marker)
    assert not left, [p.info["cmdline"] for p in left]


@pytest.mark.parametrize("prefix", ["", "env -i "], ids=["marked", "environment-cleared"])
def test_a_lost_attempt_left_running_by_a_killed_guard_is_killed_before_the_rerun(tmp_path, prefix):
    """Guard, worker and agent all killed: nothing of the farm is left to clean up, and the
    task's grandchild lives on (re-parented to init). The rerun proves it gone first: by
    its task variables, or, where it cleared its environment, by the session the claim
    recorded."""
    side = tmp_path / "side"
    marker, script = _script(tmp_path, f'echo "$1" "$2" >> {side}\ntest "$2" -ge 2 || sleep 600\n')
    farm = _farm(tmp_path, f"cd /tmp && {prefix}sh {script} $HPCML_FARM_TASK_ID $HPCML_FARM_ATTEMPT", 1)
    run = _start_in_own_group("farm", "run", farm, "--slots", "1")
    wait_for(lambda: bool(_marked(marker)), 60, "attempt 1 running")
    worker = json.loads(next((farm / "workers").iterdir()).read_text())["pid"]
    guard = psutil.Process(worker).ppid()
    try:
        os.killpg(run.pid, signal.SIGSTOP)                # the agent must not clean up either
        os.kill(guard, signal.SIGKILL)
        wait_for(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == "zombie", 30,
                 "the worker dead with its guard")
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        wait_for(lambda: not _farm_processes(farm), 60, "the farm's processes gone")
        assert _marked(marker), "the scenario needs attempt 1's task still running"
        p = hpcml("farm", "run", farm, "--slots", "1")
        assert p.returncode == 0, p.stderr
        assert not _marked(marker)                         # killed before attempt 2 ran
        assert ends(farm)[(0, 1)]["outcome"] == "lost" and side_lines(side) == [(0, 1), (0, 2)]
    finally:
        for proc in _marked(marker):
            proc.kill()


def test_the_sweep_kills_a_recorded_session_but_never_one_whose_id_was_reused(tmp_path):
    """A session id is reused only once nothing is left in it, so a recorded session whose
    id now names a newer process is gone: sweeping it must kill nothing."""
    from hpcml.farm.guard import sweep

    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        start = psutil.Process(victim.pid).create_time()
        assert sweep(victim.pid, start - 100.0, [], timeout=5)       # recorded earlier: someone else's now
        assert victim.poll() is None
        assert sweep(victim.pid, None, [], timeout=5)                  # a claim without a start time (damaged,
        assert victim.poll() is None                                   # forged) names no session it may kill
        assert sweep(victim.pid, start, [], timeout=30)                # the recorded one: killed, proven gone
        assert victim.wait(timeout=30) == -signal.SIGKILL
    finally:
        victim.kill()
        victim.wait()


def test_a_worker_killed_on_its_own_is_replaced_and_its_task_rerun_without_a_traceback(tmp_path):
    """kill -9 of just the workers (not their guards, not the agent): each guard kills its
    worker's task tree and ends as its worker did (SIGKILL, not a traceback and exit 1),
    so the agent starts a new worker in the slot and the farm finishes."""
    side = tmp_path / "side"
    marker, script = _script(tmp_path, f'echo "$1" "$2" >> {side}\ntest "$2" -ge 2 || sleep 600\n')
    farm = _farm(tmp_path, f"cd /tmp && sh {script} $HPCML_FARM_TASK_ID $HPCML_FARM_ATTEMPT", 2)
    run = subprocess.Popen([sys.executable, "-m", "hpcml", "farm", "run", str(farm), "--slots", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                           start_new_session=True)
    try:
        wait_for(lambda: len(side_lines(side)) == 2, 60, "both tasks' attempt 1 running")
        for f in (farm / "workers").iterdir():
            os.kill(json.loads(f.read_text())["pid"], signal.SIGKILL)
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0 and "Traceback" not in err, err
        assert not _marked(marker)
        assert sorted(side_lines(side)) == [(0, 1), (0, 2), (1, 1), (1, 2)]
        assert {k: e["outcome"] for k, e in ends(farm).items()} == {(0, 1): "lost", (0, 2): "ok",
                                                                     (1, 1): "lost", (1, 2): "ok"}
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for proc in _marked(marker):
            proc.kill()


def test_a_killed_guards_escaped_grandchild_is_killed_by_the_agent_before_the_rerun(tmp_path):
    """kill -9 of just the guard: its tree re-parents to the agent. A grandchild in a
    session of its own with its environment cleared (``setsid env -i``), whose parent was
    in the task's group, is found by no sweep: the agent kills the whole adopted tree, not
    just its process groups, so it does not run beside the rerun."""
    side = tmp_path / "side"
    marker = f"tree-{uuid.uuid4().hex[:10]}"
    body = (f'if test "$2" -ge 2; then echo "$1" "$2" >> {side}; exit 0; fi\n'
            f"bash -c \"setsid env -i sh -c 'while :; do sleep 0.1; done' {marker}; sleep 600\" &\n"
            f'echo "$1" "$2" >> {side}\nsleep 600\n')
    script = tmp_path / "task.sh"
    script.write_text(body)
    farm = _farm(tmp_path, f"bash {script} $HPCML_FARM_TASK_ID $HPCML_FARM_ATTEMPT", 1)
    run = _start_in_own_group("farm", "run", farm, "--slots", "1")
    try:
        wait_for(lambda: bool(_marked(marker)) and side_lines(side) == [(0, 1)], 60, "attempt 1 and its grandchild")
        worker = json.loads(next((farm / "workers").iterdir()).read_text())["pid"]
        psutil.Process(psutil.Process(worker).ppid()).kill()         # the guard, alone
        assert run.wait(timeout=120) == 0
        assert not _marked(marker), "attempt 1's grandchild outlived its attempt"
        assert side_lines(side) == [(0, 1), (0, 2)] and ends(farm)[(0, 1)]["outcome"] == "lost"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for proc in _marked(marker):
            proc.kill()
