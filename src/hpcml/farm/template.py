"""Fill a sweep's command template with parameter values, each one shell word.

A task runs as ``/bin/sh -c COMMAND``, and sweep files come from colleagues and
catalogues: a value ``b; touch x`` inserted as it is would run ``touch``. Each value is
therefore inserted shell-quoted (as GNU Parallel does with ``{}``), and the quoting
fits where the placeholder stands: outside quotes it is ``shlex.quote(value)``; inside
``'...'`` or ``"..."`` (or ``$'...'``) the quote is closed, the quoted value inserted and
the quote reopened, so ``--tag '{x}'`` and ``"run_{x}.log"`` stay one word holding the
value's exact bytes. Parameters named in ``raw`` are inserted as they are (shell code).
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Collection, Mapping
from typing import Any

_FORMATTER = string.Formatter()


class TemplateError(ValueError):
    """The template cannot be filled safely (the sweep names it as its command's problem)."""


class _Shell:
    """Where the shell is after a piece of the template: its quote, and the ``$(...)`` and
    backquotes it is inside (each has quotes of its own)."""

    def __init__(self) -> None:
        self.quote = ""         # '' outside quotes, "'", '"' or "$'"
        self.escaped = False    # a backslash is waiting for its character
        self.outer: list[list] = []     # [quote outside, open parentheses, closer] per $( or `
        self.prev = ""

    def feed(self, text: str) -> None:
        for ch in text:
            prev, self.prev = self.prev, ch
            if self.escaped:
                self.escaped, self.prev = False, ""
            elif self.quote in ("'", "$'"):
                if ch == "'":
                    self.quote = ""
                elif ch == "\\" and self.quote == "$'":
                    self.escaped = True
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.quote = "" if self.quote else '"'
            elif ch == "(" and prev == "$":
                self.outer.append([self.quote, 0, ")"])
                self.quote, self.prev = "", ""
            elif ch == "`":
                if self.outer and self.outer[-1][2] == "`" and not self.quote:
                    self.quote = self.outer.pop()[0]
                else:
                    self.outer.append([self.quote, 0, "`"])
                    self.quote = ""
            elif self.quote:
                continue
            elif ch == "'":
                self.quote = "$'" if prev == "$" else "'"
            elif self.outer and self.outer[-1][2] == ")" and ch in "()":
                if ch == "(":
                    self.outer[-1][1] += 1
                elif self.outer[-1][1]:
                    self.outer[-1][1] -= 1
                else:
                    self.quote = self.outer.pop()[0]


#: placeholders every command may use, known only when the attempt runs: each is inserted
#: as a reference to the variable the worker sets ("$HPCML_FARM_TASK_DIR"), one word
REFS = {"task_dir": "HPCML_FARM_TASK_DIR", "workdir": "HPCML_FARM_WORKDIR"}


def fill(template: str, values: Mapping[str, Any], raw: Collection[str] = ()) -> str:
    """``template.format(**values)`` with every value not in ``raw`` one inert shell word;
    ``{task_dir}`` and ``{workdir}`` (``REFS``) become the attempt's variables."""
    out: list[str] = []
    sh = _Shell()
    for literal, name, spec, conversion in _FORMATTER.parse(template):
        out.append(literal)
        sh.feed(literal)
        if name is None:
            continue
        if name in REFS and name not in values:
            if spec or conversion:
                raise TemplateError(f"'{{{name}}}' takes no format: it is a directory known when the task runs")
            if any(level[2] == "`" for level in sh.outer) or sh.escaped:
                raise TemplateError(f"'{{{name}}}' is inside backquotes or after a backslash: use it as a word")
            ref = f'"${REFS[name]}"'
            out.append(f"{sh.quote[-1]}{ref}{sh.quote}" if sh.quote else ref)
            continue
        obj, _ = _FORMATTER.get_field(name, (), values)
        obj = _FORMATTER.convert_field(obj, conversion)
        text = _FORMATTER.format_field(obj, _FORMATTER.vformat(spec or "", (), values))
        base = name.split(".")[0].split("[")[0]
        if base in raw:
            out.append(text)
            sh.feed(text)
            continue
        if any(level[2] == "`" for level in sh.outer):
            raise TemplateError(f"'{{{name}}}' is inside backquotes, where no quoting protects a value "
                                "(a ` in it ends them): use $(...) instead")
        if sh.escaped:
            raise TemplateError(f"'{{{name}}}' follows a backslash, which would take its first character "
                                "out of the quoting: remove the backslash")
        quoted = shlex.quote(text)
        out.append(f"{sh.quote[-1]}{quoted}{sh.quote}" if sh.quote else quoted)
    return "".join(out)
