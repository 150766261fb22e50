"""``hpcml env render`` and ``hpcml env run``: resolve an EDF, then print or run the
launch. Command functions only; ``hpcml.env.cli`` registers them on the ``env`` group."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

RUNTIME_HELP = "bubblewrap, charliecloud, enroot, podman, pyxis, or auto (an installed one that runs the image)."


SITE_HELP = "Site hooks file (default: $HPCML_ENV_SITE, else the packaged example)."


LENIENT_HELP = "An unknown EDF key only warns (default: an error naming the nearest key; HPCML_EDF_LENIENT=1)."


def load_environment(command: str, edf: str, site: str | None = None, require_image: bool = True,
                     lenient: bool = False):
    """The EDF resolved and its hooks applied, warnings printed; bad input ends the command."""
    from hpcml.env.resolve import resolve
    env, warnings = resolve(edf, site=site, require_image=require_image, lenient=lenient or None)
    for warning in warnings:
        print(f"{command}: warning: {warning}", file=sys.stderr)
    return env


def render(
    edf: str = typer.Argument(..., help="EDF: a NAME on EDF_PATH (or ~/.edf), ./path.toml or /abs/path.toml."),
    command: list[str] = typer.Argument(None, help="The command to run in the container (after --)."),
    runtime: str = typer.Option("auto", "--runtime", "-r", help=RUNTIME_HELP),
    site: Optional[str] = typer.Option(None, "--site", help=SITE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object (argv, environ, prepare, cleanup, notes)."),
    lenient: bool = typer.Option(False, "--lenient", help=LENIENT_HELP),
) -> None:
    """Print the exact launch of COMMAND in the EDF's environment for one runtime, without running it.

        hpcml env render --runtime pyxis ./pytorch.toml -- python train.py
        hpcml env render -r bubblewrap ./rootfs.toml --json -- sh

    One shell line per step: prepare steps, exported variables, the launch, cleanup steps;
    notes (what the runtime cannot express) go to stderr. Exit codes: 0 printed, 2 bad
    EDF, unknown runtime or no command.
    """
    from hpcml.env.run import render as render_launch
    env = load_environment("hpcml env render", edf, site, lenient=lenient)
    launch = render_launch(env, list(command or []), runtime)
    if as_json:
        print(json.dumps(launch.to_json(), indent=2))
        return
    for note in launch.notes:
        print(f"# note: {note}", file=sys.stderr)
    print("\n".join(launch.lines()))


def run(
    edf: str = typer.Argument(..., help="EDF: a NAME on EDF_PATH (or ~/.edf), ./path.toml or /abs/path.toml."),
    command: list[str] = typer.Argument(None, help="The command to run in the container (after --)."),
    runtime: str = typer.Option("auto", "--runtime", "-r", help=RUNTIME_HELP),
    site: Optional[str] = typer.Option(None, "--site", help=SITE_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print the launch and its notes to stderr first."),
    lenient: bool = typer.Option(False, "--lenient", help=LENIENT_HELP),
) -> None:
    """Run COMMAND in the EDF's environment and exit with its exit code.

    (Without --help this command takes a fast path that skips this CLI framework: see
    hpcml.env.fastrun; both accept the same options.)

        hpcml env run ./pytorch.toml -- python train.py
        srun -n 4 hpcml env run ./pytorch.toml -- python train.py   # one container per task

    Under srun each task starts its own container with its Slurm variables. Exit codes:
    the command's (128+N if killed by signal N), 1 the runtime could not prepare the
    image, 2 bad EDF, unknown or uninstalled runtime, or no command.
    """
    from hpcml.env.fastrun import main as run_main
    argv = ["--runtime", runtime, *(["--site", site] if site else []), *(["--verbose"] if verbose else []),
            *(["--lenient"] if lenient else []), edf, "--", *(command or [])]
    raise typer.Exit(run_main(argv))
