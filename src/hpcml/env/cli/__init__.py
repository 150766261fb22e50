"""``hpcml env``: the command group; each command lives in its own module."""

from __future__ import annotations

import typer

from hpcml.cli_support import Group
from hpcml.env.cli import check, run, show  # one module per pair of commands

app = typer.Typer(name="env", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="Container environments from Environment Definition Files (CSCS's EDF, TOML).\n\n"
                       "Example: [bold]srun hpcml env run ./pytorch.toml -- python train.py[/]\n\n"
                       "Exit codes: 0 ok (run: the command's own), 2 bad EDF or input, "
                       "check: 5 warnings, 6 errors.")
app.command("show")(show.show)
app.command("validate")(show.validate)
app.command("render")(run.render)
app.command("run", context_settings={"allow_interspersed_args": False})(run.run)
app.command("check")(check.check)
app.command("venv")(check.venv)
