"""``hpcml service``: the command group; each command lives in its own module."""

from __future__ import annotations

import typer

from hpcml.cli_support import Group
from hpcml.service.cli import lifecycle, render  # one module per group of commands

app = typer.Typer(name="service", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="Supporting and inference services from blueprints: on this machine, in a Slurm job, "
                       "or rendered for a team's Kubernetes namespace.\n\n"
                       "Example: [bold]hpcml service up mlflow[/]\n\n"
                       "Exit codes: 0 ok, 1 the service failed, 2 bad blueprint or input.")
app.command("list")(render.list_blueprints)
app.command("validate")(render.validate)
app.command("render")(render.render)
app.command("up")(lifecycle.up)
app.command("down")(lifecycle.down)
app.command("status")(lifecycle.status)
app.command("logs")(lifecycle.logs)
