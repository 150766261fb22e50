"""A requeued attempt whose ``hpcml run`` Slurm killed before it wrote its end (``KillWait``
after the requeue's TERM: 2 s on the test cluster, 30 s by default). The end to end path,
with the real Checkpointer's requeue on the local cluster, is test_run_slurm's USR1 test.

The directory is as attempt 0 leaves it: run.json with no end, a store whose rank 1 ended
143 (the requeue's TERM), the marker the Checkpointer wrote through ``requeue.note``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

from hpcml import schemas
from hpcml.cluster import requeue
from hpcml.errors import UsageError
from hpcml.jobmodel import RunRecord
from hpcml.observe.store import read_meta
from hpcml.run import ending, jobdir
from hpcml.testing.synthetic_job import make_job

GONE = {"pid": 2 ** 22 + 1, "host": "n1", "created": 1.0}


def write(d, doc: dict, exclusive: bool = False) -> None:
    """run.json as the launcher writes it: through its model."""
    jobdir.write_run(d, RunRecord.model_validate(doc), exclusive)


def concluded(d, prev: dict, restart: int) -> dict:
    """The next attempt's record of ``prev`` (``ending.conclude``), as run.json holds it."""
    return ending.conclude(d, RunRecord.model_validate(prev), restart).to_json()


def finished(d, info: dict, rc: int) -> int:
    """The launcher's end of the attempt ``info`` (``ending.finish``): its exit code."""
    return ending.finish(d, RunRecord.model_validate(info), rc)[0]


def _valid(doc: dict, name: str) -> dict:
    jsonschema.validate(doc, schemas.load(name), cls=jsonschema.Draft202012Validator)
    return doc


