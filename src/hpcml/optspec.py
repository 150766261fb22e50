"""A command's options declared once, as the fields of a dataclass, and both of its parsers
built from that one declaration.

The commands with a Typer-free fast path (``hpcml run``, ``hpcml scan``, ``hpcml env run``,
``hpcml vet``: ``hpcml.cli.FAST_PATHS``) are parsed by Typer (``--help``, and the command when it is
called through the app) and by argparse (``hpcml.fastparser``, every ordinary start).
Each field says everything either parser needs: its type (the field's annotation), its
default (the field's), and in its metadata an ``Opt``: option strings, help text, an
environment variable, a minimum. So::

    @dataclass
    class Files:
        paths: list[Path] = argument(help="Files or directories (recursive).")
        jobs: int | None = option("--jobs", "-j", min=1, help="Parallel processes (default: CPUs).")
        as_json: bool = option("--json", default=False, help="Print the JSON report.")

    parse(fast_parser("hpcml scan", Files), Files, argv)      # the fast path: {"paths": ..., ...}

    @app.command("files")
    @typer_command(Files)                                        # the Typer command
    def files(args: Files) -> None: ...

What a type means: ``bool`` a flag that sets the field to ``not default`` (a field that is
True unless ``--no-report`` is a Typer parameter ``no_report``, False unless given);
``list[X]`` a repeatable option, or an argument of one or more values; ``X | None`` a
value that may be absent. An argument declared ``rest=True`` is the rest of the command
line (the command a launcher runs, after ``--``): argparse takes every word after it as its
own, as click does for a command registered with ``context_settings={"allow_interspersed_args":
False}``, which every fast path's is (tests/test_fastpaths.py checks).

Importable without Typer or pydantic, which the fast paths exist to avoid: ``typer_command``
imports Typer when a command's CLI module calls it.
"""

from __future__ import annotations

import functools
import os
import types
import typing
from collections.abc import Callable
from dataclasses import field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from hpcml.fastparser import FastParser

KEY = "hpcml.opt"                # the metadata key of a field's Opt
T = TypeVar("T")


class Opt(NamedTuple):
    """One option (``flags``: its option strings, long first) or positional argument (no
    flags) of a command. ``default``: ``...`` for an argument, whose dataclass field is
    required (a ``rest`` one too: both parsers give it ``[]`` when absent), or its value when
    it is left out (an optional argument). A NamedTuple, not a dataclass: it is made on every
    fast path's start, and costs a tenth."""

    flags: tuple[str, ...]
    help: str
    default: Any = ...
    envvar: str | None = None        # the value when the option is not given (empty: not set)
    min: int | None = None           # the smallest value it takes
    rest: bool = False               # an argument: the rest of the command line
    typer_only: bool = False         # only the Typer command takes it (the fast path's wants() sends it there)
    convert: Any = None              # the fast parser's converter, in place of the type's (its own messages)

    def field(self) -> Any:
        """A dataclass field declaring this option (``runtime: str = RUNTIME.field()``)."""
        meta = {KEY: self}
        if self.default is ...:
            return field(metadata=meta)
        if isinstance(self.default, list):
            return field(default_factory=functools.partial(list, self.default), metadata=meta)
        return field(default=self.default, metadata=meta)


def option(*flags: str, help: str, default: Any = None, envvar: str | None = None, min: int | None = None,
           typer_only: bool = False, convert: Any = None) -> Any:
    """A dataclass field that is an option (``default``: None, or what the type needs).
    ``typer_only``: an option the fast parser does not take (the fast path's ``wants`` sends a
    command line with it to Typer); ``convert``: the fast parser's converter of its value."""
    return Opt(flags, help, default, envvar, min, typer_only=typer_only, convert=convert).field()


def argument(*, help: str, rest: bool = False, default: Any = ...) -> Any:
    """A dataclass field that is a positional argument: required, with ``default`` one that
    may be left out, or with ``rest`` the rest of the command line (the command a launcher runs)."""
    return Opt((), help, default, rest=rest).field()


