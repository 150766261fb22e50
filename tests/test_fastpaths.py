"""The Typer-free fast paths (``hpcml.cli.FAST_PATHS``) and their Typer commands.

``hpcml run``, ``hpcml scan``, ``hpcml env run`` and ``hpcml vet`` declare their options
once, as the fields of a dataclass (``hpcml.run.config.Options``, ``hpcml.scan.fastscan.Files``,
``hpcml.env.fastrun.EnvRun``, ``hpcml.vet.fastvet.VetRun``), and ``hpcml.optspec`` builds both
parsers from it: there is no second copy to keep alike. What is left to prove, for each:

* both are built from the declaration: the Typer command's parameters are its fields,
  option for option (strings, help, default, environment variable, minimum, flag,
  repeatable, argument), the fast parser is ``optspec.fast_parser`` of it (without the
  ``typer_only`` options: vet's --prolog ones, which ``wants`` sends to Typer), and an error
  names the same option on both paths (``FLAGS``);
* they parse alike: every command line below, made from the declaration, reaches the
  command (``execute``, which both call) with the same values, or is refused by both with
  exit 2: no option (then the values are the declaration's defaults), each option in each
  spelling, all together, all without the arguments, each environment variable (alone,
  empty, and under its option), a value under an option's minimum, an unknown or
  abbreviated option;
* ``optspec`` itself: a declaration with every kind it knows parses alike through both,
  and a default changed in a declaration changes both parsers.

Reading the Typer command's parameters uses Typer's internals, which is one reason typer is
pinned in pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import typer
from typer.testing import CliRunner

from hpcml import optspec
from hpcml.cli_support import Group, flags_of
from hpcml.env import fastrun
from hpcml.env.fastrun import EnvRun
from hpcml.optspec import argument, option
from hpcml.run import fastrun as runfast
from hpcml.run.config import Options
from hpcml.scan import fastscan
from hpcml.scan.fastscan import Files
from hpcml.vet import fastvet
from hpcml.vet.fastvet import VetRun


def _execute(fast: Any) -> Callable[[Any, list], None]:
    """What a declared command's Typer command and fast path both call: record its values."""
    def record(monkeypatch, seen: list) -> None:
        monkeypatch.setattr(fast, "execute", lambda args: seen.append(dataclasses.asdict(args)) or 0)
    return record


@dataclass
class FastPath:
    name: str
    fast: Any                                  # the module: parser(), main(), wants(), FLAGS, PROG
    app: Callable[[], typer.Typer]
    words: list[str]                           # the Typer command under its app
    record: Callable[[Any, list], None]        # stands in for what the command calls
    line: Callable[[list[str]], list[str]]     # a whole command line around some options
    decl: type                                 # the one declaration

    def command(self) -> Any:
        return typer.main.get_command(self.app()).commands[self.words[-1]]


def _scan_app():
    from hpcml.scan.cli import app
    return app


def _env_app():
    from hpcml.env.cli import app
    return app


def _run_app():
    from hpcml.run.cli import app
    return app


def _vet_app():
    from hpcml.vet.cli import app
    return app


PATHS = [
    FastPath("scan", fastscan, _scan_app, ["files"], _execute(fastscan), lambda opts: [*opts, "a.pt", "b.pt"], Files),
    FastPath("env run", fastrun, _env_app, ["run"], _execute(fastrun),
             lambda opts: [*opts, "e.toml", "--", "python", "-c", "x"], EnvRun),
    FastPath("run", runfast, _run_app, ["run"], _execute(runfast), lambda opts: [*opts, "--", "python", "-c", "x"],
             Options),
    FastPath("vet", fastvet, _vet_app, ["run"], _execute(fastvet), lambda opts: [*opts, "p.yaml"], VetRun),
]
BY_NAME = {fp.name: fp for fp in PATHS}
DECLARED = [fp.name for fp in PATHS]


class Spec(NamedTuple):
    """An option as the command lines below need it."""

    opts: list[str]                            # every spelling
    flag: bool
    multiple: bool
    envvar: str | None
    min: int | None


def declared_specs(decl: type) -> list[Spec]:
    """The options both parsers take (a ``typer_only`` one never reaches the fast path)."""
    return [Spec(list(p.opt.flags), p.kind is bool, p.many, p.opt.envvar, p.opt.min)
            for p in optspec.params(decl) if p.opt.flags and not p.opt.typer_only]


