"""What ``hpcml run`` quotes of a rank's stderr (``hpcml.run.ranklog``): the rank's own
lines of the attempt asked for, never hpcml's header or notes."""

from __future__ import annotations

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
