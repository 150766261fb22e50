"""``hpcml service up --slurm`` against fake ``sbatch``/``scontrol``/``scancel``/``squeue`` on
PATH: Slurm's role here is only to accept a job, report its state and cancel it (the real
cluster's share is ``test_mlflow_slurm.py``). The fakes keep each job's state in a file;
in ``run`` mode sbatch runs the job script in the background in ``--chdir`` (its own
process group, ``SLURM_JOB_ID`` set), as a node would, and scancel TERMs that group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.proctree import start_time

ROOT = Path(__file__).resolve().parents[2]

WEB = """name: web
description: a static file server
python: {own: true}
command: [python, -m, http.server, "${port.http}", --bind, "${host}"]
ports: [{name: http, port: 8000}]
health: {port: http, timeout: 20 s}
"""

SBATCH = r"""#!/bin/bash
# fake sbatch: a new job id, PENDING; with FAKE_SLURM_RUN=1 the script runs now (RUNNING)
F=$FAKE_SLURM
id=$(( $(cat "$F/next" 2>/dev/null || echo 1000) + 1 )); echo $id > "$F/next"
printf '%s\n' "$*" >> "$F/sbatch.log"
for a in "$@"; do case $a in --chdir=*) dir=${a#--chdir=};; --output=*) out=${a#--output=};; esac; done
script="${@: -1}"
out=${out//%j/$id}; out=${out//%%/%}
out=$(realpath -m "$out")        # as written where sbatch ran: the job's failure is its state path alone
if [ "$FAKE_SLURM_RUN" != 1 ]; then echo PENDING > "$F/job.$id"; echo $id; exit 0; fi
echo RUNNING > "$F/job.$id"
cp "$script" "$F/script.$id"
( cd "$dir" || exit 1
  export SLURM_JOB_ID=$id SLURMD_NODENAME=fakenode
  setsid bash "$F/script.$id" > "$out" 2>&1 < /dev/null & echo $! > "$F/pid.$id"; wait $!
  if [ "$(cat "$F/job.$id")" = COMPLETING ]; then echo CANCELLED > "$F/job.$id"; else echo COMPLETED > "$F/job.$id"; fi
) > /dev/null 2>&1 &
echo $id
"""

SCONTROL = r"""#!/bin/bash
# fake scontrol show -o job ID
F=$FAKE_SLURM; id="${@: -1}"
[ -f "$F/job.$id" ] || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
echo "JobId=$id JobName=hpcml-service JobState=$(cat "$F/job.$id") Reason=None"
"""

SCANCEL = r"""#!/bin/bash
# fake scancel ID: a pending job ends at once, a running one is TERMed (its group) and completes
F=$FAKE_SLURM; id=$1
echo "$id" >> "$F/scancel.log"
case $(cat "$F/job.$id" 2>/dev/null) in
  PENDING) echo CANCELLED > "$F/job.$id";;
  RUNNING) echo COMPLETING > "$F/job.$id"; kill -TERM -- "-$(cat "$F/pid.$id")" 2>/dev/null;;
esac
"""

SQUEUE = r"""#!/bin/bash
# fake squeue -h: the jobs still queued or running, "ID STATE"
F=$FAKE_SLURM
for f in "$F"/job.*; do
  [ -e "$f" ] || continue
  s=$(cat "$f"); case $s in PENDING|RUNNING|COMPLETING) echo "${f##*.} $s";; esac
