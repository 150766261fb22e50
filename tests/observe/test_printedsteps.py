"""``--step-pattern``: rank 0's streams are watched until the first printed step, which is
noted once with the optimizer steps before it; then they are the originals again, and the
script's output is never changed."""

from __future__ import annotations

import io
import sys

import pytest

from hpcml.observe import printedsteps
from hpcml.run.inject import sitecustomize


def test_the_pattern_needs_one_group_of_digits():
    assert printedsteps.step_of(printedsteps.compile_pattern(r"iter (\d+):"), "iter 120: loss 2.3") == 120
    named = printedsteps.compile_pattern(r"(epoch \d+) step (?P<step>\d+)")
    assert printedsteps.step_of(named, "epoch 3 step 17") == 17
    assert printedsteps.step_of(printedsteps.compile_pattern(r"iter (\S+):"), "iter ten: x") is None
    assert printedsteps.step_of(printedsteps.compile_pattern(r"iter (\S+):"), "iter ١٢: x") is None   # not ASCII
    for bad in ("iter (\\d+", "iter \\d+", "(a)(b)", "", "x" * 300):
        with pytest.raises(ValueError):
            printedsteps.compile_pattern(bad)


def test_the_first_printed_step_is_noted_once_and_the_streams_are_given_back(monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    noted: list[tuple[int, int]] = []
    done = iter(range(1, 100))
    printedsteps.install(printedsteps.compile_pattern(r"iter (\d+):"), lambda: next(done), lambda s, n: noted.append((s, n)))
    assert sys.stdout is not out and sys.stdout.getvalue() == ""      # watched, and the original in all else
    print("step 100: train loss 2.0")
    print("iter ", end="")
    print("1", end="")
    print("02: loss 1.9")                           # one line written in pieces
    assert noted == [(102, 1)]
    assert sys.stdout is out and sys.stderr is err
    print("iter 105: loss 1.8")
    assert noted == [(102, 1)]
    assert out.getvalue() == "step 100: train loss 2.0\niter 102: loss 1.9\niter 105: loss 1.8\n"


def test_a_stream_that_fails_in_the_watch_still_writes(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", io.StringIO())

    def boom() -> int:
        raise RuntimeError("no steps")
    printedsteps.install(printedsteps.compile_pattern(r"iter (\d+):"), boom, lambda s, n: None)
    print("iter 3: loss 1")
    print("iter 4: loss 1")
    assert out.getvalue() == "iter 3: loss 1\niter 4: loss 1\n"


def test_the_rank_s_sitecustomize_names_the_variable_hpcml_run_sets():
    assert sitecustomize.STEP_PATTERN == printedsteps.ENV


def test_a_long_line_written_in_pieces_keeps_its_start_and_a_copy_does_not_recurse(monkeypatch):
    import copy
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    noted: list[tuple[int, int]] = []
    printedsteps.install(printedsteps.compile_pattern(r"^iter (\d+):"), lambda: 1, lambda s, n: noted.append((s, n)))
    watched = sys.stdout
    copy.copy(watched)
    sys.stdout.write("iter 7: ")
    for _ in range(10):
        sys.stdout.write("x" * 1000)                  # the line goes on past what is matched
    sys.stdout.write("\n")
    assert noted == [(7, 1)]
