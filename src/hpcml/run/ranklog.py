"""A rank's stderr log as ``hpcml run`` quotes it: what the rank itself said, in one attempt.

Every attempt appends to the same ``JOBDIR/logs/rank-NNNNN.err``: the task wrapper writes a
header where each attempt after the first begins (``header``), and hpcml's own layers in the
rank's processes write notes there (the recorder's ``hpcml observe record: ...``, the
injected sitecustomize's, ``hpcml env run``'s). A crash line that quoted the log's last line
could quote one of those, or the attempt before's last words, instead of the rank's cause.
``last_own_line`` skips them. Two lines of hpcml's own are a rank's cause and are kept: its
command could not start (``hpcml.run.rankexec``), its wrapper failed (``hpcml.run.task``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

HEADER = re.compile(r"^--- hpcml run: attempt (\d+), ")
NOTE = "hpcml "                          # how every line hpcml writes into a rank's log begins
CAUSE = re.compile(r"^hpcml run: (cannot start |rank \S+: error: )")
TAIL_LINES = 40


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
