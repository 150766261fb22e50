"""The ``hpcml`` command's Typer app: mounts each component's sub-app; no logic of its own.

Every component has the same shape: a ``hpcml.<component>.cli`` package whose ``app`` is a
``hpcml.cli_support.Group`` (the one place an error becomes ``hpcml <command>: error: ...``),
with one module per big sub-command.
"""

from __future__ import annotations

import typer

from hpcml import version as installed_version
from hpcml.centre.cli import app as centre_app
from hpcml.ckpt.cli import app as ckpt_app
from hpcml.cli_support import Group
from hpcml.data.cli import app as data_app
from hpcml.env.cli import app as env_app
from hpcml.farm.cli import app as farm_app
from hpcml.observe.cli import app as observe_app
from hpcml.run.cli import app as run_app
from hpcml.scan.cli import app as scan_app
from hpcml.score.cli import app as score_app
from hpcml.service.cli import app as service_app
from hpcml.vet.cli import app as vet_app

app = typer.Typer(cls=Group, help="hpcml: healthy, fast and debuggable ML training on HPC clusters.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode="rich")
app.add_typer(vet_app, name="vet")
app.add_typer(scan_app, name="scan")
app.add_typer(observe_app, name="observe")
app.add_typer(score_app, name="score")
app.add_typer(data_app, name="data")
app.add_typer(env_app, name="env")
app.add_typer(ckpt_app, name="ckpt")
app.add_typer(service_app, name="service")
app.add_typer(farm_app, name="farm")
app.add_typer(centre_app, name="centre")
app.registered_commands += run_app.registered_commands        # hpcml run, hpcml report: top level


def _print_version(value: bool) -> None:
    if value:
        print(f"hpcml {installed_version()}")
        raise typer.Exit()


@app.callback()
def _root(_version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                        help="Print hpcml's version and exit.")) -> None:
    """hpcml: healthy, fast and debuggable ML training on HPC clusters."""


@app.command()
def version() -> None:
    """Print hpcml's version (as hpcml --version)."""
    print(f"hpcml {installed_version()}")
