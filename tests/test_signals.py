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
        signal.raise_signal(signal.SIGUSR2)           # its Python handler has run when this returns
        assert seen == [] and hits == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_handling_gives_the_previous_handlers_back_even_after_an_error():
    """``hpcml.signals.handling`` (the collector's and a service job's TERM/INT): the
    caller's handlers (pytest's own, here) are back afterwards, also when the body raises."""
    import pytest

    from hpcml.signals import handling
    got: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with pytest.raises(RuntimeError):
        with handling((signal.SIGTERM, signal.SIGINT), lambda sig, _f: got.append(sig)):
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RuntimeError("the body failed")
    assert got == [signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_held_forwarder_sends_what_came_once_it_opens_and_each_signal_once():
    """``forwarding_to(held=True)``: what comes while the targets are being started waits
    (not lost, not sent to half of them), goes out once at ``open``, and what comes later
    goes at once; nothing twice."""
    from hpcml.signals import forwarding_to

    class Target:
        def __init__(self) -> None:
            self.got: list[int] = []

        def poll(self) -> None:
            return None

        def send_signal(self, sig: int) -> None:
            self.got.append(sig)

    targets: list[Target] = []
    with forwarding_to(lambda: targets, (signal.SIGUSR1, signal.SIGUSR2), held=True) as fw:
        signal.raise_signal(signal.SIGUSR1)
        targets += [Target(), Target()]
        assert [t.got for t in targets] == [[], []]
        fw.open()
        assert [t.got for t in targets] == [[signal.SIGUSR1]] * 2
        signal.raise_signal(signal.SIGUSR2)
        fw.open()                                       # opening again sends nothing twice
    assert [t.got for t in targets] == [[signal.SIGUSR1, signal.SIGUSR2]] * 2
    assert fw.seen == [signal.SIGUSR1, signal.SIGUSR2]