def _attempt0(d, monkeypatch) -> None:
    store = make_job(jobdir.observe_dir(d), n_ranks=2, n_steps=50, ranks_per_node=1, gpu=False, job_id="77")
    killed = json.loads((store / "rank-00001.json").read_text()) | {"exit_code": 143}
    (store / "rank-00001.json").write_text(json.dumps(killed))
    write(d, {"command": ["python", "train.py"], "mode": "slurm", "job_id": "77", "attempt": 0,
                         "started": killed["start"], "launcher": GONE, "ntasks": 2})
    for k, v in {"HPCML_RUN_DIR": str(d), "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(k, v)
    requeue.note(50, "SIGUSR1", d / "ckpt")


def test_the_next_attempt_records_the_killed_one_as_requeued_and_the_report_says_so(tmp_path, monkeypatch):
    d = tmp_path / "job"
    d.mkdir()
    _attempt0(d, monkeypatch)
    prev = json.loads((d / "run.json").read_text())
    assert jobdir.is_requeue(prev, "77", 1)
    earlier = concluded(d, prev, 1)
    assert earlier["requeued"]["step"] == 50 and earlier["exit_code"] == 0 and earlier["first_failure"] is None
    assert earlier["end_recorded_by_next_attempt"] and earlier["ended"] > earlier["started"]
    make_job(jobdir.observe_dir(d, 1), n_ranks=2, n_steps=50, ranks_per_node=1, gpu=False, job_id="77")
    later = earlier["ended"] + 600
    write(d, {"command": ["python", "train.py"], "mode": "slurm", "job_id": "77", "attempt": 1,
                         "started": later, "ended": later + 10, "exit_code": 0, "first_failure": None,
                         "requeued": None, "launcher": GONE, "ntasks": 2, "attempts": [earlier]})
    _valid(json.loads((d / "run.json").read_text()), "run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_RUN"))}
    p = subprocess.run([sys.executable, "-m", "hpcml", "report", str(d), "--json"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    rep = _valid(json.loads(p.stdout), "run.report")
    kinds = [f["kind"] for f in rep["findings"]]
    assert "attempt 0 checkpointed at step 50 and requeued (SIGUSR1); attempt 1 started 600 s later" \
        in rep["findings"][0]["message"], rep["findings"]
    assert "failed_rank" not in kinds and "job_stall" not in kinds and "launcher_killed" not in kinds, kinds
    assert rep["attempts"][0]["requeue_gap_s"] == 600 and rep["attempts"][0]["observe"]["ranks_with_data"] == 2


def test_a_marker_of_another_attempt_or_job_is_not_this_attempts_requeue(tmp_path, monkeypatch):
    d = tmp_path / "job"
    d.mkdir()
    _attempt0(d, monkeypatch)
    assert requeue.find(d, "77", 0, ask_slurm=False)["step"] == 50
    assert requeue.find(d, "77", 1, ask_slurm=False) is None      # attempt 0's marker, seen by attempt 1
    assert requeue.find(d, "78", 0, ask_slurm=False) is None
    requeue.withdraw(d / requeue.MARKER)                         # scontrol requeue failed: no requeue
    assert requeue.find(d, "77", 0, ask_slurm=False) is None
    monkeypatch.delenv("HPCML_RUN_DIR")
    assert requeue.note(50, "SIGUSR1", d) is None                # outside hpcml run: nothing written


def test_a_requeue_the_launcher_did_not_see_is_recorded_by_the_next_attempt(tmp_path, monkeypatch):
    """Requeued by someone else (no marker), before Slurm's restart count moved: attempt 0's
    launcher wrote rank 1's 143 as a failure; attempt 1, under a higher restart count, knows."""
    d = tmp_path / "job"
    d.mkdir()
    _attempt0(d, monkeypatch)
    requeue.withdraw(d / requeue.MARKER)
    prev = json.loads((d / "run.json").read_text()) | {"ended": 5.0, "exit_code": 143, "requeued": None,
                                                        "first_failure": {"rank": 1, "exit_code": 143}}
    earlier = concluded(d, prev, 1)
    assert earlier["requeued"] == {"by": "slurm", "restart_count": 1}, earlier
    assert earlier["exit_code"] == 0 and earlier["first_failure"] is None and earlier["ended"] == 5.0
    assert requeue.describe(earlier["requeued"]) == "requeued by Slurm (restart count now 1)"


def test_an_attempt_that_ended_on_its_own_keeps_its_exit_when_the_job_is_requeued(tmp_path):
    """Vetting aborted attempt 0 (exit 4, the command never started) or its srun could not
    launch (exit 1, no rank recorded), and the batch script requeued the job: the record of
    attempt 0 that attempt 1 keeps still says how it ended."""
    d = tmp_path / "job"
    d.mkdir()
    for own in ({"exit_code": 4, "aborted": True}, {"exit_code": 1, "launcher_exit_code": 1}):
        prev = {"command": ["python", "train.py"], "mode": "slurm", "job_id": "77", "attempt": 0, "started": 1.0,
                "ended": 2.0, "first_failure": None, "requeued": None, "launcher": GONE, **own}
        assert jobdir.is_requeue(prev, "77", 1)
        earlier = concluded(d, prev, 1)
        assert earlier["exit_code"] == own["exit_code"] and earlier["ended"] == 2.0, earlier


def test_a_launcher_slurm_could_not_reach_does_not_overwrite_the_next_attempts_record(tmp_path):
    """Slurm requeued the job while attempt 0's launcher still ran on a node cut off from
    it; attempt 1, on another host, took the directory. When the old launcher ends, the
    record stays attempt 1's."""
    d = tmp_path / "job"
    d.mkdir()
    info = {"command": ["python", "train.py"], "mode": "slurm", "job_id": "77", "attempt": 0, "started": 1.0,
            "launcher": jobdir.launcher()}
    write(d, info, exclusive=True)
    prev = json.loads((d / "run.json").read_text()) | {"launcher": GONE}        # as seen from the other host
    assert jobdir.is_requeue(prev, "77", 1)
    write(d, {**info, "attempt": 1, "launcher": GONE, "attempts": [concluded(d, prev, 1)]})
    assert finished(d, dict(info), 0) == 0
    run = json.loads((d / "run.json").read_text())
    assert run["attempt"] == 1 and run["attempts"][0]["attempt"] == 0 and "ended" not in run, run


def test_a_rank_that_failed_in_an_attempt_that_was_requeued_is_still_a_failure(tmp_path, monkeypatch):
    """Rank 1 crashed (exit 1); srun's TERM made rank 0's Checkpointer take its final
    checkpoint and requeue the job. The attempt is requeued *and* failed: its exit is 1, and
    the report's line for it says both, not only 'requeued'."""
    from hpcml.run.report import build, summary
    d = tmp_path / "job"
    d.mkdir()
    _attempt0(d, monkeypatch)
    store = jobdir.observe_dir(d)
    for rank, code in ((0, 143), (1, 1)):
        meta = json.loads((store / f"rank-{rank:05d}.json").read_text()) | {"exit_code": code}
        (store / f"rank-{rank:05d}.json").write_text(json.dumps(meta))
    info = json.loads((d / "run.json").read_text())
    assert finished(d, info, 1) == 1
    prev = json.loads((d / "run.json").read_text())
    make_job(jobdir.observe_dir(d, 1), n_ranks=2, n_steps=50, ranks_per_node=1, gpu=False, job_id="77")
    write(d, {**info, "attempt": 1, "started": prev["ended"] + 60, "ended": prev["ended"] + 70,
                         "exit_code": 0, "first_failure": None, "requeued": None,
                         "attempts": [concluded(d, prev, 1)]})
    for k in ("HPCML_RUN_DIR", "SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(k)
    lines = summary(build(d))
    assert any(line.strip().startswith("attempt 0: checkpointed at step 50 and requeued (SIGUSR1), exit code 1")
               for line in lines), lines


def test_observe_report_on_a_requeued_jobs_directory_names_its_stores(tmp_path, monkeypatch):
    """``hpcml observe report`` (and ``hpcml score``) read one store: given the job directory
    of a requeued hpcml run, the error names where each attempt's store is and hpcml report."""
    d = tmp_path / "job"
    d.mkdir()
    _attempt0(d, monkeypatch)
    with pytest.raises(UsageError) as err:
        read_meta(d)
    assert str(d / "observe") in str(err.value) and f"hpcml report {d}" in str(err.value), err.value
