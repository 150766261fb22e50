"""The Typer-free fast paths (``hpcml env run``, ``hpcml scan``, ``hpcml vet``: see
``hpcml.cli.FAST_PATHS``) declare their command's options a second time, in argparse, to
start without Typer. Nothing but this test keeps the two declarations alike, so for each:

* the same option strings (long and short), the same flags and repeatable options, the same
  positional arguments, and the same settings -> options for error messages (``FLAGS``);
* every command line below, parsed by the Typer command and by the fast path, reaches the
  command with the same values, or is refused by both with exit 2: no option (the
  defaults), each option in each spelling, all together, all without the arguments, each
  environment variable (alone, empty, and under its option), a value under an option's
  minimum, an unknown or abbreviated option.

The command lines are made from the Typer command's own parameters, so an option added to
one declaration and not the other fails here. Reading those parameters uses Typer's
internals, which is one reason typer is pinned in pyproject.toml.
"""

from __future__ import annotations

import argparse
import os
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from hpcml.cli_support import flags_of
from hpcml.env import fastrun
from hpcml.run import fastrun as runfast
from hpcml.scan import fastscan
from hpcml.vet import fastvet


def _scan(monkeypatch, seen: list) -> None:
    import hpcml.scan.command as command
    monkeypatch.setattr(command, "scan_files", lambda paths, **kw: seen.append({"paths": paths, **kw}) or 0)


def _vet(monkeypatch, seen: list) -> None:
    monkeypatch.setattr(fastvet, "execute", lambda protocol, **kw: seen.append({"protocol": protocol, **kw}) or 0)


def _run(monkeypatch, seen: list) -> None:
    import hpcml.run.launcher as launcher
    monkeypatch.setattr(launcher, "run", lambda opts: seen.append(vars(opts)) or 0)


def _env(monkeypatch, seen: list) -> None:
    import hpcml.env.resolve
    import hpcml.env.run

    def resolve(edf, site=None, lenient=None, **kw):
        seen.append({"edf": edf, "site": site, "lenient": lenient, **kw})
        return "the environment", []

    def render(env, command, runtime):
        seen[-1]["rendered"] = (list(command), runtime)
        return types.SimpleNamespace(notes=[], lines=lambda: [])

    monkeypatch.setattr(hpcml.env.resolve, "resolve", resolve)
    monkeypatch.setattr(hpcml.env.run, "render", render)
    monkeypatch.setattr(hpcml.env.run, "run", lambda env, command, runtime: seen[-1].update(
        command=list(command), runtime=runtime) or 0)


@dataclass
class FastPath:
    name: str
    fast: Any                                  # the module: parser(), main(), wants(), FLAGS
    app: Callable[[], typer.Typer]
    words: list[str]                           # the Typer command under its app
    record: Callable[[Any, list], None]        # stands in for what the command calls
    line: Callable[[list[str]], list[str]]     # a whole command line around some options
    typer_only: set[str] = field(default_factory=set)

    def command(self) -> Any:
        return typer.main.get_command(self.app()).commands[self.words[-1]]

    def options(self) -> list[Any]:
        return [p for p in self.command().params if p.param_type_name == "option"
                and not set(p.opts) & self.typer_only]


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
    FastPath("scan", fastscan, _scan_app, ["files"], _scan, lambda opts: [*opts, "a.pt", "b.pt"]),
    FastPath("env run", fastrun, _env_app, ["run"], _env, lambda opts: [*opts, "e.toml", "--", "python", "-c", "x"]),
    FastPath("vet", fastvet, _vet_app, ["run"], _vet, lambda opts: [*opts, "p.yaml"],
             typer_only={"--prolog", "--budget", "--drain", "--overrun-ok"}),
    FastPath("run", runfast, _run_app, ["run"], _run, lambda opts: [*opts, "--", "python", "-c", "x"]),
]
BY_NAME = {fp.name: fp for fp in PATHS}


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


def _given(p: Any, value: str = "3") -> list[list[str]]:
    """``p`` given once in each of its spellings (twice where it repeats)."""
    return [[o] if p.is_flag else [o, value, o, value + "0"] if p.multiple else [o, value]
            for o in [*p.opts, *p.secondary_opts]]


