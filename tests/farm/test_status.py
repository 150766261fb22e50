"""``hpcml farm status`` counts what happened: failed under the retries the run was given,
a dead worker's attempt as lost (not running), a damaged claim or end as damaged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema

from hpcml import schemas
from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from tests.farm.farmtools import env, hpcml, side_lines, side_task, wait_for


def _status(farm: Path) -> dict:
    p = hpcml("farm", "status", farm, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    jsonschema.validate(doc, schemas.load("farm.status"), cls=jsonschema.Draft202012Validator)
    return doc


def test_failed_after_run_retries_1_not_retrying(tmp_path):
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec("exit 3")], {})                   # the farm says retries 2
    p = hpcml("farm", "run", farm, "--slots", "1", "--retries", "1", "--backoff", "0")
    assert p.returncode == 1
    st = _status(farm)
    assert st["counts"]["failed"] == 1 and st["counts"]["retrying"] == 0, st["counts"]
    assert st["failed"][0]["attempts"] == 2 and st["failed"][0]["exit_code"] == 3


def test_a_dead_workers_attempt_is_lost_not_running(tmp_path):
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec("sleep 600"), TaskSpec("true")], {})
    run = subprocess.Popen([sys.executable, "-m", "hpcml", "farm", "run", str(farm), "--slots", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
    wait_for(lambda: (farm / "claims" / "0.1").exists() and any((farm / "workers").iterdir()), 60, "task 0 running")
    before = _status(farm)
    assert before["counts"]["running"] == 1 and before["workers"] == 1, before
    worker = json.loads(next((farm / "workers").iterdir()).read_text())["pid"]
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    wait_for(lambda: not os.path.exists(f"/proc/{worker}"), 60, "the worker gone")
    st = _status(farm)
    assert st["counts"]["running"] == 0 and st["counts"]["lost"] == 1 and not st["running"], st["counts"]
    assert st["workers"] == 0 and st["eta_s"] is None, st    # its file is left, its pid is gone
    assert not st["done"]
    rows = json.loads(hpcml("farm", "results", farm, "--json").stdout)["rows"]
    assert rows[0]["state"] == "lost"


def _claimed_by_a_dead_worker(tmp_path, tasks: int, claimed: tuple[int, ...]):
    """A farm of ``tasks`` side-effect tasks whose ``claimed`` ones hold a claim of attempt 1
    by a worker that no longer exists; the side file, the farm and the claim record."""
    side = tmp_path / "side"
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(side_task(side, str(i))) for i in range(tasks)], {})
    claim = {"schema": "hpcml.farm.claim/1", "attempt": 1, "worker": "gone.local.1.x", "node": "n"}
    for tid in claimed:
        (farm / "claims" / f"{tid}.1").write_text(json.dumps({**claim, "id": tid}))
    return side, farm, claim


def test_damaged_claims_and_ends_are_shown_warned_of_once_and_rerun(tmp_path):
    side, farm, _ = _claimed_by_a_dead_worker(tmp_path, 4, (0, 1))
    (farm / "ends" / "0.1").write_bytes(b"")                                       # empty
    (farm / "ends" / "1.1").write_text('{"schema": "hpcml.farm.end/1", "id": 1, "att')   # truncated
    (farm / "claims" / "2.1").write_text('{"schema": "hpcml.fa')                   # truncated claim, no end
    st = _status(farm)
    assert st["counts"]["damaged"] == 3 and st["counts"]["running"] == 0, st["counts"]
    p = hpcml("farm", "run", farm, "--slots", "2", "--lease", "1 s")
    assert p.returncode == 0, p.stderr
    warnings = [line for line in p.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 3 and all(w.startswith("hpcml farm: warning: ") and "is damaged" in w
                                      for w in warnings), p.stderr
    assert {w.split()[3] for w in warnings} == {str(farm / "ends" / "0.1"), str(farm / "ends" / "1.1"),
                                                 str(farm / "claims" / "2.1")}
    assert sorted(side_lines(side)) == [(0, 2), (1, 2), (2, 2), (3, 1)]
    assert _status(farm)["counts"]["ok"] == 4
    again = hpcml("farm", "run", farm, "--slots", "1")
    assert again.returncode == 0 and "warning" not in again.stderr                  # once, not at every run


def test_claims_and_ends_of_odd_kinds_are_damaged_not_read(tmp_path):
    """A FIFO, a symlink to /dev/zero, a directory, a huge sparse file, JSON nested past the
    parser's depth in place of a record:
    status and run neither hang on them nor read them into memory; each is damaged, rerun."""
    side, farm, _ = _claimed_by_a_dead_worker(tmp_path, 5, (0, 1, 2))
    os.mkfifo(farm / "ends" / "0.1")                                              # a FIFO: open() waits
    (farm / "ends" / "1.1").mkdir()                                               # a directory
    with open(farm / "ends" / "2.1", "wb") as f:                                  # 64 GiB, sparse
        f.truncate(1 << 36)
    os.symlink("/dev/zero", farm / "claims" / "3.1")                              # endless, no end
    (farm / "claims" / "4.1").write_text("[" * 500_000)                           # too deep for json
    st = _status(farm)
    assert st["counts"]["damaged"] == 5 and st["counts"]["running"] == 0, st["counts"]
    p = hpcml("farm", "run", farm, "--slots", "2", "--lease", "1 s", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert sorted(side_lines(side)) == [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2)]
    assert _status(farm)["counts"]["ok"] == 5


def test_records_with_a_field_of_the_wrong_type_are_damaged_not_a_traceback(tmp_path):
    """Valid JSON with the right outcome but a field of the wrong type ("end": "soon", a
    list for "start", a string for the claim's session): status, run and results say
    damaged and rerun the task; no ValueError/TypeError traceback."""
    side, farm, claim = _claimed_by_a_dead_worker(tmp_path, 4, (0, 1))
    end = {"schema": "hpcml.farm.end/1", "attempt": 1}
    (farm / "ends" / "0.1").write_text(json.dumps({**end, "id": 0, "outcome": "failed", "end": "soon", "retries": "x"}))
    (farm / "ends" / "1.1").write_text(json.dumps({**end, "id": 1, "outcome": "ok", "end": 2.0, "start": [1]}))
    (farm / "claims" / "2.1").write_text(json.dumps({**claim, "id": 2, "start": "now",
                                                     "tree": {"session": "1", "since": None}}))
    st = _status(farm)
    assert st["counts"]["damaged"] == 3 and st["counts"]["running"] == 0, st["counts"]
    p = hpcml("farm", "run", farm, "--slots", "2", "--lease", "1 s")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert sorted(side_lines(side)) == [(0, 2), (1, 2), (2, 2), (3, 1)]
    assert _status(farm)["counts"]["ok"] == 4
    r = hpcml("farm", "results", farm)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_a_farm_missing_a_sub_directory_is_one_line_not_a_traceback(tmp_path):
    """ends/ removed by hand (to "reset" a farm, say): status and run say so in one line,
    exit 2, and ``farm create`` on it again makes it whole."""
    side = tmp_path / "side"
    farm = tmp_path / "farm"
    src = tmp_path / "tasks.txt"
    src.write_text(side_task(side, "0") + "\n")
    assert hpcml("farm", "create", farm, src).returncode == 0
    (farm / "ends").rmdir()
    for cmd in (("status",), ("run", "--slots", "1")):
        p = hpcml("farm", *cmd, farm)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "ends/ is missing" in p.stderr, p.stderr
    assert hpcml("farm", "create", farm, src).returncode == 0
    assert hpcml("farm", "run", farm, "--slots", "1").returncode == 0
    assert side_lines(side) == [(0, 1)]


def test_status_asks_slurm_only_about_workers_whose_heartbeat_is_fresh(tmp_path, monkeypatch):
    """A farm resumed by many allocations keeps the worker files of those that ended (time
    limit, scancel): their heartbeats stopped a lease ago, so status shows them dead without
    one ``scontrol`` per ended allocation (seconds each while the controller is busy)."""
    from hpcml.cluster import slurm
    from hpcml.farm.status import summarize
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec("true")], {})
    asked: list[str] = []
    monkeypatch.setattr(slurm, "job_state", lambda job, **kw: asked.append(job) or "RUNNING")
    old = 1_000_000_000.0                                       # long before any lease
    for job in ("101", "102", "103", "104"):
        wid = f"n1.{job}.7.abcdef"
        (farm / "workers" / wid).write_text(json.dumps({"worker": wid, "host": "elsewhere", "pid": 7, "job": job}))
        if job != "104":
            os.utime(farm / "workers" / wid, (old, old))
    assert summarize(farm)["workers"] == 1                      # 104: a fresh heartbeat, its job running
    assert asked == ["104"]


def test_a_failed_tasks_lost_last_attempt_has_no_exit_code_or_signal(tmp_path):
    """Attempt 1 failed (retries 0); attempt 2, run with --retries 1, lost its worker: the task
    is failed and its last attempt ended neither with an exit code nor a signal, so the table
    says neither (it said "signal None")."""
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec("exit 3")], {"retries": 0})
    assert hpcml("farm", "run", farm, "--slots", "1", "--backoff", "0").returncode == 1
    claim = {"schema": "hpcml.farm.claim/1", "id": 0, "attempt": 2, "worker": "gone.local.1.x", "node": "n"}
    (farm / "claims" / "0.2").write_text(json.dumps(claim))
    (farm / "ends" / "0.2").write_text(json.dumps({"schema": "hpcml.farm.end/1", "id": 0, "attempt": 2, "outcome": "lost",
                                                   "end": 2.0, "node": "n", "worker": "gone.local.1.x",
                                                   "reason": "its worker died"}))
    st = _status(farm)
    assert st["counts"]["failed"] == 1 and st["failed"][0]["outcome"] == "lost"
    assert (st["failed"][0]["exit_code"], st["failed"][0]["signal"]) == (None, None)
    p = hpcml("farm", "status", farm, extra={"COLUMNS": "200"})
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if "lost" in line and "0.2.err" in line)
    assert [c.strip() for c in row.strip("│ ").split("│")][:4] == ["0", "2", "lost", "–"], row
    assert "signal None" not in p.stdout
