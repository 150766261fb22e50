"""Two jobs pointed at one checkpoint directory, as two real processes: the second is
refused in one line naming the first, unless the first has ended, is the same (requeued)
Slurm job, or is taken over; a job taken over cannot commit any more."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.ckpt import Checkpointer
from hpcml.run.jobdir import log_path
from tests import needs

TASK = Path(__file__).with_name("task.py")
TRAIN = Path(__file__).resolve().parents[2] / "examples" / "ckpt" / "train_resume.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    # no Slurm client on PATH: liveness from the pid (a client without a controller would
    # retry for tens of seconds before job_state's deadline says "cannot tell")
    env["PATH"] = os.path.dirname(sys.executable)
    return {**env, **extra}


def _until(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


def _holder(ck: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A job that has opened the directory and waits for a line on stdin before saving."""
    p = subprocess.Popen([sys.executable, str(TASK), str(ck), "--hold", *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or _env())
    assert p.stdout is not None
    first = p.stdout.readline()
    assert first.startswith("resumed at"), first + p.communicate(timeout=30)[1]
    assert p.stdout.readline() == "ready\n"
    return p


def _run(ck: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TASK), str(ck), *args], capture_output=True, text=True,
                          timeout=120, env=env or _env())


def _release(p: subprocess.Popen) -> tuple[int, str]:
    out, _ = p.communicate("go\n", timeout=120)
    return p.returncode, out


def test_the_example_refused_says_it_in_one_line_with_exit_2(tmp_path):
    """The README's refusal (one line naming the first, exit 2) as a user running the example
    sees it: not a traceback with exit 1."""
    ck = tmp_path / "ck"
    first = _holder(ck, "--at", "3")
    try:
        second = subprocess.run([sys.executable, str(TRAIN), str(ck), "--steps", "2", "--size-mb", "0.01"],
                                capture_output=True, text=True, timeout=120, env=_env())
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"pid {first.pid}" in second.stderr and "in use by another job" in second.stderr
    finally:
        rc, _ = _release(first)
    assert rc == 0


def test_a_second_job_is_refused_in_one_line_naming_the_first(tmp_path):
    ck = tmp_path / "ck"
    first = _holder(ck, "--at", "3")
    try:
        second = _run(ck, "--at", "9")
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stdout.count("\n") == 1 and "Traceback" not in second.stderr
        assert f"pid {first.pid}" in second.stdout and "in use by another job" in second.stdout
        assert not list(ck.glob("*9"))                     # it wrote nothing
    finally:
        rc, out = _release(first)
    assert rc == 0 and "done at 3" in out
    state, step = Checkpointer(ck, read_only=True).load_latest()
    assert step == 3 and int(state["step"]) == 3


