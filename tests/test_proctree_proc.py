"""proctree's /proc readers and kill loops (moved there from the farm's guard and worker,
the data loader benchmark and the page-cache probe): checked against psutil and the kernel
on a child of this test, so a reader that parses the wrong field fails here."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from hpcml import proctree

SLEEPER = [sys.executable, "-c", "import sys, time; print('ready', flush=True); time.sleep(300)"]


def _child(**kw) -> subprocess.Popen:
    proc = subprocess.Popen(SLEEPER, stdout=subprocess.PIPE, text=True, **kw)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"    # it runs: no sleep to wait
    return proc


def test_the_readers_say_what_psutil_says_of_a_child():
    proc = _child(env={**os.environ, "HPCML_PROCTREE_MARK": "7"}, start_new_session=True)
    try:
        assert proc.pid in proctree.children()
        session, state = proctree.session_and_state(proc.pid)    # type: ignore[misc]
        assert session == os.getsid(proc.pid) == proc.pid and state in "RS"
        assert b"HPCML_PROCTREE_MARK=7" in proctree.environ(proc.pid).split(b"\0")
        assert proctree.command_line(proc.pid).split(b"\0")[:-1] == [a.encode() for a in SLEEPER]
        assert dict(proctree.command_lines())[proc.pid] == psutil.Process(proc.pid).cmdline()
    finally:
        proc.kill()
        proc.wait()
    assert proctree.session_and_state(proc.pid) is None and proctree.environ(proc.pid) == b""


def test_kill_until_gone_kills_what_is_listed_and_proves_it_gone():
    proc = _child()
    gone = proctree.kill_until_gone(lambda: [proc.pid] if proc.poll() is None else [], timeout=30)
    assert gone and proc.returncode == -9


def test_kill_until_gone_gives_up_at_its_timeout_on_what_will_not_go():
    proc = _child()
    try:
        assert not proctree.kill_until_gone(lambda: [proc.pid], timeout=0.1)   # a zombie stays listed
    finally:
        proc.wait()


@pytest.mark.machine                     # measures contention: the CPUs to itself (scripts/test)
def test_a_process_that_shares_its_cpu_with_a_spinner_waits_for_it():
    """Two busy processes on one CPU: each waits on the run queue about half the time
    (``cpu_wait``, the scheduler's run delay); a sleeping one does not wait."""
    import time

    from hpcml.proctree import cpu_wait
    cpu = min(os.sched_getaffinity(0))
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for p in spin:
            os.sched_setaffinity(p.pid, {cpu})
        time.sleep(0.5)
        before = [cpu_wait(p.pid) for p in spin]
        slept = cpu_wait(sleeper.pid)
        time.sleep(2.0)
        after = [cpu_wait(p.pid) for p in spin]
        assert all(b is not None and a is not None for a, b in zip(after, before))
        waited = [a - b for a, b in zip(after, before)]
        assert all(w >= 0.5 for w in waited), waited          # about 1 s each of the 2
        assert cpu_wait(sleeper.pid) - slept < 0.1
    finally:
        for p in [*spin, sleeper]:
            p.kill()
            p.wait()
    assert cpu_wait(spin[0].pid) is None                       # gone
