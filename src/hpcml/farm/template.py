"""Fill a sweep's command template with parameter values, each one shell word.

A task runs as ``/bin/sh -c COMMAND``, and sweep files come from colleagues and
catalogues: a value ``b; touch x`` inserted as it is would run ``touch``. Each value is
therefore inserted shell-quoted (as GNU Parallel does with ``{}``), and the quoting
fits where the placeholder stands: outside quotes it is ``shlex.quote(value)``; inside
``'...'`` or ``"..."`` (or ``$'...'``) the quote is closed, the quoted value inserted and
the quote reopened, so ``--tag '{x}'`` and ``"run_{x}.log"`` stay one word holding the
value's exact bytes. In an unquoted here-document body (``<<EOF``) quotes are literal, so
a value is inserted with ``\\``, ``$`` and backquotes escaped; in a quoted one (``<<'EOF'``)
as it is; in both it may not hold a newline or make its line the delimiter (the rest of
the body would run as shell). A placeholder is refused where no quoting protects it: in a
``#`` comment, a here-document's delimiter, arithmetic (``$((...))``) or a double-quoted
``${...}`` (both read ``'$(cmd)'`` as if double-quoted), right after an unquoted ``$``
(``${x}``: bash reads ``$'...'`` with escapes), and after what bash and dash read
differently (``((``, ``$[``, a ``$((`` closed by one ``)``): a tracker that guessed wrong
there would expose every value after it. Parameters named in ``raw`` are inserted as they
are (shell code).
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Collection, Mapping
from typing import Any

_FORMATTER = string.Formatter()

#: the longest command, in bytes: Linux passes at most 128 KiB as one argument (``sh -c``)
COMMAND_MAX = (128 << 10) - 1


def command_problem(command: object) -> str | None:
    """What makes ``command`` one no task could run (no program can be given a NUL, nor more
    than ``COMMAND_MAX`` bytes); None for a command. The task file's reader and the store
    (a Python caller's specs) ask it alike."""
    if not isinstance(command, str):
        return f"a command must be text, not {type(command).__name__}"
    if "\0" in command:
        return "a command contains a NUL byte, which no command can hold"
    if len(command.encode("utf-8", "surrogatepass")) > COMMAND_MAX:
        return f"a command is longer than one can be ({COMMAND_MAX} bytes)"
    return None


_BLANKS = " \t"
_OPERATORS = ";&|()<>"
_CLOSE = {"(": ")", "{": "}", "[": "]"}


class TemplateError(ValueError):
    """The template cannot be filled safely (the sweep names it as its command's problem)."""


class _Shell:
    """Where the shell is after a piece of the template: its quote, the ``$(...)`` and
    backquotes it is inside (each has quotes of its own), a ``#`` comment, and the
    here-documents whose body it reads (their quoting rules differ: a ``'`` in a comment
    or in a body is literal, and mistaking it for a quote exposes the values after it)."""

    def __init__(self) -> None:
        self.quote = ""         # '' outside quotes, "'", '"' or "$'"
        self.escaped = False    # a backslash is waiting for its character
        # per $( ` $(( (( ${ $[ "${ : [quote outside, open brackets, closer, kind]; kind is False
        # for $( and ` (commands: comments, here-documents), else the opener (no commands there)
        self.outer: list[list] = []
        self.prev = ""
        self.start = True       # the next character begins a word: a # there starts a comment
        self.comment = False
        self.lt = 0             # how many '<' came just before (2: a here-document's operator)
        self.delim: dict[str, Any] | None = None    # the here-document delimiter being read
        self.pending: list[tuple[str, bool, bool]] = []    # (delimiter, quoted, strip tabs): bodies to come
        self.body: tuple[str, bool, bool] | None = None    # the here-document whose body is being read
        self.line = ""          # the body's current line, values included
        self.line_values: list[str] = []    # placeholders on that line
        self.expands = False    # the body has had $( ${ or `: where a value would stand is not known
        self.unsure = ""        # what bash and dash read differently (e.g. ((: arithmetic / two subshells)
        self.arith_end = False  # a $(( ended with one ): it must be ))
        self.before: tuple[str, int, bool] = ("", 0, True)     # prev, lt, start before a backslash

    def feed(self, text: str) -> None:
        for ch in text:
            self._char(ch)

    def _char(self, ch: str) -> None:
        if self.body is not None:
            self._body_char(ch)
            return
        if self.outer and self.outer[-1][2] == "`":
            self._backquoted(ch)
            return
        if self.comment:
            if ch != "\n":
                return
            self.comment = False
        if self.delim is not None and self._delim_char(ch):
            return
        if self.lt == 2 and self._after_operator(ch):
            return
        self._arithmetic(ch)
        if self.escaped and ch == "\n" and self.quote not in ("'", "$'"):
            self.escaped = False        # \<newline> is not there: the two lines are one
            self.prev, self.lt, self.start = self.before
            return
        prev, self.prev = self.prev, "" if ch == "$" and self.prev == "$" else ch     # $$: the PID
        lt = self.lt
        if ch != "<":
            self.lt = 0
        if self.escaped:
            self.escaped, self.prev, self.start = False, "", False
        elif self.quote in ("'", "$'"):
            if ch == "'":
                self.quote = ""
            elif ch == "\\" and self.quote == "$'":
                self.escaped = True
        elif ch == "\\":
            self.escaped, self.before = True, (prev, lt, self.start)
        elif ch == '"':
            self.quote = "" if self.quote else '"'
            self.start = False
        elif ch == "{" and prev == "$" and self.quote == '"':     # "${x:-...}": its own quoting rules
            self.outer.append([self.quote, 0, "}", '"${'])
            self.quote = ""
        elif ch == "(" and prev == "$":
            self.outer.append([self.quote, 0, ")", False])
            self.quote, self.prev, self.start = "", "$(", True
        elif ch == "`":
            self.outer.append([self.quote, 0, "`", False])
            self.quote = ""
        elif not self.quote:
            self._unquoted(ch, prev)

    def _arithmetic(self, ch: str) -> None:
        """``$((`` is arithmetic only if ``))`` ends it, and then holds no quotes, ``;``,
        ``#`` or lines; otherwise sh and bash disagree on it (or read it as commands)."""
        if self.arith_end:              # $((...) and not )): a command substitution after all
            self.arith_end = False
            if ch != ")":
                self.unsure = self.unsure or "$((...) that is not arithmetic"
        elif self.outer and self.outer[-1][3] == "$((" and ch in "\n'\"`\\;#":
            self.unsure = self.unsure or "$((...) holding quotes, a ;, a # or a line break"

    def _backquoted(self, ch: str) -> None:
        """sh and bash end backquotes at the next unescaped ` whatever is between (quotes,
        comments, here-documents): no placeholder may stand there, so only the end counts."""
        if self.escaped:
            self.escaped = False
        elif ch == "\\":
            self.escaped = True
        elif ch == "`":
            self.quote = self.outer.pop()[0]
            self.prev, self.start = "", False

    def _after_operator(self, ch: str) -> bool:
        """The character after ``<<``: True when it is used up (``-``, or the delimiter's)."""
        self.lt = 0
        if ch == "<":               # <<< is a here-string (bash), not a here-document
            self.prev, self.start = ch, True
            return True
        self.delim = {"text": "", "quoted": False, "strip": ch == "-", "q": "", "esc": False, "begun": False}
        return ch == "-" or self._delim_char(ch)

    def _unquoted(self, ch: str, prev: str) -> None:
        arith = bool(self.outer) and self.outer[-1][3]      # no # comment or << here-document there
        closer = self.outer[-1][2] if self.outer else ""
        if ch == "'":
            self.quote = "$'" if prev == "$" else "'"
            self.start = False
            if arith == '"${':          # a ' in "${...}": literal to bash, a quote to dash (or not)
                self.unsure = self.unsure or "a ' inside \"${...}\""
        elif ch == "#" and self.start and not arith:
            self.comment = True
        elif ch == "\n":
            self.start = True
            if self.pending:
                self._open_body()
        elif ch == "<" and not arith:
            self.lt = 2 if self.lt == 1 and prev == "<" else 1
            self.start = True
        elif ch == "(" and (prev == "$(" or (prev == "(" and self.start)):    # $(( or ((: << is a shift
            self.outer.append([self.quote, 0, ")", "$((" if prev == "$(" else "(("])
            self.start = False
            self.unsure = self.unsure or ("((" if prev == "(" else "")
        elif ch in "{[" and prev == "$":                    # ${...} and $[...]: a word, not commands
            self.outer.append([self.quote, 0, _CLOSE[ch], "$" + ch])
            self.start = False
            self.unsure = self.unsure or ("$[" if ch == "[" else "")
        elif ch in _CLOSE and closer == _CLOSE[ch]:
            self.outer[-1][1] += 1
            self.start = True
        elif ch == closer:
            if self.outer[-1][1]:
                self.outer[-1][1] -= 1
                self.start = True
            else:
                level = self.outer.pop()
                self.quote, self.start, self.arith_end = level[0], False, level[3] == "$(("
        else:
            self.start = ch in _BLANKS or ch in _OPERATORS

    def _delim_char(self, ch: str) -> bool:
        """A character of a here-document's delimiter word; False when the word has ended
        before it (the character is then the shell's again)."""
        d = self.delim
        assert d is not None
        if d["esc"]:
            d["esc"] = False
            if ch != "\n":             # \<newline> joins the lines: it quotes nothing
                d["text"] += ch if d["q"] != '"' or ch in '$`"\\' else "\\" + ch
                d["quoted"] = d["begun"] = True
            return True
        if d["q"] == "'":
            if ch == "'":
                d["q"] = ""
            else:
                d["text"] += ch
            return True
        if d["q"] == '"':
            if ch == '"':
                d["q"] = ""
            elif ch == "\\":
                d["esc"] = True
            else:
                d["text"] += ch
            return True
        if ch in _BLANKS and not d["begun"]:
            return True
        if ch == "\\":
            d["esc"] = True
            return True
        if ch == "\n" or ch in _BLANKS or ch in _OPERATORS:
            if d["begun"]:
                self.pending.append((d["text"], d["quoted"], d["strip"]))
            self.delim, self.prev, self.start = None, "", True
            return False
        d["begun"] = True
        if ch in "'\"":
            d["q"], d["quoted"] = ch, True
        else:
            d["text"] += ch
        return True

    def _open_body(self) -> None:
        self.body = self.pending.pop(0)
        self.line, self.line_values, self.expands, self.escaped, self.prev = "", [], False, False, ""

    def _body_char(self, ch: str) -> None:
        assert self.body is not None
        delim, quoted, strip = self.body
        if ch == "\n" and self.escaped:      # bash joins the lines before looking for the delimiter, dash not
            self.unsure = self.unsure or "a here-document line ending in a backslash"
        if ch == "\n":
            line = self.line.lstrip("\t") if strip else self.line
            if line == delim and self.line_values:
                raise TemplateError(f"the value of '{{{self.line_values[0]}}}' makes its line {delim!r}, which "
                                    "ends the here-document early (the rest would run as shell)")
            self.line, self.line_values, self.escaped, self.prev = "", [], False, ""
            if line == delim:
                if self.pending:
                    self._open_body()
                else:
                    self.body, self.start = None, True
            return
        self.line += ch
        if quoted:
            return
        if self.escaped:
            self.escaped, self.prev = False, ""
            return
        if ch == "\\":
            self.escaped = True
        elif ch == "`" or (self.prev == "$" and ch in "({["):
            self.expands = True
        self.prev = ch

    def check(self, name: str) -> None:
        """Refuse a placeholder where no quoting makes its value inert."""
        if self.unsure or self.arith_end:
            self.unsure = self.unsure or "$((...) that is not arithmetic"
            raise TemplateError(f"'{{{name}}}' comes after {self.unsure}, which bash and sh (dash) read "
                                "differently, so where its value would stand is not known: write it another way "
                                "(for arithmetic: $((...)))")
        if self.comment:
            raise TemplateError(f"'{{{name}}}' is inside a # comment, where the shell ignores it (a newline in "
                                "the value would end the comment): move it out of the comment")
        if self.lt == 2 or self.delim is not None:
            raise TemplateError(f"'{{{name}}}' is in a here-document's delimiter (after <<): write the "
                                "delimiter itself, e.g. <<EOF")

    def check_value(self, name: str) -> None:
        """Refuse a value (not raw) where a quoted word is not a word: arithmetic reads
        ``'$(cmd)'`` as if in double quotes (runs it), and so does ``"${x:-...}"``."""
        kinds = {level[3] for level in self.outer}
        if kinds & {"$((", "((", "$["}:
            raise TemplateError(f"'{{{name}}}' is inside arithmetic ($((...))), where quoting does not "
                                "protect a value ($(...) in it would run): compute it in the program")
        if '"${' in kinds:
            raise TemplateError(f"'{{{name}}}' is inside \"${{...}}\" in double quotes, where quoting does "
                                "not protect a value: use it outside the ${...}")

    def inserted(self, text: str, name: str) -> None:
        """A value (or a variable's reference) ``text`` now stands where the shell is."""
        if self.body is not None:
            self.line += text
            self.line_values.append(name)
        self.prev, self.start, self.lt = "", False, 0


#: placeholders every command may use, known only when the attempt runs: each is inserted
#: as a reference to the variable the worker sets ("$HPCML_FARM_TASK_DIR"), one word
REFS = {"task_dir": "HPCML_FARM_TASK_DIR", "workdir": "HPCML_FARM_WORKDIR"}

_NUMBERS = re.compile(r"\d+")


def _body_value(sh: _Shell, name: str, text: str) -> str:
    """``text`` for a here-document body: literal in a quoted one, escaped in an unquoted one."""
    assert sh.body is not None
    if "\n" in text:
        raise TemplateError(f"'{{{name}}}' is in a here-document, where a newline in its value could end it: "
                            "the value has one")
    if sh.body[1]:
        return text
    if sh.escaped or sh.prev == "$" or sh.expands:
        raise TemplateError(f"'{{{name}}}' is in a here-document after a backslash, a $ or inside $(...), "
                            "${...} or backquotes, where no quoting protects a value: use it as plain text "
                            "there, or quote the delimiter (<<'EOF')")
    return text.replace("\\", "\\\\").replace("$", "\\$").replace("`", "\\`")


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
        sh.check(name)
        base = name.split(".")[0].split("[")[0]
        if base not in raw:
            sh.check_value(name)
        if name in REFS and name not in values:
            if spec or conversion:
                raise TemplateError(f"'{{{name}}}' takes no format: it is a directory known when the task runs")
            if sh.body is not None:
                if sh.body[1]:
                    raise TemplateError(f"'{{{name}}}' is in a quoted here-document (<<'EOF'), where the "
                                        "variable it stands for is not expanded: write <<EOF")
                ref = _body_value(sh, name, "") + "${" + REFS[name] + "}"
            else:
                if any(level[2] == "`" for level in sh.outer) or sh.escaped:
                    raise TemplateError(f"'{{{name}}}' is inside backquotes or after a backslash: use it as a word")
                ref = f'"${REFS[name]}"'
                ref = f"{sh.quote[-1]}{ref}{sh.quote}" if sh.quote else ref
            out.append(ref)
            sh.inserted(ref, name)
            continue
        obj, _ = _FORMATTER.get_field(name, (), values)
        obj = _FORMATTER.convert_field(obj, conversion)
        spec = _FORMATTER.vformat(spec or "", (), values)
        if any(int(n) > COMMAND_MAX for n in _NUMBERS.findall(spec)):
            raise TemplateError(f"'{{{name}}}' has a format width or precision over {COMMAND_MAX}, the "
                                "longest command that can run")
        text = _FORMATTER.format_field(obj, spec)
        if len(text) > COMMAND_MAX:
            raise TemplateError(f"the value of '{{{name}}}' is {len(text)} characters, longer than a "
                                f"command can be ({COMMAND_MAX} bytes)")
        if base in raw:
            out.append(text)
            sh.feed(text)
            continue
        if sh.body is not None:
            quoted = _body_value(sh, name, text)
            out.append(quoted)
            sh.inserted(quoted, name)
            continue
        if any(level[2] == "`" for level in sh.outer):
            raise TemplateError(f"'{{{name}}}' is inside backquotes, where no quoting protects a value "
                                "(a ` in it ends them): use $(...) instead")
        if sh.escaped:
            raise TemplateError(f"'{{{name}}}' follows a backslash, which would take its first character "
                                "out of the quoting: remove the backslash")
        if sh.prev == "$" and not sh.quote:
            raise TemplateError(f"'{{{name}}}' follows a $, which makes its quoting $'...' (where a \\ in "
                                "the value escapes the closing quote): write {" + name + "}, not ${" + name + "}")
        quoted = shlex.quote(text)
        out.append(f"{sh.quote[-1]}{quoted}{sh.quote}" if sh.quote else quoted)
        sh.inserted(quoted, name)
    command = "".join(out)
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > COMMAND_MAX:
        raise TemplateError(f"the command would be {size} bytes, longer than one can be ({COMMAND_MAX} bytes)")
    return command
