import os
import time

import pytest

from hpcml.vet.isolate import ChildFailed, Timeout, run_many


def run_isolated(fn, timeout):
    """One job through ``run_many``: its dict, or its Timeout / ChildFailed raised."""
    outcome = run_many([(fn, timeout)])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def test_result_comes_back():
    assert run_isolated(lambda: {"x": 1, "pid": os.getpid()}, 5)["x"] == 1


def test_timeout_kills_the_child_and_its_group():
    start = time.monotonic()
    with pytest.raises(Timeout, match="timed out after 0.3 s"):
        run_isolated(lambda: (os.system("sleep 30 & sleep 30"), {})[1], 0.3)
    assert time.monotonic() - start < 3


def test_exception_becomes_child_failed_with_type_and_message():
    def boom():
        raise RuntimeError("driver said no")
    with pytest.raises(ChildFailed) as info:
        run_isolated(boom, 5)
    assert info.value.args[:2] == ("RuntimeError", "driver said no")


def test_segfault_is_reported_not_propagated():
    with pytest.raises(ChildFailed, match="SIGSEGV"):
        run_isolated(lambda: os.kill(os.getpid(), 11), 5)


def test_large_result_is_not_truncated():
    assert len(run_isolated(lambda: {"blob": "x" * 500_000}, 5)["blob"]) == 500_000