def command_lines(fp: FastPath) -> list[tuple[str, list[str], dict[str, str]]]:
    """(what it tries, argv, environment) for one fast path."""
    out: list[tuple[str, list[str], dict[str, str]]] = [("defaults", fp.line([]), {})]
    every: list[str] = []
    for p in fp.options():
        for argv in _given(p):
            out.append((" ".join(argv), fp.line(argv), {}))
        every += _given(p)[0]
        if p.envvar:
            value = f"5{os.pathsep}6" if p.multiple else "5"
            out.append((f"${p.envvar}", fp.line([]), {p.envvar: value}))
            out.append((f"${p.envvar} under {p.opts[0]}", fp.line(_given(p)[0]), {p.envvar: value}))
            out.append((f"${p.envvar} empty", fp.line([]), {p.envvar: ""}))
        if p.min is not None:
            out.append((f"{p.opts[0]} under its minimum", fp.line([p.opts[0], str(p.min - 1)]), {}))
    out.append(("every option", fp.line(every), {}))
    out.append(("no argument", every, {}))
    out.append(("an unknown option", fp.line(["--no-such-option"]), {}))
    longest = max((o for p in fp.options() for o in p.opts if o.startswith("--")), key=len)
    out.append((f"{longest} abbreviated", fp.line([longest[:-2]]), {}))
    return out


CASES = [pytest.param(fp.name, argv, env, id=f"{fp.name}: {what}")
         for fp in PATHS for what, argv, env in command_lines(fp)]


@pytest.mark.parametrize("name,argv,env", CASES)
def test_a_command_line_reaches_the_command_the_same_way_through_both(name, argv, env, monkeypatch):
    fp = BY_NAME[name]
    envvars = {p.envvar for p in fp.command().params if getattr(p, "envvar", None)}
    for var in envvars:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert fp.fast.wants(argv)
    (typer_code, typer_got), (fast_code, fast_got) = run_both(fp, argv, monkeypatch)
    assert (fast_code, fast_got) == (typer_code, typer_got)
    assert typer_code in (0, 2) and (typer_code == 0) == bool(typer_got)


@pytest.mark.parametrize("name", BY_NAME)
def test_the_fast_parser_declares_what_the_typer_command_declares(name):
    fp = BY_NAME[name]
    actions = fp.fast.parser()._actions
    typer_options = {p.name: p for p in fp.options()}
    fast_options = {a.dest: a for a in actions if a.option_strings}
    assert {o for p in typer_options.values() for o in [*p.opts, *p.secondary_opts]} == \
        {o for a in fast_options.values() for o in a.option_strings}
    assert set(fast_options) == set(typer_options)
    for dest, p in typer_options.items():
        a = fast_options[dest]
        assert (isinstance(a, argparse._StoreTrueAction), isinstance(a, argparse._AppendAction)) == \
            (bool(p.is_flag), bool(p.multiple)), dest
    variadic = ("+", "*", argparse.REMAINDER)
    assert [(p.name, p.nargs == -1, bool(p.required)) for p in fp.command().params if p.param_type_name == "argument"] \
        == [(a.dest, a.nargs in variadic, a.nargs not in ("?", "*", argparse.REMAINDER))
            for a in actions if not a.option_strings]


@pytest.mark.parametrize("name", BY_NAME)
def test_an_error_names_the_option_the_typer_command_would(name):
    """``FLAGS``: the settings an error of the fast path may name, as the user typed them."""
    fp = BY_NAME[name]
    typer_flags = flags_of(fp.command())
    assert {k: typer_flags.get(k) for k in fp.fast.FLAGS} == fp.fast.FLAGS


def test_what_only_typer_takes_goes_to_typer():
    """vet's --prolog options, and --help everywhere, are never parsed by a fast path."""
    for flag in BY_NAME["vet"].typer_only:
        assert not fastvet.wants(["p.yaml", flag]) and not fastvet.wants(["p.yaml", f"{flag}=5 s"])
    for fp in PATHS:
        assert not fp.fast.wants(fp.line(["--help"]))


def test_the_check_sees_a_drift(monkeypatch):
    """The comparison itself: a fast parser whose default differs from Typer's is caught
    (Typer's ``env run`` hands its runtime to the fast parser explicitly, so it is unchanged)."""
    fp = BY_NAME["env run"]
    original = fastrun.parser

    def drifted() -> argparse.ArgumentParser:
        p = original()
        p.set_defaults(runtime="podman")
        return p

    monkeypatch.setattr(fastrun, "parser", drifted)
    (_, typer_got), (_, fast_got) = run_both(fp, fp.line([]), monkeypatch)
    assert typer_got[0]["runtime"] == "auto" and fast_got[0]["runtime"] == "podman"


@pytest.mark.parametrize("argv", [["-1"], ["--interval", "5", "-x", "train.py"]])
def test_a_command_that_starts_like_an_option_is_refused_by_both(argv, monkeypatch):
    """argparse would take ``-1`` for the training command; Typer says "No such option"."""
    (typer_code, typer_got), (fast_code, fast_got) = run_both(BY_NAME["run"], argv, monkeypatch)
    assert (typer_code, typer_got) == (fast_code, fast_got) == (2, [])
