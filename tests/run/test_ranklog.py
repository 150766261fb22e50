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


def test_a_log_that_is_a_fifo_a_link_out_or_escapes_is_read_without_waiting_or_obeying(tmp_path):
    """The rank's stderr is its program's: a FIFO put in its place is not waited on (the
    launcher's crash line and the job's end used to block for ever), a link out of the job
    directory is not followed, and a line's terminal escapes (a fake "all ranks OK", a cleared
    screen, a window title) come out as text (was: sent to the launcher's terminal)."""
    import os
    import threading

    from hpcml.run.jobdir import tail
    fifo = tmp_path / "rank-00001.err"
    os.mkfifo(fifo)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(ranklog.failure_line(fifo, 0, 1)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive() and got == [""], "the reader waited on the FIFO"
    secret = tmp_path / "outside"
    secret.write_text("RuntimeError: read through a link\n")
    (tmp_path / "rank-00002.err").symlink_to(secret)
    assert tail(tmp_path / "rank-00002.err") == []
    log = tmp_path / "rank-00003.err"
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\x1b]0;pwned\x07\x1b[2J"
                   "\x1b[31mFAKE hpcml run: all ranks OK\n")
    line = ranklog.failure_line(log, 0, 1)
    assert line.startswith("RuntimeError: boom") and "\x1b" not in line and "\\x1b" in line, line
    assert all("\x1b" not in text and "\x07" not in text for text in tail(log))