done
"""


@pytest.fixture
def fake(tmp_path):
    """The fake Slurm's bin directory and state (``FAKE_SLURM``), and an environment for the
    CLI; every process group a fake job started is killed at the end, whatever failed."""
    f = tmp_path / "fakeslurm"
    (f / "bin").mkdir(parents=True)
    for name, text in (("sbatch", SBATCH), ("scontrol", SCONTROL), ("scancel", SCANCEL), ("squeue", SQUEUE)):
        (f / "bin" / name).write_text(text)
        (f / "bin" / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_SERVICE"))}
    env.update(FAKE_SLURM=str(f), PATH=f"{f / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])))
    yield f, env
    groups = [int(p.read_text()) for p in f.glob("pid.*")]
    for doc in tmp_path.rglob("service.json"):     # a service runs in its own session: stop it too
        s = json.loads(doc.read_text())
        if s.get("pgid") and s.get("pid_started") and start_time(s["pid"]) == s["pid_started"]:
            groups.append(s["pgid"])
    for sig in (signal.SIGTERM, signal.SIGKILL):    # TERM first, as scancel: the job stops its service
        for group in groups:
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while sig == signal.SIGTERM and any(alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.1)


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


def hpcml(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


def squeue(env: dict[str, str]) -> str:
    return subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env, timeout=15, check=True).stdout


def one_line_error(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_a_job_still_pending_is_recorded_shown_found_and_cancelled(fake, tmp_path):
    """The job never starts within --wait: up says so in one line (exit 1, no traceback) and
    has recorded the job, so status shows it pending, a second up finds it (no second sbatch)
    and down cancels it: the queue holds no job of ours afterwards."""
    f, env = fake
    (tmp_path / "web.yaml").write_text(WEB)
    state = tmp_path / "state"
    out = hpcml(["service", "up", "web.yaml", "--slurm", "--state-dir", str(state), "--wait", "1"], env, tmp_path)
    line = one_line_error(out)
    assert out.returncode == 1 and "Slurm job 1001 is still pending" in line, line
    assert "hpcml service status web" in line and "hpcml service down web cancels it" in line
    record = json.loads((state / "web" / "service.json").read_text())
    assert record["job_id"] == "1001" and record["mode"] == "slurm" and not record["ready"]

    out = hpcml(["service", "status", "web", "--state-dir", str(state)], env, tmp_path)
    assert out.returncode == 0 and out.stdout.split()[:4] == ["web", "pending", "job", "1001"], out.stdout + out.stderr

    out = hpcml(["service", "up", "web.yaml", "--slurm", "--state-dir", str(state), "--wait", "1"], env, tmp_path)
    line = one_line_error(out)
    assert out.returncode == 2 and "already submitted (Slurm job 1001, pending)" in line, line
    assert len((f / "sbatch.log").read_text().splitlines()) == 1           # not submitted twice
    assert "1001 PENDING" in squeue(env)

    out = hpcml(["service", "down", "web", "--state-dir", str(state)], env, tmp_path)
    assert out.returncode == 0 and "job 1001 cancelled" in out.stdout, out.stdout + out.stderr
    assert (f / "scancel.log").read_text().split() == ["1001"]
    assert squeue(env) == ""
    out = hpcml(["service", "status", "web", "--state-dir", str(state)], env, tmp_path)
    assert out.stdout.split()[:2] == ["web", "stopped"], out.stdout


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_a_relative_state_dir_is_where_the_job_writes_and_up_reads(fake, tmp_path, how):
    """The job runs with --chdir into the instance directory: a relative state dir in its
    script would put its service.json under state/web/state/web, and up would never see it
    ready. Here the job (run by the fake sbatch) serves, up reports it ready, and down
    leaves nothing running: no job queued, the service's process gone."""
    f, env = fake
    env["FAKE_SLURM_RUN"] = "1"
    (tmp_path / "web.yaml").write_text(WEB)
    args = ["service", "up", "web.yaml", "--slurm", "--wait", "60"]
    where = ["--state-dir", "rel/state"] if how == "flag" else []
    if how == "variable":
        env["HPCML_SERVICE_STATE"] = "rel/state"
    try:
        out = hpcml(args + where, env, tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr + (f / "sbatch.log").read_text()
        record = json.loads((tmp_path / "rel" / "state" / "web" / "service.json").read_text())
        assert record["ready"] and record["node"] == "fakenode" and record["job_id"] == "1001"
        assert Path(record["directory"]).is_absolute()
        assert not (tmp_path / "rel" / "state" / "web" / "rel").exists()
        assert "job 1001 on node fakenode" in out.stdout
    finally:
        down = hpcml(["service", "down", "web", *where], env, tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert squeue(env) == ""
    deadline = time.monotonic() + 20              # the service's own process, not just the job, is gone
    while start_time(record["pid"]) == record["pid_started"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert start_time(record["pid"]) != record["pid_started"]


def test_a_job_that_ends_is_quoted_from_the_end_of_its_output_only(tmp_path, monkeypatch):
    """A job's slurm-ID.out may be GBs: the error quotes its last line, read from the end
    (a 64 MiB output costs no more memory than a short one)."""
    import tracemalloc

    from hpcml.service import slurm as service_slurm

    directory = tmp_path / "web"
    directory.mkdir()
    out = directory / "slurm-7.out"
    with open(out, "wb") as fh:
        fh.truncate(64 << 20)                       # sparse: no disk, but read whole it is 64 MiB
        fh.seek(0, 2)
        fh.write(b"\nstarting\nModuleNotFoundError: No module named 'mlflow'\n")
    monkeypatch.setattr(service_slurm.slurm, "job_state", lambda job_id, **kw: "FAILED")
    tracemalloc.start()
    try:
        with pytest.raises(service_slurm.ServiceJobFailed) as caught:
            service_slurm._wait(directory, "web", "7", 5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value) == ("service job 7 ended (FAILED) before web was ready: "
                                 "ModuleNotFoundError: No module named 'mlflow'")
    assert peak < 4 << 20, peak
