"""``hpcml vet serve | handle | rules | fleet-report`` are aliases of ``hpcml centre serve |
handle | rules | report``: the centre's own callbacks, so the same options and behaviour, with
help that says whose alias each is; a message names the command as it was typed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from hpcml.centre.cli import app as centre_app
from hpcml.vet.cli import app as vet_app

ALIASES = {"serve": "serve", "handle": "handle", "rules": "rules", "fleet-report": "report"}


def _command(app: typer.Typer, name: str):
    return typer.main.get_command(app).commands[name]       # type: ignore[attr-defined]


@pytest.mark.parametrize("alias,name", ALIASES.items())
def test_the_alias_is_the_centre_command_itself(alias, name):
    registered = {c.name: c.callback for c in vet_app.registered_commands}
    assert registered[alias] is {c.name: c.callback for c in centre_app.registered_commands}[name]
    old, new = _command(vet_app, alias), _command(centre_app, name)
    assert [(p.name, p.opts, p.default, p.required) for p in old.params] == \
        [(p.name, p.opts, p.default, p.required) for p in new.params]
    assert old.help == f"Alias of [bold]hpcml centre {name}[/]. {new.help}"


def test_the_aliases_are_listed_as_aliases():
    p = subprocess.run([sys.executable, "-m", "hpcml", "vet", "--help"], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    for alias, name in ALIASES.items():
        line = next(x for x in p.stdout.splitlines() if f" {alias} " in x)
        assert f"Alias of hpcml centre {name}." in line, line
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "--help"], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and "Alias" not in p.stdout, p.stdout + p.stderr
    assert all(f" {name} " in p.stdout for name in ALIASES.values()), p.stdout


@pytest.mark.parametrize("app,words", [(centre_app, "hpcml centre handle"), (vet_app, "hpcml vet handle")])
def test_an_error_names_the_command_as_typed(tmp_path, app, words):
    out = CliRunner().invoke(app, ["handle", "--audit", str(tmp_path / "a")])
    assert out.exit_code == 2 and f"{words}: error: give either --results" in out.output, out.output


@pytest.mark.parametrize("app", [centre_app, vet_app])
def test_rules_validates_the_built_in_catalog_either_way(app):
    from hpcml.centre.rules import DEFAULT_RULES
    out = CliRunner().invoke(app, ["rules", str(DEFAULT_RULES)])
    assert out.exit_code == 0 and "valid rules catalog 'default-node-rules'" in out.output, out.output
