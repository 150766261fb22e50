"""``hpcml run`` owns its ranks and its job directory (local mode; srun: test_run_slurm).

Each guarantee is checked on what the user's task itself did or left: an O_APPEND file the
task writes, and its processes found afterwards by a unique marker in their command line.
"""

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

from hpcml.errors import UsageError
from hpcml.jobmodel import RunRecord
from hpcml.run import jobdir
from tests import needs

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
WAIT = 90                 # generous: the machine is shared and loaded


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(PY).parent}:{env.get('PATH', '')}"
    return env


def start(*args, cwd: Path, ignore_int: bool = False) -> subprocess.Popen:
    """``hpcml run`` in the background (``ignore_int``: as ``cmd &`` in a script starts it)."""
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_int else None
    return subprocess.Popen([PY, "-m", "hpcml", "run", *map(str, args)], cwd=cwd, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=pre)


def hpcml(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpcml", *map(str, args)], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=WAIT * 2)


def rank_script(marks: Path, marker: str, trap_term: bool, trap_int: bool = False) -> list[str]:
    """A bash rank: says it started (O_APPEND), starts a child carrying ``marker``, then
    ticks; with ``trap_term`` it notes TERM and carries on; with ``trap_int`` it notes INT and
    exits as a shell killed by it would (130). Untrapped, bash may outlive an INT: one that
    comes as its foreground ``sleep`` has just exited normally is taken as handled by that
    child (bash's wait-and-cooperative-exit), ~2 % of the time here."""
    trap = f"trap 'echo term-$RANK >> {marks}' TERM; " if trap_term else ""
    trap += f"trap 'echo int-$RANK >> {marks}; exit 130' INT; " if trap_int else ""
    return ["bash", "-c", f"{trap}echo start-$RANK >> {marks}; "
            f"{PY} -c 'import time; time.sleep(300)' {marker} & "
            f"while :; do echo tick >> {marks}; sleep 0.1; done", marker]


def marked(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if marker in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def wait_for(cond, timeout: float = WAIT, what: str = "") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def lines(path: Path, word: str) -> int:
    return path.read_text().split().count(word) if path.exists() else 0


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} ppid {p.ppid()} {p.status()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return out


def nothing_left(marker: str, marks: Path) -> None:
    """No process of the task is left, and the task's file has stopped growing."""
    end = time.monotonic() + 30
    while marked(marker) and time.monotonic() < end:
        time.sleep(0.1)
    left = _describe(marked(marker))
    for p in marked(marker):
        p.kill()
    assert not left, f"the task's processes still run: {left}"
    size = marks.stat().st_size if marks.exists() else 0
    time.sleep(0.5)
    assert (marks.stat().st_size if marks.exists() else 0) == size, "something still writes the task's file"


def stopped(sig: int, *args, cwd: Path, marks: Path, ignore_int: bool = False) -> tuple[int, str]:
    """Start ``hpcml run ARGS`` with 2 ranks, send it ``sig`` once both run; its exit code, stderr."""
    p = start("--ntasks", 2, "--dir", "job", "--no-report", *args, cwd=cwd, ignore_int=ignore_int)
    try:
        wait_for(lambda: lines(marks, "start-0") + lines(marks, "start-1") == 2, what="both ranks")
        p.send_signal(sig)
        _, err = p.communicate(timeout=WAIT)
    finally:
        p.kill()
    return p.returncode, err


def test_kill_9_of_hpcml_run_takes_every_rank_and_its_children_along(tmp_path):
    """kill -9 at random moments, ranks running or still starting: nothing of the task
    survives; the report says the launcher was killed."""
    rng = random.Random()
    for i in range(10):
        marker, marks = f"hpcml-test-{uuid.uuid4().hex}", tmp_path / f"marks-{i}"
        p = start("--ntasks", 2, "--dir", f"job-{i}", "--no-report", "--", *rank_script(marks, marker, False),
                  cwd=tmp_path)
        try:
            if i % 2:                     # odd rounds: once both ranks run; even: at any moment
                wait_for(lambda m=marks: lines(m, "start-0") + lines(m, "start-1") == 2, what="both ranks")
            time.sleep(rng.uniform(0.0, 1.5))
            p.kill()
            p.communicate(timeout=WAIT)
            nothing_left(marker, marks)
        finally:
            p.kill()
            p.communicate()
    rep = json.loads(hpcml("report", "job-1", "--json", cwd=tmp_path).stdout)
    assert rep["ending"]["launcher_killed"] is True
    assert rep["findings"][0]["kind"] == "launcher_killed" and "was killed" in rep["findings"][0]["message"]
    text = hpcml("report", "job-1", cwd=tmp_path).stdout              # for people: no "None" anywhere
    assert "None" not in text and "no exit code (hpcml run was killed" in text, text


def test_kill_9_of_one_task_wrapper_takes_its_ranks_children_along(tmp_path):
    """A task wrapper killed on its own (kill -9, a crash): its rank dies with it (parent-death
    signal), and what the rank started, re-parented to the launcher, is killed by it; the
    other rank is stopped as after any failure."""
    marker, marks = f"hpcml-test-{uuid.uuid4().hex}", tmp_path / "marks"
    p = start("--ntasks", 2, "--dir", "job", "--no-report", "--kill-grace", 1, "--",
              *rank_script(marks, marker, False), cwd=tmp_path)
    try:
        wait_for(lambda: lines(marks, "start-0") + lines(marks, "start-1") == 2, what="both ranks")
        wait_for(lambda: len(marked(marker)) >= 4, what="both ranks' children")
        wrapper = next(c for c in psutil.Process(p.pid).children() if "hpcml.run.task" in c.cmdline())
        wrapper.kill()
        _, err = p.communicate(timeout=WAIT)
        assert p.returncode != 0, err
        nothing_left(marker, marks)
    finally:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("trap_term", [True, False], ids=["rank-traps-term", "bash-rank-with-a-child"])
def test_term_stops_ranks_and_their_children_sigkill_after_the_grace(tmp_path, trap_term):
    """A rank that traps TERM gets SIGKILL after --kill-grace; a bash rank that dies of TERM
    leaves no child behind. Either way every rank got TERM first."""
    marker, marks = f"hpcml-test-{uuid.uuid4().hex}", tmp_path / "marks"
    rc, err = stopped(signal.SIGTERM, "--kill-grace", 1, "--", *rank_script(marks, marker, trap_term),
                      cwd=tmp_path, marks=marks)
    nothing_left(marker, marks)
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["signals_forwarded"] == ["SIGTERM"] and rc != 0, err
    if trap_term:
        assert lines(marks, "term-0") >= 1 and lines(marks, "term-1") >= 1
        assert run["killed_after_grace"] is True and rc == 128 + signal.SIGKILL, err


def test_sigint_sent_with_kill_stops_the_run_like_ctrl_c(tmp_path):
    """Started as ``cmd &`` from a script (INT ignored), ``kill -INT`` still stops it."""
    marker, marks = f"hpcml-test-{uuid.uuid4().hex}", tmp_path / "marks"
    # a bash rank's background child ignores INT (bash does that to async commands): the
    # grace runs out and SIGKILL takes it; a short grace keeps the test short. The rank traps
    # INT: each one says it got it, and its exit code is the run's
    rc, err = stopped(signal.SIGINT, "--kill-grace", "1", "--", *rank_script(marks, marker, False, trap_int=True),
                      cwd=tmp_path, marks=marks, ignore_int=True)
    nothing_left(marker, marks)
    assert lines(marks, "int-0") == 1 and lines(marks, "int-1") == 1, marks.read_text()[-200:]
    assert rc == 128 + signal.SIGINT, err
    assert json.loads((tmp_path / "job" / "run.json").read_text())["signals_forwarded"] == ["SIGINT"]


def test_a_directory_that_holds_a_job_is_refused_unless_overwrite(tmp_path):
    marks = tmp_path / "marks"
    task = ["sh", "-c", f"echo ran >> {marks}"]
    assert hpcml("run", "--ntasks", 2, "--dir", "job", "--no-report", "--", *task, cwd=tmp_path).returncode == 0
    again = hpcml("run", "--ntasks", 2, "--dir", "job", "--no-report", "--", *task, cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--overwrite" in again.stderr, again.stderr
    assert lines(marks, "ran") == 2                          # the second run started nothing
    over = hpcml("run", "--ntasks", 1, "--dir", "job", "--no-report", "--overwrite", "--", *task, cwd=tmp_path)
    assert over.returncode == 0, over.stderr
    assert lines(marks, "ran") == 3
    assert sorted(p.name for p in (tmp_path / "job" / "logs").iterdir()) == ["rank-00000.err", "rank-00000.out"]
    assert json.loads((tmp_path / "job" / "run.json").read_text())["ntasks"] == 1
    assert len(list((tmp_path / "job" / "observe").glob("rank-00001*"))) == 0    # nothing of the first run


def test_overwrite_removes_a_symlinked_entry_not_what_it_points_to(tmp_path):
    """--overwrite over a job whose logs/ and observe/ are symlinks (to scratch, say): the
    links go, what they name outside the job directory stays, and the new job runs."""
    marks = tmp_path / "marks"
    task = ["sh", "-c", f"echo ran >> {marks}"]
    assert hpcml("run", "--ntasks", 1, "--dir", "job", "--no-report", "--", *task, cwd=tmp_path).returncode == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    for name in ("logs", "observe"):
        (tmp_path / "job" / name).rename(tmp_path / f"old-{name}")
        (tmp_path / "job" / name).symlink_to(outside, target_is_directory=True)
    over = hpcml("run", "--ntasks", 1, "--dir", "job", "--no-report", "--overwrite", "--", *task, cwd=tmp_path)
    assert over.returncode == 0 and "Traceback" not in over.stderr, over.stderr
    assert (outside / "keep").read_text() == "precious" and sorted(os.listdir(outside)) == ["keep"]
    assert lines(marks, "ran") == 2
    assert not (tmp_path / "job" / "logs").is_symlink() and (tmp_path / "job" / "logs" / "rank-00000.out").exists()


def test_two_runs_at_once_on_one_directory_one_is_refused(tmp_path):
    marks = tmp_path / "marks"
    task = ["sh", "-c", f"echo ran >> {marks}"]
    procs = [start("--ntasks", 2, "--dir", "job", "--no-report", "--", *task, cwd=tmp_path) for _ in range(2)]
    results = [(p.wait(timeout=WAIT), p.communicate()[1]) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    refused = next(err for rc, err in results if rc == 2)
    assert refused.count("\n") == 1 and "job" in refused
    assert lines(marks, "ran") == 2                          # the ranks of one run only


def test_the_default_directory_without_slurm_is_a_new_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = jobdir.default_dir(None)
    first.mkdir()
    assert jobdir.default_dir(None) != first
    assert jobdir.default_dir("123") == Path("hpcml-run-123")


def test_the_same_slurm_job_requeued_continues_in_its_directory(tmp_path):
    """Only the same job with a higher restart count than recorded, its launcher gone."""
    d = tmp_path / "job"
    d.mkdir()
    gone = {"pid": 2 ** 22 + 1, "host": "elsewhere", "created": 1.0}
    jobdir.write_run(d, RunRecord(command=["x"], mode="slurm", job_id="77", attempt=1, started=1.0, ended=2.0,
                                  launcher=gone))
    assert jobdir.prepare(d, overwrite=False, job_id="77", restart=2).job_id == "77"
    for job_id, restart in (("77", 0), ("77", 1), ("78", 2), (None, 0)):
        with pytest.raises(UsageError, match="already holds a job"):
            jobdir.prepare(d, overwrite=False, job_id=job_id, restart=restart)
    jobdir.write_run(d, RunRecord(command=["x"], mode="slurm", job_id="77", attempt=1, started=1.0,
                                  launcher=jobdir.launcher()))          # its launcher still runs, here
    with pytest.raises(UsageError, match="holds a running job"):
        jobdir.prepare(d, overwrite=False, job_id="77", restart=2)


def test_dir_that_is_a_file_is_one_line_exit_2(tmp_path):
    (tmp_path / "f").write_text("")
    p = hpcml("run", "--dir", "f", "--", "true", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "f: not a directory" in p.stderr, p.stderr


def test_a_full_disk_is_one_line_exit_1_and_leaves_no_temporary_file(tmp_path):
    needs.root("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "job").mkdir()
        with open(mnt / "fill", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        p = hpcml("run", "--dir", mnt / "job", "--", "true", cwd=tmp_path)
        assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
        assert "No space left on device" in p.stderr and "Traceback" not in p.stderr
        assert [q.name for q in (mnt / "job").iterdir()] == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_command_that_cannot_start_says_why_and_exits_127(tmp_path):
    p = hpcml("run", "--ntasks", 2, "--dir", "job", "--no-report", "--", "pythn-no-such", "train.py", cwd=tmp_path)
    assert p.returncode == 127, p.stderr
    assert "cannot start 'pythn-no-such': No such file or directory" in p.stderr
    rep = json.loads(hpcml("report", "job", "--json", cwd=tmp_path).stdout)
    assert "cannot start 'pythn-no-such'" in rep["findings"][0]["message"]
    assert not any(f["kind"] == "missing_rank" for f in rep["findings"]), rep["findings"]


def test_two_overwrites_at_once_one_runs_and_keeps_its_files(tmp_path):
    """Two ``--overwrite`` of one finished job at once: one runs, the other is refused, and
    the one that runs keeps its logs (the refused one did not remove them while it was
    still deleting the old job's many files)."""
    marks = tmp_path / "marks"
    task = ["sh", "-c", f"echo ran >> {marks}; echo hello-from-the-rank"]
    assert hpcml("run", "--ntasks", 1, "--dir", "job", "--no-report", "--", *task, cwd=tmp_path).returncode == 0
    old = tmp_path / "job" / "logs" / "old"
    old.mkdir()
    for i in range(3000):                                   # a slow removal: the window to close
        (old / f"f{i}").write_text("x")
    procs = [start("--ntasks", 1, "--dir", "job", "--no-report", "--overwrite", "--", *task, cwd=tmp_path)
             for _ in range(2)]
    results = [(p.wait(timeout=WAIT), p.communicate()[1]) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2], results
    assert lines(marks, "ran") == 2                          # the first run and one of the two
    assert "hello-from-the-rank" in (tmp_path / "job" / "logs" / "rank-00000.out").read_text()
    assert not old.exists()


def test_an_overwrite_waits_for_one_that_is_replacing_the_directory(tmp_path):
    """Deterministic form of the race above: a first overwrite (here the job directory's own
    protocol in a real process) holds the directory between removing the old job and
    claiming run.json, until the test lets it go; ``hpcml run --overwrite`` is started in
    that window, and the first claims only once the kernel shows the second blocked on the
    directory's lock (/proc/locks). The second must then find the first's running job;
    without the lock it found no run.json, claimed the directory and ran, and the first's
    claim failed."""
    marks = tmp_path / "marks"
    task = ["sh", "-c", f"echo ran >> {marks}"]
    assert hpcml("run", "--ntasks", 1, "--dir", "job", "--no-report", "--", *task, cwd=tmp_path).returncode == 0
    first = subprocess.Popen([PY, "-c", f"""
import sys, time
from pathlib import Path
from hpcml.jobmodel import RunRecord
from hpcml.run import jobdir
d = Path({str(tmp_path / 'job')!r})
with jobdir.claiming(d):
    assert jobdir.prepare(d, overwrite=True, job_id=None, restart=0) is None
    print("removed", flush=True)
    sys.stdin.readline()                           # the test's go: the second waits on the lock now
    jobdir.write_run(d, RunRecord(command=["first"], mode="local", started=time.time(), ended=None,
                                  launcher=jobdir.launcher()), exclusive=True)
print("claimed", flush=True)
sys.stdin.readline()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    second = None
    try:
        assert first.stdout.readline() == "removed\n", first.stderr.read()
        second = start("--ntasks", 1, "--dir", "job", "--no-report", "--overwrite", "--", *task, cwd=tmp_path)
        _blocked_on_lock(tmp_path / "job", second.pid)
        first.stdin.write("go\n")
        first.stdin.flush()
        assert first.stdout.readline() == "claimed\n", first.stderr.read()
        rc, err = second.wait(timeout=WAIT), second.communicate()[1]
        assert rc == 2 and "running job" in err, err
        assert json.loads((tmp_path / "job" / "run.json").read_text())["command"] == ["first"]
        assert lines(marks, "ran") == 1
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def _blocked_on_lock(d: Path, pid: int, bound: float = 120.0) -> None:
    """Wait until process ``pid`` waits for a flock on directory ``d`` (a ``->`` line of
    /proc/locks naming its pid and the directory's inode), within ``bound`` seconds."""
    inode = d.stat().st_ino
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        for line in Path("/proc/locks").read_text().splitlines():
            f = line.split()
            if "->" in f and "FLOCK" in f and str(pid) in f and any(x.endswith(f":{inode}") for x in f):
                return
        time.sleep(0.05)
    pytest.fail(f"hpcml run (pid {pid}) never waited for the lock on {d}")
