"""What ``hpcml run`` quotes of a rank's stderr (``hpcml.run.ranklog``): the rank's own
lines of the attempt asked for, never hpcml's header or notes."""

from __future__ import annotations

import pytest

from hpcml.run import ranklog
from hpcml.run.ranklog import header, last_own_line, own_lines

LOG = [
    "training...",
    "attempt 0's last words",
    header(1).rstrip("\n"),
    "hpcml observe record: warning: DCGM is not running",
    "Traceback (most recent call last):",
    "ValueError: attempt 1's own error",
    "hpcml run: the site's sitecustomize failed: RuntimeError: boom",
    header(2).rstrip("\n"),
    "hpcml run: cannot start 'pythn': No such file or directory",
    header(3).rstrip("\n"),
]


def test_each_attempts_own_lines_without_hpcmls_notes():
    assert own_lines(LOG, 0) == ["training...", "attempt 0's last words"]
    assert own_lines(LOG, 1) == ["Traceback (most recent call last):", "ValueError: attempt 1's own error"]
    assert own_lines(LOG, 2) == ["hpcml run: cannot start 'pythn': No such file or directory"]    # its cause
    assert own_lines(LOG, 3) == own_lines(LOG) == []                   # the last attempt said nothing yet
    assert own_lines(LOG[4:], 1) == own_lines(LOG, 1)                  # a tail that begins inside attempt 1
    assert own_lines(["a", "b"], 4) == ["a", "b"]                      # no header in the tail: the attempt's


def test_the_last_own_line_of_a_log(tmp_path):
    log = tmp_path / "rank-00001.err"
    log.write_text("\n".join(LOG) + "\n")
    assert last_own_line(log, 1) == "ValueError: attempt 1's own error"
    assert last_own_line(log, 3) == last_own_line(log) == ""
    assert last_own_line(tmp_path / "missing.err") == ""


FUTURE = ["/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:61: FutureWarning: The pynvml package is deprecated.",
          "  import pynvml  # type: ignore[import]"]
TRACE = ["Traceback (most recent call last):", '  File "/w/train.py", line 90, in <module>', "    main()",
         '  File "/w/train.py", line 42, in main', "    loss = step(batch)", "RuntimeError: CUDA out of memory"]


@pytest.mark.parametrize(("lines", "said"), [
    (FUTURE, ""),                                                     # a start-up warning is not why it died
    (["W1126 20:34:27.851000 4337 torch/distributed/run.py:874] warned"], ""),
    (FUTURE + TRACE, "RuntimeError: CUDA out of memory (/w/train.py:42 in main)"),
    ([f"[rank3]: {line}" for line in TRACE], "RuntimeError: CUDA out of memory (/w/train.py:42 in main)"),
    (TRACE + ["UserWarning: something after it"], "RuntimeError: CUDA out of memory (/w/train.py:42 in main)"),
    (["step 5", "NCCL error: unhandled system error", "UserWarning: x"], "NCCL error: unhandled system error"),
    (["hpcml run: cannot start 'trian.py': No such file or directory"],
     "hpcml run: cannot start 'trian.py': No such file or directory"),
])
def test_a_failure_is_quoted_only_with_a_line_that_belongs_to_it(lines, said):
    assert ranklog.failure_of(lines) == said


def test_a_program_that_chose_its_exit_is_quoted_its_last_words_a_killed_one_is_not():
    said = ["loading data", "injected crash at step 30"]
    assert ranklog.failure_of(said, chose=True) == "injected crash at step 30"     # sys.exit(1) after it
    assert ranklog.failure_of(said) == ""                                           # SIGKILL after it
    assert ranklog.failure_of(FUTURE, chose=True) == ""                             # a warning is never a reason


def test_failure_line_reads_the_attempts_own_lines(tmp_path):
    log = tmp_path / "rank-00000.err"
    log.write_text("\n".join(TRACE) + "\n" + ranklog.header(1) + "\n".join(FUTURE) + "\n")
    assert ranklog.failure_line(log, 1) == ""                          # attempt 1 said no error
    assert ranklog.failure_line(log, 0).startswith("RuntimeError: CUDA out of memory")