def test_two_jobs_starting_together_one_wins(tmp_path):
    """Both claim at once (a stale owner record left by a killed job makes both race through
    the take-over path): exactly one gets the directory."""
    ck = tmp_path / "ck"
    dead = _holder(ck)
    dead.kill()
    dead.wait()
    procs = [subprocess.Popen([sys.executable, str(TASK), str(ck), "--hold", "--at", "1"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for _ in range(2)]
    firsts = []
    for p in procs:
        assert p.stdout is not None
        firsts.append(p.stdout.readline())
    outs = [p.communicate("go\n", timeout=120)[0] for p in procs]
    refused = [f for f in firsts if f.startswith("refused:")]
    assert len(refused) == 1, (firsts, outs)


def test_a_killed_job_is_taken_over_without_asking(tmp_path):
    ck = tmp_path / "ck"
    first = _holder(ck, "--at", "2")
    first.kill()
    first.wait()
    out = _run(ck, "--at", "4")
    assert out.returncode == 0 and "done at 4" in out.stdout, out.stdout + out.stderr


def test_a_killed_job_not_yet_reaped_is_taken_over(tmp_path):
    """A kill -9 loop that restarts the job before it waits for the killed one: the killed
    process is a zombie (its pid and start time still there), not a running owner."""
    import psutil
    ck = tmp_path / "ck"
    first = _holder(ck, "--at", "2")
    try:
        _until(lambda: (ck / ".owner").exists())
        first.kill()
        _until(lambda: psutil.Process(first.pid).status() == psutil.STATUS_ZOMBIE)
        assert psutil.Process(first.pid).status() == psutil.STATUS_ZOMBIE
        out = _run(ck, "--at", "4")
        assert out.returncode == 0 and "done at 4" in out.stdout, out.stdout + out.stderr
    finally:
        first.wait()


def test_a_requeued_slurm_job_is_the_same_owner_another_job_is_not(tmp_path):
    ck = tmp_path / "ck"
    first = _holder(ck, env=_env(SLURM_JOB_ID="777", SLURM_RESTART_COUNT="0"))
    try:
        other = _run(ck, "--at", "2", env=_env(SLURM_JOB_ID="778"))
        assert other.returncode == 2 and "Slurm job 777" in other.stdout, other.stdout
        same = _run(ck, "--at", "1", env=_env(SLURM_JOB_ID="777", SLURM_RESTART_COUNT="1"))
        assert same.returncode == 0, same.stdout + same.stderr
    finally:
        first.kill()
        first.wait()


def test_take_over_fences_the_job_it_took_over(tmp_path):
    """The first job still runs; the second takes over and commits; the first's next commit
    is refused, so it never prunes nor overwrites the second's checkpoints."""
    ck = tmp_path / "ck"
    first = _holder(ck, "--at", "3")
    try:
        second = _run(ck, "--at", "7", "--take-over")
        assert second.returncode == 0, second.stdout + second.stderr
    finally:
        rc, out = _release(first)
    assert rc == 3 and "taken over by another job" in out, out
    state, step = Checkpointer(ck, read_only=True).load_latest()
    assert step == 7 and not (ck / "step-00000003").exists()


def test_a_reader_beside_a_running_job_is_not_refused(tmp_path):
    ck = tmp_path / "ck"
    first = _holder(ck, "--at", "3")
    try:
        _until(lambda: (ck / ".owner").exists())
        assert Checkpointer(ck, read_only=True).load_latest() == (None, None)
    finally:
        rc, _ = _release(first)
    assert rc == 0


@pytest.mark.torch
def test_under_ddp_every_rank_is_refused_none_waits_in_a_collective(tmp_path):
    """Rank 0 checks the owner; the refusal is broadcast, so rank 1 raises it too instead of
    waiting for rank 0 in load_latest's all-reduce."""
    needs.module("torch")
    ck = tmp_path / "ck"
    first = _holder(ck)
    env = _env(PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    try:
        out = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--no-report", "--dir",
                              str(tmp_path / "job"), "--", sys.executable, str(TRAIN), str(ck), "--torch",
                              "--steps", "5", "--rate", "0", "--size-mb", "0.1"],
                             capture_output=True, text=True, timeout=300, env=env)
    finally:
        first.kill()
        first.wait()
    logs = [log_path(tmp_path / "job", r, "err").read_text() for r in (0, 1)]
    assert out.returncode != 0, out.stderr[-2000:]
    assert all(f"pid {first.pid}" in log and "in use by another job" in log for log in logs), logs
    assert not list(ck.glob("*step*"))


@pytest.mark.parametrize("leftover", [".owner.otherhost.4242.tmp", ".owner.stale-otherhost.4242"])
def test_a_claim_cut_short_by_kill_9_does_not_lock_a_fresh_directory_out(tmp_path, leftover):
    """kill -9 inside the very first claim leaves its temporary owner file (and no step-*/):
    the next start must not call the directory 'not a checkpoint directory'."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / leftover).write_text("{}")
    out = _run(ck, "--at", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert Checkpointer(ck, read_only=True).load_latest()[1] == 1


@pytest.mark.parametrize("record", ["", "garbage{", "[" * 200_000 + "]" * 200_000, "dir"])
def test_an_owner_record_no_hpcml_wrote_is_replaced_or_refused_in_one_line(tmp_path, record):
    """An empty, garbage or absurdly nested ``.owner`` is stale (taken, the job saves); a
    directory there is refused in one line (exit 2 of the task), and left where it is."""
    ck = tmp_path / "ck"
    assert _run(ck, "--at", "1").returncode == 0
    (ck / ".owner").unlink()
    if record == "dir":
        (ck / ".owner" / "x").mkdir(parents=True)
    else:
        (ck / ".owner").write_text(record)
    out = _run(ck, "--at", "2")
    assert "Traceback" not in out.stderr, out.stderr
    if record == "dir":
        assert out.returncode == 2 and out.stdout.startswith("refused: ") and ".owner is a directory" in out.stdout
        assert (ck / ".owner" / "x").is_dir() and not list(ck.glob(".owner.*"))
    else:
        assert out.returncode == 0, out.stdout + out.stderr
    assert Checkpointer(ck, read_only=True).load_latest()[1] == (1 if record == "dir" else 2)


def test_two_jobs_replacing_a_dead_owner_at_once_one_wins(tmp_path, monkeypatch):
    """The owner died; job B reads its record and judges it stale, and before B renames it
    away job A (another process) has already replaced it with its own claim. B must not
    rename A's fresh record away and claim too (two owners, 4 of 25 real races): B is
    refused, naming A, and A's record stays."""
    from hpcml.ckpt import owner
    from hpcml.errors import UsageError
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / ".owner").write_text(json.dumps({"token": "dead", "host": socket.gethostname(), "pid": 2**22 + 7,
                                           "started": 1.0}))
    a: list[subprocess.Popen] = []
    real = owner.running

    def a_claims_meanwhile(record, mine=None):
        if not a:
            a.append(subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                                       "from hpcml.ckpt import owner; owner.claim(Path(sys.argv[1]), 'job-a'); "
                                       "print('claimed', flush=True); sys.stdin.readline()", str(ck)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()))
            assert a[0].stdout is not None and a[0].stdout.readline() == "claimed\n"
        return real(record, mine)
    monkeypatch.setattr(owner, "running", a_claims_meanwhile)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    try:
        with pytest.raises(UsageError, match="token job-a"):
            owner.claim(ck, "job-b")
        assert owner.read(ck)["token"] == "job-a" and not list(ck.glob(".owner.*"))
    finally:
        for p in a:
            p.communicate("\n", timeout=60)
