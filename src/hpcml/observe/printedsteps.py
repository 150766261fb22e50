"""The step a script prints (``hpcml run --step-pattern``): the step it resumed at.

A script that checkpoints itself and logs nothing but a line per iteration (nanoGPT's
``iter 100: loss 2.31, time 41.2ms``) tells no one, after a restart, which step it resumed
at, so the steps it did again were unknown. Given a regular expression with one group (or
a group named ``step``), rank 0's main process watches what it writes to stdout and stderr
until the pattern first matches, and writes that step, with the optimizer steps it had done
by then (``hpcml.observe.optimsteps``), where the run's record reads it
(``hpcml.cluster.requeue.note_printed``). Then it stops watching: the streams are its own
again and each line costs nothing more.

Why the optimizer steps beside the printed number: a script may print every N-th iteration,
before or after its step, counting from 0 or from 1. The printed number less the steps done
before it is the attempt's origin in the script's own numbering; two attempts' origins and
the steps each did give the steps done again, whatever the script's convention
(``hpcml.run.recovery.resume_of``). Only rank 0: the one rank every script lets print.
"""

from __future__ import annotations

import re
import sys
from typing import Any

ENV = "HPCML_RUN_STEP_PATTERN"
LINE_MAX = 4096                 # a line longer than this is matched on its first LINE_MAX characters
MAX_PATTERN = 256


def compile_pattern(text: str) -> re.Pattern[str]:
    """``text`` as a step pattern: one capturing group, or a group named ``step``, of digits.
    ``ValueError`` says what is wrong (``hpcml run`` turns it into exit 2)."""
    if not text or len(text) > MAX_PATTERN:
        raise ValueError(f"must be 1 to {MAX_PATTERN} characters")
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ValueError(f"is not a regular expression: {exc}") from None
    if "step" not in pattern.groupindex and pattern.groups != 1:
        raise ValueError(f"needs one group around the step number (or one named 'step'), it has {pattern.groups}")
    return pattern


def step_of(pattern: re.Pattern[str], line: str) -> int | None:
    """The step number ``line`` prints, if the pattern finds one that is a whole number."""
    m = pattern.search(line[:LINE_MAX])
    if m is None:
        return None
    got = m.group("step") if "step" in pattern.groupindex else m.group(1)
    return int(got) if got is not None and got.isascii() and got.isdigit() and len(got) <= 18 else None


class _Watched:
    """A stream that is the original in every respect, and shows its lines to ``seen``
    until it returns True."""

    def __init__(self, stream: Any, seen: Any) -> None:
        self._stream, self._seen, self._tail = stream, seen, ""

    def write(self, text: Any) -> Any:
        n = self._stream.write(text)
        if self._seen is not None and isinstance(text, str):
            try:
                self._look(text)
            except Exception:  # noqa: BLE001, S110 - the script's output goes on as without us
                self._seen = None
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _look(self, text: str) -> None:
        *lines, tail = (self._tail + text).split("\n")
        self._tail = tail[:LINE_MAX]                 # a line's first LINE_MAX characters: what step_of reads
        for line in lines:
            if self._seen is not None and self._seen(line):
                self._seen = None
                self._tail = ""

    def __getattr__(self, name: str) -> Any:
        if name == "_stream":                        # a copy made without __init__ (copy.copy): no recursion
            raise AttributeError(name)
        return getattr(self._stream, name)


def install(pattern: re.Pattern[str], steps_done: Any, note: Any) -> None:
    """Watch ``sys.stdout`` and ``sys.stderr`` until a line prints a step: then
    ``note(step, steps_done())`` once, and the streams are the originals again."""
    originals = {"stdout": sys.stdout, "stderr": sys.stderr}
    watched: dict[str, _Watched] = {}

    def seen(line: str) -> bool:
        step = step_of(pattern, line)
        if step is None:
            return False
        for name, stream in watched.items():
            stream._seen = None
            if getattr(sys, name) is stream:
                setattr(sys, name, originals[name])
        note(step, steps_done())
        return True

    for name, stream in originals.items():
        if stream is not None:
            watched[name] = _Watched(stream, seen)
            setattr(sys, name, watched[name])
