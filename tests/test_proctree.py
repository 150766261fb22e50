"""``hpcml.proctree.stop_descendants``: TERM, SIGKILL after the grace, and the caller still
gets its child's real exit status (a helper that reaped it would make it read as 0).

Each case runs in a process of its own: stop_descendants signals every descendant of its
caller, and pytest's own children (session fixtures' servers) must not be among them."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

CASE = """
import subprocess, sys
from hpcml.proctree import stop_descendants
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
killed = stop_descendants(float(sys.argv[2]))
print(killed, child.wait(timeout=60))
"""
IGNORES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(300)")
STOPS = "import time; print('ready', flush=True); time.sleep(300)"


@pytest.mark.parametrize("child,grace,expected", [
    (IGNORES_TERM, 0.2, f"True {-signal.SIGKILL}"),      # SIGKILL was needed; the caller reaps it
    (STOPS, 60, f"False {-signal.SIGTERM}"),             # TERM was enough, long before the grace
], ids=["ignores-term", "stops-on-term"])
def test_stop_descendants(child, grace, expected):
    p = subprocess.run([sys.executable, "-c", CASE, child, str(grace)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == expected, (p.stdout, p.stderr)


def test_start_time_of_a_live_process_a_zombie_and_a_gone_one():
    """A zombie (killed, not yet reaped) is as good as gone: a kill -9 loop that restarts a
    job before it waits must not find the killed one still "running"."""
    import os
    import time

    import psutil

    from hpcml.proctree import start_time
    assert start_time(os.getpid()) == psutil.Process().create_time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert start_time(child.pid) is not None
    child.kill()
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert start_time(child.pid) is None
    child.wait()
    assert start_time(child.pid) is None


def test_stop_group_terms_waits_then_kills_what_ignored_it():
    """``proctree.stop_group`` (srun steps, local services): the leader ends on TERM, its
    child that ignores TERM is KILLed after the grace; afterwards nothing of the group runs."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from hpcml.proctree import stop_group
    script = ("import signal, subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, "
              "signal.SIG_IGN); print(1, flush=True); time.sleep(300)'])\n"
              "time.sleep(300)\n")
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None and leader.stdout.readline() == "1\n"     # the child ignores TERM now
    child = psutil.Process(leader.pid).children()[0]
    assert stop_group(leader.pid, 5.0, lambda: leader.poll() is not None) is True
    child.wait(timeout=30)
    assert not [p for p in psutil.process_iter() if _pgid(p.pid) == leader.pid]
    assert stop_group(leader.pid, 1.0, lambda: True) is True      # a group already gone: nothing to do
    assert leader.returncode == -signal.SIGTERM and os.getpgid(0) != leader.pid
    leader.stdout.close()


def _pgid(pid: int) -> int | None:
    import os
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_exit_watch_wakes_when_the_child_ends_not_at_its_timeout():
    """A pidfd wakes the waiter as the child ends: a 60 s wait on a child that lives 0.3 s
    returns long before 60 s, and a wait on a live child lasts its timeout."""
    import time

    from hpcml.proctree import ExitWatch
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    watch = ExitWatch(child.pid)
    try:
        t0 = time.monotonic()
        watch.wait(0.05)
        assert child.poll() is None                  # the timeout passed: still running
        watch.wait(60)
        assert time.monotonic() - t0 < 30 and child.wait(timeout=5) == 0
    finally:
        watch.close()
        child.kill()
        child.wait()


def test_exit_watch_without_a_pidfd_polls_the_child_as_before(monkeypatch):
    """A kernel without pidfd_open (EL7) or a seccomp profile refusing it: the wait is the
    Popen's own (50 ms polls), not a sleep of the whole timeout."""
    import os
    import time

    from hpcml.proctree import ExitWatch

    def refused(pid):
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(os, "pidfd_open", refused)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    watch = ExitWatch(child.pid, child)
    assert watch.fd is None
    t0 = time.monotonic()
    watch.wait(60)
    assert time.monotonic() - t0 < 30 and child.poll() == 0
