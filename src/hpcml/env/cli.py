"""``hpcml env``: the command group; each command lives in its own module."""

from __future__ import annotations

import typer

from hpcml.env.cli_check import check, venv
from hpcml.env.cli_run import render, run
from hpcml.env.cli_show import show, validate

app = typer.Typer(no_args_is_help=True, rich_markup_mode="rich",
                  help="Container environments from Environment Definition Files (CSCS's EDF, TOML).\n\n"
                       "Example: [bold]srun hpcml env run ./pytorch.toml -- python train.py[/]\n\n"
                       "Exit codes: 0 ok (run: the command's own), 2 bad EDF or input, "
                       "check: 5 warnings, 6 errors.")
app.command("show")(show)
app.command("validate")(validate)
app.command("render")(render)
app.command("run", context_settings={"allow_interspersed_args": False})(run)
app.command("check")(check)
app.command("venv")(venv)
