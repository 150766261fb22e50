import dataclasses
import subprocess
import sys

import typer

from hpcml.vet import fastvet
from hpcml.vet.cli import app

PROLOG_ONLY = {"--prolog", "--budget", "--drain", "--overrun-ok", "--report-spool"}


def _hpcml(*args):
    return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True, timeout=120)


def test_fast_path_takes_every_option_of_the_typer_command(monkeypatch):
    """The job-script form skips Typer; it must not lose an option the documented one has."""
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    typer_flags = {opt for p in run.params for opt in p.opts if opt.startswith("--")} - PROLOG_ONLY
    seen = {}
    monkeypatch.setattr(fastvet, "execute", lambda args: seen.update(dataclasses.asdict(args)) or 0)
    argv = ["p.yaml"]
    for flag in sorted(typer_flags):
        argv += [flag] if flag in ("--local", "--json") else [flag, "1"]
    assert fastvet.main(argv) == 0
    given = {"--json" if k == "as_json" else "--" + k.replace("_", "-") for k, v in seen.items()
             if v and k != "protocol"}
    assert given == typer_flags


def test_help_and_prolog_and_other_commands_go_to_typer():
    assert not fastvet.wants(["--help"]) and not fastvet.wants(["p.yaml", "--prolog"])
    assert not fastvet.wants(["validate", "p.yaml"]) and fastvet.wants(["run", "p.yaml"])
    out = _hpcml("vet", "--help")
    assert out.returncode == 0 and "Usage" in out.stdout


def test_bad_flag_value_is_one_line_and_exit_2():
    out = _hpcml("vet", "p.yaml", "--min-nodes", "0")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "--min-nodes: must be at least 1, found 0" in out.stderr