def specs(fp: FastPath) -> list[Spec]:
    return declared_specs(fp.decl)


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def run_both(fp: FastPath, argv: list[str], monkeypatch) -> tuple[tuple[int, list], tuple[int, list]]:
    """(exit code, what the command got) through Typer, and through the fast path."""
    typer_seen: list = []
    fp.record(monkeypatch, typer_seen)
    result = CliRunner().invoke(fp.app(), [*fp.words, *argv])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    fast_seen: list = []
    fp.record(monkeypatch, fast_seen)
    try:
        code = fp.fast.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    return (result.exit_code, _plain(typer_seen)), (code, _plain(fast_seen))


def _given(s: Spec, value: str = "3") -> list[list[str]]:
    """``s`` given once in each of its spellings (twice where it repeats)."""
    return [[o] if s.flag else [o, value, o, value + "0"] if s.multiple else [o, value] for o in s.opts]


def command_lines(line: Callable[[list[str]], list[str]], options: list[Spec]) -> list[tuple[str, list[str], dict]]:
    """(what it tries, argv, environment) for one command."""
    out: list[tuple[str, list[str], dict[str, str]]] = [("defaults", line([]), {})]
    every: list[str] = []
    for s in options:
        for argv in _given(s):
            out.append((" ".join(argv), line(argv), {}))
        every += _given(s)[0]
        if s.envvar:
            value = f"5{os.pathsep}6" if s.multiple else "5"
            out.append((f"${s.envvar}", line([]), {s.envvar: value}))
            out.append((f"${s.envvar} under {s.opts[0]}", line(_given(s)[0]), {s.envvar: value}))
            out.append((f"${s.envvar} empty", line([]), {s.envvar: ""}))
        if s.min is not None:
            out.append((f"{s.opts[0]} under its minimum", line([s.opts[0], str(s.min - 1)]), {}))
    out.append(("every option", line(every), {}))
    out.append(("no argument", every, {}))
    out.append(("an unknown option", line(["--no-such-option"]), {}))
    longest = max((o for s in options for o in s.opts if o.startswith("--")), key=len)
    out.append((f"{longest} abbreviated", line([longest[:-2]]), {}))
    return out


def _environment(monkeypatch, names: set[str], env: dict[str, str]) -> None:
    for var in names:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)


CASES = [pytest.param(fp.name, argv, env, id=f"{fp.name}: {what}")
         for fp in PATHS for what, argv, env in command_lines(fp.line, specs(fp))]


@pytest.mark.parametrize("name,argv,env", CASES)
def test_a_command_line_reaches_the_command_the_same_way_through_both(name, argv, env, monkeypatch):
    fp = BY_NAME[name]
    _environment(monkeypatch, {s.envvar for s in specs(fp) if s.envvar}, env)
    assert fp.fast.wants(argv)
    (typer_code, typer_got), (fast_code, fast_got) = run_both(fp, argv, monkeypatch)
    assert (fast_code, fast_got) == (typer_code, typer_got)
    assert typer_code in (0, 2) and (typer_code == 0) == bool(typer_got)


# --- each declaration ---------------------------------------------------------------------

@pytest.mark.parametrize("name", DECLARED)
def test_without_options_the_command_gets_the_declared_defaults(name, monkeypatch):
    fp = BY_NAME[name]
    _environment(monkeypatch, {s.envvar for s in specs(fp) if s.envvar}, {})
    (_, got), _ = run_both(fp, fp.line([]), monkeypatch)
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(fp.decl) if f.metadata[optspec.KEY].flags      # the line gives arguments
                and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)}
    assert defaults and got[0].items() >= defaults.items()


@pytest.mark.parametrize("name", DECLARED)
def test_the_typer_command_is_built_from_the_declaration(name):
    """Each field is the Typer parameter it declares, and the command has no other."""
    fp = BY_NAME[name]
    command = fp.command()
    by_name = {p.name: p for p in command.params}
    declared = optspec.params(fp.decl)
    assert [p.typer_name for p in declared] == [p.name for p in command.params]
    for prm in declared:
        p, opt = by_name[prm.typer_name], prm.opt
        assert p.help == opt.help, prm.name
        if not opt.flags:
            assert (p.param_type_name, p.nargs == -1, p.required) == \
                ("argument", prm.many, not opt.rest and opt.default is ...), prm.name
            assert opt.rest or opt.default is ... or p.default == opt.default, prm.name
            continue
        assert (p.param_type_name, [*p.opts, *p.secondary_opts]) == ("option", list(opt.flags)), prm.name
        assert (bool(p.is_flag), bool(p.multiple), p.envvar, p.min) == (prm.kind is bool, prm.many, opt.envvar,
                                                                        opt.min), prm.name
        assert p.default == (False if prm.inverted else opt.default), prm.name


