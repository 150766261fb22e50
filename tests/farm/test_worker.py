"""The worker's pieces on real processes: waiting for a task (pidfd, and the SIGCHLD pipe
that kernels before 5.3 need: that kernel cannot exist here, so the test removes
``os.pidfd_open`` to take that path), the time limit, and how a command is started."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from hpcml.farm.process import argv_of
from hpcml.farm.worker import SlotConfig, Worker


@pytest.fixture(params=["pidfd", "sigchld"])
def worker(request, tmp_path, monkeypatch):
    if request.param == "sigchld":
        monkeypatch.delattr(os, "pidfd_open")
    store.create(tmp_path / "f", [TaskSpec("true")], {"time_limit": 0.3})
    farm = store.load(tmp_path / "f")
    w = Worker(farm, farm.settings, SlotConfig(node="here", job=None, slot=0))
    (farm.path / "workers" / w.wid).write_text("{}")
    yield w
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)


def test_a_task_is_waited_for_and_its_exit_code_kept(worker):
    assert worker._wait_for(subprocess.Popen(["sh", "-c", "sleep 0.05; exit 4"], start_new_session=True)) == (4, False)
    assert worker._wait_for(subprocess.Popen(["true"], start_new_session=True)) == (0, False)


def test_a_task_over_the_time_limit_is_terminated_with_its_children(worker, tmp_path):
    marker = tmp_path / "child-survived"
    proc = subprocess.Popen(["sh", "-c", f"(sleep 1; touch {marker}) & sleep 5"], start_new_session=True)
    assert worker._wait_for(proc) == (-signal.SIGTERM, True)
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.1; done"], timeout=1.5)
    assert not marker.exists()                      # the whole process group was killed


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace(worker, tmp_path, monkeypatch):
    monkeypatch.setattr("hpcml.farm.worker.TIME_LIMIT_GRACE", 0.3)
    marker = tmp_path / "outlived"
    proc = subprocess.Popen(["sh", "-c", f"trap '' TERM; sleep 5; touch {marker}"], start_new_session=True)
    assert worker._wait_for(proc) == (-signal.SIGKILL, True)
    assert not marker.exists()


@pytest.mark.parametrize("command, direct", [
    ("true", True), ("python3 -c pass", True), ("echo a > f", False), ("A=1 env", False),
    ("cd /tmp", False), ("no-such-program-xyz", False), ("echo $HOME", False),
])
def test_plain_commands_skip_the_shell(command, direct):
    argv = argv_of(command)
    assert (argv[:2] != ["/bin/sh", "-c"]) == direct, argv
