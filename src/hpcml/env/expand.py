"""Variable expansion in EDF strings, by the CSCS rules.

Written by hand because neither standard tool has these rules: ``os.path.expandvars``
leaves undefined variables in place and knows neither ``$$`` nor ``${VAR:-default}``;
``string.Template`` treats ``$$`` right but has no defaults and no nesting. The EDF rules:
``${VAR}`` and ``$VAR`` fail when VAR is undefined, ``${VAR:-word}`` gives ``word`` when VAR is
unset or empty, ``${VAR-word}`` only when unset, ``word`` may itself hold expansions or be
empty, ``$$`` is a literal ``$``. Command substitution ``$(...)`` is refused, as Sarus Suite
does. A ``$`` before anything else stays literal, as in a shell.

``[env]`` values are resolved against the *container's* environment (the host's with the
image's winning, CSCS's "combined environment"), which exists only once the container
starts: ``to_shell`` turns such a value into a POSIX ``sh`` word that the in-container
wrapper evaluates, with the same rules (an undefined variable still fails, there).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from hpcml.errors import UsageError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_variable_name(name: str) -> bool:
    """A POSIX shell variable name: the only ``[env]`` names a shell line can set, so the
    only ones hpcml writes into the launch it prints and the script it runs in the container."""
    return _NAME.fullmatch(name) is not None


class ExpansionError(UsageError, ValueError):
    """An expansion that cannot be done (bad input, exit 2); ``variable`` names the culprit
    when there is one."""

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    """``text`` as ("lit", literal text), ("var", NAME) and ("braced", body of ``${...}``)."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 == n:
            yield "lit", c
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            yield "lit", "$"
            i += 2
        elif nxt == "{":
            end = _closing_brace(text, i + 2)
            yield "braced", text[i + 2:end]
            i = end + 1
        elif nxt == "(":
            raise ExpansionError("command substitution $(...) is not supported")
        else:
            m = _NAME.match(text, i + 1)
            if m is None:
                yield "lit", "$"
                i += 1
                continue
            yield "var", m.group()
            i = m.end()


def expand(text: str, environ: Mapping[str, str], *, keep_undefined: bool = False) -> str:
    """``text`` with every expansion done against ``environ``; ``keep_undefined`` leaves an
    undefined ``${VAR}`` as written instead of failing (a preview of an ``[env]`` value
    that the image may still define)."""
    out: list[str] = []
    for kind, value in _tokens(text):
        if kind == "lit":
            out.append(value)
        elif kind == "var":
            out.append(_lookup(value, environ, keep_undefined))
        else:
            out.append(_braced(value, environ, keep_undefined))
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


def _split_braced(body: str) -> tuple[str, str | None, str]:
    """``${body}`` as (name, operator or None, word); a bad one is an ``ExpansionError``."""
    m = _NAME.match(body)
    if m is None:
        raise ExpansionError(f"bad substitution '${{{body}}}': expected a variable name")
    name, rest = m.group(), body[m.end():]
    if not rest:
        return name, None, ""
    for op in (":-", "-"):
        if rest.startswith(op):
            return name, op, rest[len(op):]
    raise ExpansionError(f"bad substitution '${{{body}}}': only ${{VAR}}, ${{VAR:-default}} "
                         "and ${VAR-default} are supported", name)


def _braced(body: str, environ: Mapping[str, str], keep_undefined: bool) -> str:
    name, op, word = _split_braced(body)
    if op is None:
        return _lookup(name, environ, keep_undefined)
    value = environ.get(name)
    use_default = value is None or (op == ":-" and value == "")
    return expand(word, environ, keep_undefined=keep_undefined) if use_default else value  # type: ignore[return-value]


def _lookup(name: str, environ: Mapping[str, str], keep_undefined: bool = False) -> str:
    value = environ.get(name)
    if value is None:
        if keep_undefined:
            return "${" + name + "}"
        raise ExpansionError(f"undefined variable {name} (write ${{{name}:-}} for an empty default)",
                             name)
    return value


_SH_SPECIAL = {"\\": "\\\\", '"': '\\"', "$": "\\$", "`": "\\`"}


def to_shell(text: str) -> tuple[str, list[str]]:
    """``text`` as the inside of a POSIX ``sh`` double-quoted word, and the variables it
    references (none: the value is a literal). ``${VAR}`` becomes ``${VAR?...}``, so that a
    variable neither the host nor the image defines fails the start, as CSCS's rule says."""
    out: list[str] = []
    names: list[str] = []
    for kind, value in _tokens(text):
        if kind == "lit":
            out.append(_SH_SPECIAL.get(value, value))
            continue
        name, op, word = (value, None, "") if kind == "var" else _split_braced(value)
        names.append(name)
        if op is None:
            out.append(_required(name))
        else:
            inner, more = to_shell(word)
            names += more
            out.append("${" + name + op + inner + "}")
    return "".join(out), list(dict.fromkeys(names))


def _required(name: str) -> str:
    return "${" + name + "?undefined on the host and in the image (EDF [env])}"