class Param(NamedTuple):
    """A field of a declaration, read: its ``Opt`` and what its annotation says."""

    name: str
    opt: Opt
    kind: type                    # str, int, float, Path or bool: one value's type
    many: bool                    # list[kind]
    annotation: Any               # the field's annotation, evaluated (what Typer reads)

    @property
    def inverted(self) -> bool:
        """A flag that turns a True setting off (``report`` and ``--no-report``)."""
        return _inverted(self.opt)

    @property
    def typer_name(self) -> str:
        return _typer_name(self.name, self.opt)


def _inverted(opt: Opt) -> bool:
    return bool(opt.flags) and opt.default is True


def _typer_name(name: str, opt: Opt) -> str:
    """The Typer parameter of a field (and the fast parser's ``dest``): its name; an inverted
    flag's is its option's (``--no-report``: ``no_report``), as Typer takes a flag to be off
    unless given."""
    return opt.flags[0].lstrip("-").replace("-", "_") if _inverted(opt) else name


@functools.cache
def params(decl: type) -> tuple[Param, ...]:
    """The fields of ``decl`` that declare an option or argument, in order."""
    hints = typing.get_type_hints(decl)
    out = []
    for f in fields(decl):
        opt = f.metadata.get(KEY)
        if opt is None:
            continue
        hint = hints[f.name]
        kind, many = _kind(hint)
        out.append(Param(f.name, opt, kind, many, hint))
    return tuple(out)


def _kind(hint: Any) -> tuple[type, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        [hint] = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0], True
    return hint, False


def flags(decl: type) -> dict[str, str]:
    """The settings an error may name -> as the user typed them (``hpcml.cli_report``):
    each option's Typer parameter (its field's name but for an inverted flag's) and its long
    options' names -> its first long option; an argument -> its name in --help (``cmd`` ->
    ``CMD``). What ``hpcml.cli_support.flags_of`` reads from the Typer command, so an error
    reads the same on both paths: a ``typer_only`` option's too, which the Typer command has.
    Read without evaluating the annotations."""
    out: dict[str, str] = {}
    for f in fields(decl):
        opt = f.metadata.get(KEY)
        if opt is None:
            continue
        if not opt.flags:
            out[f.name] = f.name.upper()
            continue
        flag = next((o for o in opt.flags if o.startswith("--")), opt.flags[0])
        for key in (_typer_name(f.name, opt), *(o.lstrip("-") for o in opt.flags if o.startswith("--"))):
            out.setdefault(key, flag)
    return out


def typer_only(decl: type) -> set[str]:
    """The option strings of ``decl``'s ``typer_only`` options, which only Typer parses (a
    fast path's ``wants`` sends a command line with one of them to Typer)."""
    return {o for f in fields(decl) if (opt := f.metadata.get(KEY)) is not None and opt.typer_only
            for o in opt.flags}


# --- the fast path: argparse ---------------------------------------------------------------

def fast_parser(prog: str, decl: type) -> FastParser:
    """``decl``'s options and arguments for argparse, each under its Typer parameter's name.
    An option not given is left out of the result (``parse`` then fills in its environment
    variable, the dataclass its default). A ``typer_only`` option is not there: the
    dataclass's default holds."""
    import argparse

    from hpcml.fastparser import FastParser
    p = FastParser(prog=prog, add_help=False)
    for prm in params(decl):
        if prm.opt.typer_only:
            continue
        convert: Any = prm.opt.convert or (None if prm.kind is str else prm.kind)
        if not prm.opt.flags:
            nargs = (argparse.REMAINDER if prm.opt.rest else "+" if prm.many
                     else None if prm.opt.default is ... else "?")
            p.add_argument(prm.name, nargs=nargs, type=convert)
        elif prm.kind is bool:             # --no-report: no_report=True, which parse() makes report=False
            p.add_argument(*prm.opt.flags, dest=prm.typer_name, default=argparse.SUPPRESS, action="store_true")
        else:
            p.add_argument(*prm.opt.flags, dest=prm.typer_name, default=argparse.SUPPRESS, type=convert,
                           action="append" if prm.many else "store")
    return p


