"""``refuse_running`` inside a Slurm service job: the job's own record (pending, or an earlier
run's after a requeue) is replaced; a server of the same job that still runs is not started
twice (the lock's wait made a second ``up`` in one job reach this check)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcml.errors import UsageError
from hpcml.service import local
from hpcml.service import state as st
from hpcml.service.lifecycle import refuse_running


def _state(tmp_path, **kw) -> st.ServiceState:
    return st.ServiceState(name="web", blueprint="web.yaml", mode="slurm", backend="process",
                           directory=str(tmp_path / "web"), job_id="77", started=0.0, **kw)


def test_this_job_s_record_is_replaced_unless_its_server_still_runs_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    refuse_running(_state(tmp_path))                                    # pending: submitted, no server yet
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        live = _state(tmp_path, pid=server.pid, node=local.here(), ready=True)
        local._identify(live)
        with pytest.raises(UsageError, match=rf"web already runs in this job \(pid {server.pid}"):
            refuse_running(live)
        refuse_running(_state(tmp_path, pid=server.pid, node="elsewhere", ready=True))    # a requeue's earlier node
    finally:
        server.kill()
        server.wait()
    refuse_running(live)                                                # its server is gone: replaced
