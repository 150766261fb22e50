"""Variable expansion in EDF strings, by the CSCS rules.

Written by hand because neither standard tool has these rules: ``os.path.expandvars``
leaves undefined variables in place and knows neither ``$$`` nor ``${VAR:-default}``;
``string.Template`` treats ``$$`` right but has no defaults and no nesting. The EDF rules:
``${VAR}`` and ``$VAR`` fail when VAR is undefined, ``${VAR:-word}`` gives ``word`` when VAR is
unset or empty, ``${VAR-word}`` only when unset, ``word`` may itself hold expansions or be
empty, ``$$`` is a literal ``$``. Command substitution ``$(...)`` is refused, as Sarus Suite
does. A ``$`` before anything else stays literal, as in a shell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hpcml.errors import UsageError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExpansionError(UsageError, ValueError):
    """An expansion that cannot be done (bad input, exit 2); ``variable`` names the culprit
    when there is one."""

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


def expand(text: str, environ: Mapping[str, str]) -> str:
    """``text`` with every expansion done against ``environ``."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 == n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            end = _closing_brace(text, i + 2)
            out.append(_braced(text[i + 2:end], environ))
            i = end + 1
        elif nxt == "(":
            raise ExpansionError("command substitution $(...) is not supported")
        else:
            m = _NAME.match(text, i + 1)
            if m is None:
                out.append("$")
                i += 1
                continue
            out.append(_lookup(m.group(), environ))
            i = m.end()
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
            continue
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ExpansionError(f"unterminated '${{' in {text!r}")


def _braced(body: str, environ: Mapping[str, str]) -> str:
    m = _NAME.match(body)
    if m is None:
        raise ExpansionError(f"bad substitution '${{{body}}}': expected a variable name")
    name, rest = m.group(), body[m.end():]
    if not rest:
        return _lookup(name, environ)
    for op in (":-", "-"):
        if rest.startswith(op):
            value = environ.get(name)
            use_default = value is None or (op == ":-" and value == "")
            return expand(rest[len(op):], environ) if use_default else value  # type: ignore[return-value]
    raise ExpansionError(f"bad substitution '${{{body}}}': only ${{VAR}}, ${{VAR:-default}} "
                         "and ${VAR-default} are supported", name)


def _lookup(name: str, environ: Mapping[str, str]) -> str:
    value = environ.get(name)
    if value is None:
        raise ExpansionError(f"undefined variable {name} (write ${{{name}:-}} for an empty default)",
                             name)
    return value