@pytest.mark.parametrize("name", DECLARED)
def test_the_fast_parser_and_the_error_names_come_from_the_declaration(name):
    fp = BY_NAME[name]
    made = optspec.fast_parser(fp.fast.PROG, fp.decl)
    shape = [(a.dest, a.option_strings, a.nargs, a.type, type(a)) for a in made._actions]
    assert [(a.dest, a.option_strings, a.nargs, a.type, type(a)) for a in fp.fast.parser()._actions] == shape
    assert {o for a in made._actions for o in a.option_strings} == \
        {o for prm in optspec.params(fp.decl) if not prm.opt.typer_only for o in prm.opt.flags}
    typer_options = {o for p in fp.command().params if p.param_type_name == "option" for o in p.opts}
    assert typer_options - {o for a in made._actions for o in a.option_strings} == optspec.typer_only(fp.decl)
    assert fp.fast.FLAGS == optspec.flags(fp.decl) == flags_of(fp.command())


def test_a_rest_argument_is_a_command_that_takes_no_options_after_it():
    """argparse takes every word after a ``rest`` argument as its own; click does only with
    interspersed arguments off, so every command with one is registered so."""
    for name in DECLARED:
        fp = BY_NAME[name]
        if any(p.opt.rest for p in optspec.params(fp.decl)):
            assert fp.command().context_settings.get("allow_interspersed_args") is False, name


