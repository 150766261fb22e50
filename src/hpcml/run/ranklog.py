"""A rank's stderr log as ``hpcml run`` quotes it: what the rank itself said, in one attempt.

Every attempt appends to the same ``JOBDIR/logs/rank-NNNNN.err``: the task wrapper writes a
header where each attempt after the first begins (``header``), and hpcml's own layers in the
rank's processes write notes there (the recorder's ``hpcml observe record: ...``, the
injected sitecustomize's, ``hpcml env run``'s). A crash line that quoted the log's last line
could quote one of those, or the attempt before's last words, instead of the rank's cause.
``last_own_line`` skips them. Two lines of hpcml's own are a rank's cause and are kept: its
command could not start (``hpcml.run.rankexec``), its wrapper failed (``hpcml.run.task``).

A failure is quoted only with a line that belongs to it (``failure_line``): a Python
traceback's exception and its last frame, or the last line that says an error; never the
last line whatever it is (a FutureWarning printed at start-up is not why a rank died).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

HEADER = re.compile(r"^--- hpcml run: attempt (\d+), ")
NOTE = "hpcml "                          # how every line hpcml writes into a rank's log begins
CAUSE = re.compile(r"^hpcml run: (cannot start |rank \S+: error: )")
TAIL_LINES = 40
TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
# a line that says an error: an exception's "Name: message", a C/C++ library's, the kernel's or a shell's
ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[\w.]*(?:Error|Exception|Interrupt|Exit)\b:?|error:|ERROR\b|FATAL\b|"
                   r"fatal:|Segmentation fault|Bus error|Killed\b|Aborted\b|terminate called|CUDA error|"
                   r"NCCL error|.*\b(?:error|Error|ERROR)\b.*(?:failed|refused|timed out))")
WARNING = re.compile(r"(?:Warning\b|warnings\.warn|^W\d{4} |^\[W )")


def header(attempt: int) -> str:
    """The line where attempt ``attempt``'s output begins in each rank's logs."""
    return f"--- hpcml run: attempt {attempt}, {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n"


def own_lines(lines: list[str], attempt: int | None = None) -> list[str]:
    """The lines of ``lines`` (a log's tail) that attempt ``attempt`` wrote (None: the last
    attempt in them), without hpcml's notes. Attempts are numbered one after another, so
    the lines above the first header in ``lines`` are the attempt before that header's; with
    no header in ``lines`` they are all the attempt asked for (the log's last)."""
    cuts = [int(m[1]) for line in lines if (m := HEADER.match(line))]
    if attempt is None and cuts:
        attempt = cuts[-1]
    current = cuts[0] - 1 if cuts else attempt
    out = []
    for line in lines:
        if m := HEADER.match(line):
            current = int(m[1])
        elif current == attempt and (not line.startswith(NOTE) or CAUSE.match(line)):
            out.append(line)
    return out


def last_own_line(path: Path, attempt: int | None = None) -> str:
    """The last line the rank wrote in attempt ``attempt`` (stripped; "" when none)."""
    from hpcml.run.jobdir import tail
    return next((line.strip() for line in reversed(own_lines(tail(path, TAIL_LINES), attempt)) if line.strip()), "")


def failure_line(path: Path, attempt: int | None = None, code: int | None = None) -> str:
    """What the rank said about its failure in attempt ``attempt``, or "" when it said
    nothing that is one: the last traceback's exception with its innermost frame
    ("RuntimeError: boom (train.py:42 in step)"), else the last line that says an error and
    is not a warning, else hpcml's own cause line (``CAUSE``). A program that chose its exit
    code (``code`` 1 to 128: ``sys.exit("why")``) is quoted its last plain line too; one a
    signal ended (above 128) was stopped from outside, and its last line is only what it
    happened to print before (a start-up warning)."""
    from hpcml.run.jobdir import tail
    return failure_of(own_lines(tail(path, TAIL_LINES), attempt), chose=code is not None and 0 < code <= 128)


def failure_of(lines: list[str], chose: bool = False) -> str:
    """``failure_line`` of a log's lines (one attempt's, without hpcml's notes)."""
    lines = [line.rstrip("\n") for line in lines]
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(TRACEBACK)]
    if starts:
        block = lines[starts[-1] + 1:]
        frames = [m for line in block if (m := FRAME.match(_unprefixed(line)))]
        # the exception: the first line after the frames that is not indented (frames and their code are)
        exc = next((text.strip() for line in block if (text := _unprefixed(line)).strip()
                    and not text.startswith((" ", "\t"))), "")
        if exc:
            where = f" ({frames[-1][1]}:{frames[-1][2]} in {frames[-1][3].strip()})" if frames else ""
            return exc + where
    for line in reversed(lines):
        text = _unprefixed(line).strip()
        if text and (CAUSE.match(text) or ERROR.match(text) and not WARNING.search(text)):
            return text
    if chose:                           # its last words, unless a warning or a warning's indented source line
        last = next((_unprefixed(line) for line in reversed(lines) if _unprefixed(line).strip()), "")
        if last and not last.startswith((" ", "\t")) and not WARNING.search(last):
            return last.strip()
    return ""


def _unprefixed(line: str) -> str:
    """A line without torchrun's ``[rankN]:`` prefix (its ``--tee``/``--redirects``)."""
    return re.sub(r"^\[rank\d+\]: ?", "", line)
