"""``hpcml run`` (local tasks) says why a job ended as it was: the live watch believes only
its own ranks' heartbeats, a stop from outside (Ctrl-C, a TERM to ``hpcml run``) is not a
crash and leaves no failed or lost rank in the report, a real crash quotes what the rank
itself last wrote, and ``--on-straggler restart`` with no node to leave out is refused.

The ranks are small scripts without torch; what they did is read from their own files (a
handshake each writes once its first step is in the store), never timed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from hpcml import schemas
from hpcml.run.watch import HANG

ROOT = Path(__file__).resolve().parents[2]
WAIT = 180                       # generous: the machine is shared and loaded

# rank 0 forges heartbeats while both ranks hang after 3 steps: for rank 5, which the job
# does not have (fresh, a huge step, an exit code), for rank 1 in a file of its own, and
# for rank 1 over rank 1's real record (replaced: its recorder now writes to a file no one
# reads). Rewritten every half second, so each is always fresh.
FORGER = """\
import json, os, time
from pathlib import Path
from hpcml import observe
rank = int(os.environ["RANK"])
for step in range(3):
    observe.log(step=step, loss=1.0)
observe.flush()
beat = Path(os.environ["HPCML_OBSERVE_DIR"]) / "beat"
while True:
    if rank == 0:
        now = time.time()
        for r, name, code in ((5, "rank-00005.json", 3), (1, "rank-00077.json", None), (1, "rank-00001.json", None)):
            doc = {"schema": "hpcml.observe.beat/1", "rank": r, "node": "ghost", "step": 10**12, "steps": 10**12,
                   "progress": now, "beat": now, "exit": code, "recent_steps": [], "recent_s": []}
            tmp = beat / ("." + name)
            tmp.write_text(json.dumps(doc).ljust(4096))
            os.replace(tmp, beat / name)
    time.sleep(0.5)
"""

# a rank that has made a step, says so (the handshake), then waits to be stopped
WAITER = """\
import os, time
from pathlib import Path
from hpcml import observe
observe.log(step=0, loss=1.0)
observe.flush()
Path(f"started-{os.environ['RANK']}").write_text("")
while True:
    time.sleep(0.1)
"""

# rank 1 crashes after its first step: in attempt 0 it says why, in attempt 1 it says nothing
CRASHER = """\
import os, sys, time
from hpcml import observe
observe.log(step=0, loss=1.0)
observe.flush()
if os.environ["RANK"] == "1":
    if os.environ["HPCML_RUN_ATTEMPT"] == "0":
        print("my own last words", file=sys.stderr, flush=True)
    sys.exit(3)
while True:
    time.sleep(0.1)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def hpcml(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=WAIT)


def valid(doc: dict, name: str) -> dict:
    jsonschema.validate(doc, schemas.load(name), cls=jsonschema.Draft202012Validator)
    return doc


def run_json(d: Path) -> dict:
    return valid(json.loads((d / "run.json").read_text()), "run")


def report(cwd: Path) -> tuple[dict, str]:
    """``hpcml report job --json``, and the page it writes."""
    p = hpcml("report", "job", "--json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    return valid(json.loads(p.stdout), "run.report"), (cwd / "job" / "report.html").read_text()


def test_a_forged_heartbeat_neither_hides_the_hang_nor_makes_a_crash(tmp_path):
    (tmp_path / "forge.py").write_text(FORGER)
    p = hpcml("run", "--ntasks", 2, "--dir", "job", "--no-report", "--hang-timeout", "5s", "--kill-grace", 2,
              "--", sys.executable, "forge.py", cwd=tmp_path)
    assert p.returncode == HANG, p.stderr
    said = [line for line in p.stderr.splitlines() if "ignoring heartbeats" in line]
    fake = [line for line in said if "for rank 5 " in line]
    assert len(fake) == 1, p.stderr                                                     # said once
    assert fake[0].endswith("rank 5 in rank-00005.json: not a rank of this attempt (this attempt started ranks 0-1)")
    impersonated = [line for line in said if "for rank 1 " in line]
    assert len(impersonated) == 1 and "not signed by the rank's recorder" in impersonated[0], p.stderr
    assert "crash:" not in p.stderr and "failed first" not in p.stderr
    assert "hang: no rank completed a step for" in p.stderr and "furthest step 2)" in p.stderr
    run = run_json(tmp_path / "job")
    assert [e["kind"] for e in run["timeline"]] == ["hang"] and run["exit_code"] == HANG
    assert run["furthest_step"] == 2 and run["first_failure"] is None
    assert {(i["rank"], i["why"]) for i in run["ignored_beats"]} == {
        (5, "not a rank of this attempt"), (1, "not signed by the rank's recorder")}
    rep, _ = report(tmp_path)
    kinds = [f["kind"] for f in rep["findings"]]
    assert kinds[0] == "hang" and kinds.count("ignored_heartbeat") == 2 and "failed_rank" not in kinds


def _stopped(tmp_path: Path, sig: int) -> tuple[int, str]:
    """``hpcml run`` of two waiting ranks, sent ``sig`` once both made their first step."""
    (tmp_path / "wait.py").write_text(WAITER)
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--dir", "job", "--no-report",
                          "--kill-grace", "5", "--", sys.executable, "wait.py"], cwd=tmp_path, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + WAIT
        while not all((tmp_path / f"started-{r}").exists() for r in (0, 1)):      # the ranks' handshake
            assert p.poll() is None and time.monotonic() < end, p.communicate()
            time.sleep(0.05)
        p.send_signal(sig)
        _, err = p.communicate(timeout=WAIT)
    finally:
        p.kill()
    return p.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "term"])
