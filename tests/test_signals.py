"""``hpcml.signals.forwarding``: what a wrapper gets, its running children get; an ended
child is skipped; the previous handler comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hpcml.signals import forwarding

CHILD = ("import signal, sys, time\n"
         "signal.signal(signal.SIGUSR2, lambda *a: (print('got USR2', flush=True), sys.exit(7)))\n"
         "print('ready', flush=True)\n"
         "time.sleep(60)\n")


def test_a_signal_to_the_wrapper_reaches_running_children_only():
    live = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    before = signal.getsignal(signal.SIGUSR2)
    try:
        assert live.stdout.readline().strip() == "ready"
        with forwarding(lambda: (live, done), (signal.SIGUSR2,)) as seen:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert live.wait(timeout=30) == 7
        assert seen == [signal.SIGUSR2] and live.stdout.read().strip() == "got USR2"
        assert signal.getsignal(signal.SIGUSR2) is before
    finally:
        live.kill()


def test_nothing_is_forwarded_outside_the_block():
    hits: list[int] = []
    old = signal.signal(signal.SIGUSR2, lambda sig, _f: hits.append(sig))
    try:
        with forwarding(lambda: (), (signal.SIGUSR2,)) as seen:
            pass
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        assert seen == [] and hits == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, old)
