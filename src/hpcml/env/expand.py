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
starts: ``to_shell`` turns such a value into POSIX ``sh`` lines that the in-container
wrapper runs, with the same rules (an undefined variable still fails, there).
"""

from __future__ import annotations

import re
import shlex
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


def references(text: str) -> list[str]:
    """The variables ``text`` references, defaults' included, in order; a malformed
    expansion is an ``ExpansionError`` (so this also validates an ``[env]`` value)."""
    names: list[str] = []
    for kind, value in _tokens(text):
        if kind == "lit":
            continue
        name, op, word = (value, None, "") if kind == "var" else _split_braced(value)
        names.append(name)
        if op is not None:
            names += references(word)
    return list(dict.fromkeys(names))


def to_shell(text: str, target: str) -> str:
    """POSIX ``sh`` lines that set the shell variable ``target`` to ``text`` expanded
    against the container's environment, with ``expand``'s rules.

    Literal text is only ever single-quoted (``shlex.quote``), and a default is an ``if``
    branch, never the word of ``${VAR:-word}``: shells disagree on quotes in that word
    inside double quotes (bash opens a quote at a ``'`` there, dash keeps it), which let
    a later ``[env]`` value run as code. So the lines mean the same in dash, bash (posix
    mode or not) and busybox sh. ``$VAR`` becomes ``${VAR?...}``, so a variable neither
    the host nor the image defines fails the start, as CSCS's rule says; a default's
    helper variables are ``target`` with a suffix, unset at the end."""
    lines: list[str] = []
    helpers: list[str] = []
    word = _shell_word(text, target, lines, helpers)
    lines.append(f"{target}={word}")
    if helpers:
        lines.append("unset " + " ".join(helpers))
    return "\n".join(lines)


def _shell_word(text: str, target: str, lines: list[str], helpers: list[str]) -> str:
    """``text`` as one shell word (quoted pieces side by side); the ``if`` lines that
    compute its defaults go to ``lines``, first."""
    parts: list[str] = []
    literal = ""
    for kind, value in _tokens(text):
        if kind == "lit":
            literal += value
            continue
        if literal:
            parts.append(shlex.quote(literal))
            literal = ""
        name, op, word = (value, None, "") if kind == "var" else _split_braced(value)
        if op is None:
            parts.append(f'"{_required(name)}"')
            continue
        helper = f"{target}_{len(helpers)}"
        helpers.append(helper)
        branch: list[str] = []
        default = _shell_word(word, target, branch, helpers)       # evaluated only when used
        is_set = f'"${{{name}:+x}}"' if op == ":-" else f'"${{{name}+x}}"'
        lines += [f'if [ -n {is_set} ]; then {helper}="${{{name}}}"; else', *branch,
                  f"{helper}={default}", "fi"]
        parts.append(f'"${{{helper}}}"')
    if literal:
        parts.append(shlex.quote(literal))
    return "".join(parts) or "''"


def _required(name: str) -> str:
    return "${" + name + "?undefined on the host and in the image (EDF [env])}"