def test_a_run_stopped_from_outside_has_no_crash_and_no_failed_or_lost_rank(tmp_path, sig):
    rc, err = _stopped(tmp_path, sig)
    assert rc != 0, err                                # the ranks' own code on the signal (Ctrl-C: Python's)
    assert "crash:" not in err and "failed first" not in err, err
    run = run_json(tmp_path / "job")
    assert run["signals_forwarded"] == [sig.name] and run["signalled_at"] >= run["started"]
    assert not [e for e in run["timeline"] if e["kind"] == "crash"] and run["first_failure"] is None
    rep, page = report(tmp_path)
    kinds = [f["kind"] for f in rep["findings"]]
    assert kinds[0] == "interrupted" and f"got {sig.name}" in rep["findings"][0]["message"], rep["findings"]
    assert not {"failed_rank", "missing_rank", "damaged_file"} & set(kinds), rep["findings"]
    obs = rep["observe"]
    assert obs["failed_ranks"] == {} and obs["missing_ranks"] == [] and obs["damaged_ranks"] == {}
    assert rep["ending"]["first_failure"] is None and rep["ending"]["interrupted"] == sig.name
    assert "Lost and damaged ranks" not in page and "failed first" not in page and "no rank failed" in page
    from hpcml.run.summary import build
    assert build(tmp_path / "job").outcome == "interrupted"          # what the centre counts: not a failed job


def test_a_crash_quotes_what_the_rank_wrote_in_that_attempt_never_hpcmls_header(tmp_path):
    """Attempt 1's log begins with hpcml's header line, then the rank exits 3 silent: its
    crash quotes nothing (not the header, not attempt 0's last words)."""
    (tmp_path / "crash.py").write_text(CRASHER)
    p = hpcml("run", "--ntasks", 2, "--dir", "job", "--no-report", "--max-restarts", 1, "--kill-grace", 2,
              "--", sys.executable, "crash.py", cwd=tmp_path)
    assert p.returncode == 3, p.stderr
    crashes = [line.split("hpcml run: ", 1)[1] for line in p.stderr.splitlines() if "crash:" in line]
    assert len(crashes) == 2, p.stderr
    assert crashes[0].endswith("exited 3 after step 0: my own last words"), crashes
    assert crashes[1].endswith("exited 3 after step 0"), crashes          # attempt 1: nothing of its own
    assert "--- hpcml run: attempt 1" in (tmp_path / "job" / "logs" / "rank-00001.err").read_text()
    run = run_json(tmp_path / "job")
    assert [(e["kind"], e["rank"], e["stderr"]) for e in run["attempts"][0]["timeline"]] == [
        ("crash", 1, "my own last words")]
    assert [(e["kind"], e["rank"], e["stderr"]) for e in run["timeline"]] == [("crash", 1, "")]
    assert (run["first_failure"]["rank"], run["first_failure"]["exit_code"]) == (1, 3)
    rep, _ = report(tmp_path)
    failed = next(f for f in rep["findings"] if f["kind"] == "failed_rank")
    assert failed["message"].endswith("failed first with exit code 3"), failed


def test_on_straggler_restart_with_no_node_to_leave_out_is_one_line_exit_2(tmp_path):
    """Local tasks run on one node: a restart without the straggler's node cannot happen."""
    p = hpcml("run", "--ntasks", 2, "--max-restarts", 1, "--on-straggler", "restart", "--dir", "job", "--",
              "touch", "ran", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hpcml run: error: flag '--on-straggler': restart needs a node")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "job").exists()


def _memory_cgroup(tmp_name: str, limit: int) -> Path:
    """A memory cgroup of its own under this process's (v2: memory.max; v1: memory.limit_in_bytes)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
            cg = Path("/sys/fs/cgroup") / path.lstrip("/") / tmp_name
            cg.mkdir()
            (cg / "memory.max").write_text(str(limit))
            return cg
        if "memory" in controllers.split(","):
            cg = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / tmp_name
            cg.mkdir()
            (cg / "memory.limit_in_bytes").write_text(str(limit))
            return cg
    pytest.fail("no memory cgroup to make: the OOM test needs cgroup v1 or v2 writable (CI runs as root)")


def test_a_rank_the_kernels_oom_killer_killed_is_told_so(tmp_path):
    """hpcml run in a real memory cgroup of 600 MB; the rank allocates 2 GB and the kernel's
    OOM killer kills it: SIGKILL, named as the OOM killer's from the cgroup's own count."""
    cg = _memory_cgroup(f"hpcml-oom-{os.getpid()}", 600 << 20)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--dir", "job", "--", sys.executable,
                            "-c", "import time; x = bytearray(2 << 30); time.sleep(5)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240,
                           preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())))
    finally:
        cg.rmdir()
    assert p.returncode == 128 + signal.SIGKILL, p.stderr
    first = run_json(tmp_path / "job")["first_failure"]
    assert (first["signal"], first["oom_killer"]) == ("SIGKILL", True)
    assert "killed by SIGKILL from the kernel's OOM killer" in p.stderr
    assert "(killed by SIGKILL from the kernel's OOM killer: its cgroup's oom_kill count rose)" in p.stdout