def test_the_fast_paths_start_without_typer_or_pydantic():
    """The declarations and both fast parsers import neither (``typer_command`` imports Typer)."""
    code = ("import sys\n"
            "from hpcml import optspec\n"
            "from hpcml.run import fastrun as r\nfrom hpcml.scan import fastscan as s\nfrom hpcml.env import fastrun as e\n"
            "from hpcml.vet import fastvet as v\n"
            "optspec.parse(r.parser(), r.Options, ['--ntasks', '2', '--', 'true'])\n"
            "optspec.parse(s.parser(), s.Files, ['a.pt'])\n"
            "optspec.parse(e.parser(), e.EnvRun, ['e.toml', '--', 'true'])\n"
            "optspec.parse(v.parser(), v.VetRun, ['p.yaml', '--min-nodes', '2'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'pydantic', 'rich', 'click')))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout.strip()) == (0, "[]"), p.stderr


# --- optspec itself -------------------------------------------------------------------------

def _demo(said: str = "hello") -> type:
    """A declaration with every kind optspec knows (made fresh: ``params`` caches by class)."""
    @dataclass
    class Demo:
        name: str = argument(help="Who.")
        rest: list[str] = argument(rest=True, help="The rest.")
        greeting: str = option("--greeting", "-g", default=said, help="What to say.")
        times: int | None = option("--times", "-t", min=1, help="How often.")
        ratio: float = option("--ratio", default=0.5, help="A fraction.")
        where: Path | None = option("--where", help="A path.")
        tags: list[str] = option("--tag", default=[], envvar="OPTSPEC_DEMO_TAGS", help="Tags (repeatable).")
        files: list[Path] = option("--file", default=[], envvar="OPTSPEC_DEMO_FILES", help="Files.")
        loud: bool = option("--loud", "-l", default=False, help="Shout.")
        polite: bool = option("--no-polite", default=True, help="Drop the courtesy.")
    return Demo


def _demo_app(decl: type, seen: list) -> typer.Typer:
    app = typer.Typer(cls=Group, add_completion=False)

    @app.command("go", context_settings={"allow_interspersed_args": False})
    @optspec.typer_command(decl)
    def go(values: Any) -> None:
        seen.append(dataclasses.asdict(values))

    @app.command("other")
    def other() -> None:
        """Keeps ``go`` a sub-command."""

    return app


def _parse_both(decl: type, argv: list[str]) -> tuple[tuple[int, list], tuple[int, list]]:
    typer_seen: list = []
    result = CliRunner().invoke(_demo_app(decl, typer_seen), ["go", *argv])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    try:
        fast_seen = [dataclasses.asdict(decl(**optspec.parse(optspec.fast_parser("demo", decl), decl, argv)))]
        code = 0
    except SystemExit as exc:
        fast_seen, code = [], exc.code
    return (result.exit_code, _plain(typer_seen)), (code, _plain(fast_seen))


DEMO_ENV = {"OPTSPEC_DEMO_TAGS", "OPTSPEC_DEMO_FILES"}
DEMO_CASES = [pytest.param(argv, env, id=what) for what, argv, env in command_lines(
    lambda opts: [*opts, "ann", "--", "x", "-y"], declared_specs(_demo()))]
#: where the rest starts: after an argument, after "--" (which may come before the argument,
#: or start the rest itself), options after the argument (the rest's own)
DASHES = (["ann"], ["ann", "x", "--greeting", "hi"], ["ann", "--", "--", "x"], ["--", "ann", "--", "x"],
          ["--", "ann", "--", "--", "x"], ["-l", "--", "ann", "x"], ["ann", "x", "--", "y"], ["ann", "--"], ["--"],
          ["-g", "hi", "ann", "-1"])
DEMO_CASES += [pytest.param(argv, {}, id=" ".join(argv)) for argv in (
    *DASHES, ["--times", "x", "ann"], ["--ratio", "nan?", "ann"], ["--times=2", "ann"], ["-lt3", "ann"])]


@pytest.mark.parametrize("argv,env", DEMO_CASES)
def test_a_declaration_of_every_kind_parses_alike_through_both(argv, env, monkeypatch):
    _environment(monkeypatch, DEMO_ENV, env)
    (typer_code, typer_got), (fast_code, fast_got) = _parse_both(_demo(), argv)
    assert (fast_code, fast_got) == (typer_code, typer_got)
    assert typer_code in (0, 2) and (typer_code == 0) == bool(typer_got)


def test_a_default_changed_in_the_declaration_changes_both_parsers():
    """What the old two-copy test guarded against cannot happen: there is one place to change."""
    for greeting in ("hello", "bonjour"):
        (_, typer_got), (_, fast_got) = _parse_both(_demo(greeting), ["ann"])
        assert typer_got == fast_got and typer_got[0]["greeting"] == greeting


def test_an_error_names_what_the_user_typed():
    demo = _demo()
    assert optspec.flags(demo) == {"name": "NAME", "rest": "REST", "greeting": "--greeting", "times": "--times",
                                   "ratio": "--ratio", "where": "--where", "tags": "--tag", "tag": "--tag",
                                   "files": "--file", "file": "--file", "loud": "--loud",
                                   "no_polite": "--no-polite", "no-polite": "--no-polite"}
    seen: list = []
    assert optspec.flags(demo) == flags_of(typer.main.get_command(_demo_app(demo, seen)).commands["go"])


# --- all four ---------------------------------------------------------------------------------

def test_what_only_typer_takes_goes_to_typer():
    """vet's --prolog options (``typer_only``), and --help everywhere, are never parsed by a fast path."""
    assert optspec.typer_only(VetRun) == {"--prolog", "--budget", "--drain", "--overrun-ok", "--report-spool"}
    for flag in optspec.typer_only(VetRun):
        assert not fastvet.wants(["p.yaml", flag]) and not fastvet.wants(["p.yaml", f"{flag}=5 s"])
    for fp in PATHS:
        assert not fp.fast.wants(fp.line(["--help"]))


@pytest.mark.parametrize("name,argv", [
    ("run", ["--", "--", "x"]), ("run", ["--ntasks", "2", "--"]), ("run", ["python", "--", "x"]), ("run", ["--"]),
    ("env run", ["--", "e.toml", "--", "x"]), ("env run", ["e.toml", "--", "--", "x"]),
    ("env run", ["-v", "e.toml", "x", "--", "y"]), ("env run", ["e.toml", "-v", "x"]), ("env run", ["e.toml", "--"])])
def test_the_command_after_dashes_reaches_it_the_same_way_through_both(name, argv, monkeypatch):
    """``--`` ends the options once: a second one, or one inside the command, is the command's."""
    (typer_code, typer_got), (fast_code, fast_got) = run_both(BY_NAME[name], argv, monkeypatch)
    assert (fast_code, fast_got) == (typer_code, typer_got)
    assert typer_code == 0


@pytest.mark.parametrize("argv", [["-1"], ["--interval", "5", "-x", "train.py"]])
def test_a_command_that_starts_like_an_option_is_refused_by_both(argv, monkeypatch):
    """argparse would take ``-1`` for the training command; Typer says "No such option"."""
    (typer_code, typer_got), (fast_code, fast_got) = run_both(BY_NAME["run"], argv, monkeypatch)
    assert (typer_code, typer_got) == (fast_code, fast_got) == (2, [])