def parse(parser: FastParser, decl: type, argv: list[str]) -> dict[str, Any]:
    """``argv``'s values by field (``decl(**values)``), as the Typer command gets them: an
    option not given takes its environment variable when that is set and not empty (a list
    split as click splits it: paths at ``os.pathsep``, others at spaces), else is left out
    (the field's default holds); a value under its minimum is an error (exit 2). A ``rest``
    argument is what the Typer command gets: without the ``--`` that ended the options, and
    one ``--`` that starts it dropped; when it is the first argument, a first word that looks
    like an option is one click does not know (argparse takes ``-1`` for the command)."""
    values = vars(parser.parse_args(argv))
    first = True                               # no positional argument before this field
    for prm in params(decl):
        opt = prm.opt
        if opt.typer_only:
            continue
        if prm.inverted and values.pop(prm.typer_name, False):
            values[prm.name] = False
        if opt.rest:
            rest = values[prm.name]
            head = rest[0] if rest else ""
            if first and head.startswith("-") and head not in ("-", "--"):
                parser.error(f"No such option: {head}")
            # argparse keeps the "--" that ends the options in the rest, but an argument just
            # before it takes it (click leaves it in the rest, and typer_command drops it)
            taken = "--" in argv and len(rest) == len(argv) - argv.index("--") - 1
            values[prm.name] = rest[1:] if head == "--" and not taken else rest
        first = first and bool(opt.flags)
        if opt.envvar and prm.name not in values and os.environ.get(opt.envvar):
            values[prm.name] = _from_env(parser, prm, os.environ[opt.envvar])
        value = values.get(prm.name)
        if opt.min is not None and value is not None and value < opt.min:
            parser.error(f"{opt.flags[0]} must be at least {opt.min}, got {value}")
    return values


def _from_env(parser: FastParser, prm: Param, text: str) -> Any:
    words = (text.split(os.pathsep) if prm.kind is Path else text.split()) if prm.many else [text]
    try:
        converted = [prm.kind(w) for w in words]
    except ValueError:
        parser.error(f"${prm.opt.envvar}: invalid {prm.kind.__name__} value: {text!r}")
    return converted if prm.many else converted[0]


# --- Typer ---------------------------------------------------------------------------------

def typer_command(decl: type[T]) -> Callable[[Callable[[T], Any]], Callable[..., Any]]:
    """Make ``body(values: decl)`` a Typer command whose parameters are ``decl``'s fields,
    with the body's name and docstring (its --help). Typer reads the parameters from the
    command's ``__signature__``; the command builds ``decl`` from what Typer parsed."""
    import inspect

    import typer

    def parameter(prm: Param) -> inspect.Parameter:
        opt = prm.opt
        info: Any
        if not opt.flags:
            info = typer.Argument(None if opt.rest else opt.default, help=opt.help)
        else:
            default = False if prm.inverted else list(opt.default) if prm.many else opt.default
            info = typer.Option(default, *opt.flags, help=opt.help, envvar=opt.envvar, min=opt.min)
        return inspect.Parameter(prm.typer_name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                 annotation=prm.annotation)

    def decorate(body: Callable[[T], Any]) -> Callable[..., Any]:
        klass: type = decl
        declared = params(klass)
        positional = [prm for prm in declared if not prm.opt.flags]

        def command(**given: Any) -> Any:
            values: dict[str, Any] = {}
            for prm in declared:
                value: Any = given[prm.typer_name]
                value = (not value) if prm.inverted else list(value or []) if prm.many else value
                if prm.opt.rest and prm is not positional[0] and value[:1] == ["--"]:
                    value = value[1:]                   # click passes it on after the first argument
                values[prm.name] = value
            return body(decl(**values))

        command.__signature__ = inspect.Signature([parameter(prm) for prm in declared])  # type: ignore[attr-defined]
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(command, attr, getattr(body, attr))
        return command

    return decorate
