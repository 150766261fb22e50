"""``hpcml env render`` and ``hpcml env run``: resolve an EDF, then print or run the
launch. Command functions only; ``hpcml.env.cli`` registers them on the ``env`` group.
Their options are declared in ``hpcml.env.fastrun`` (``EnvRun``, and what render shares
with it), once for both of run's parsers."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import typer

from hpcml.env import fastrun
from hpcml.env.fastrun import COMMAND, EDF, LENIENT, RUNTIME, SITE, EnvRun
from hpcml.optspec import option, typer_command


@dataclass
class EnvRender:
    """The command line of ``hpcml env render`` (in --help's order)."""

    edf: str = EDF.field()
    command: list[str] = COMMAND.field()
    runtime: str = RUNTIME.field()
    site: str | None = SITE.field()
    as_json: bool = option("--json", default=False,
                           help="Print a JSON object (argv, environ, prepare, cleanup, notes).")
    lenient: bool = LENIENT.field()


def load_environment(command: str, edf: str, site: str | None = None, require_image: bool = True,
                     lenient: bool = False):
    """The EDF resolved and its hooks applied, warnings printed; bad input ends the command."""
    from hpcml.env.resolve import resolve
    env, warnings = resolve(edf, site=site, require_image=require_image, lenient=lenient or None)
    for warning in warnings:
        print(f"{command}: warning: {warning}", file=sys.stderr)
    return env


@typer_command(EnvRender)
def render(args: EnvRender) -> None:
    """Print the exact launch of COMMAND in the EDF's environment for one runtime, without running it.

        hpcml env render --runtime pyxis ./pytorch.toml -- python train.py
        hpcml env render -r bubblewrap ./rootfs.toml --json -- sh

    One shell line per step: prepare steps, exported variables, the launch, cleanup steps;
    notes (what the runtime cannot express) go to stderr. Exit codes: 0 printed, 2 bad
    EDF, unknown runtime or no command.
    """
    from hpcml.env.run import render as render_launch
    env = load_environment("hpcml env render", args.edf, args.site, lenient=args.lenient)
    launch = render_launch(env, args.command, args.runtime)
    if args.as_json:
        print(json.dumps(launch.to_json(), indent=2))
        return
    for note in launch.notes:
        print(f"# note: {note}", file=sys.stderr)
    print("\n".join(launch.lines()))


@typer_command(EnvRun)
def run(args: EnvRun) -> None:
    """Run COMMAND in the EDF's environment and exit with its exit code.

    (Without --help this command takes a fast path that skips this CLI framework: see
    hpcml.env.fastrun; both accept the same options.)

        hpcml env run ./pytorch.toml -- python train.py
        srun -n 4 hpcml env run ./pytorch.toml -- python train.py   # one container per task

    Under srun each task starts its own container with its Slurm variables. Exit codes:
    the command's (128+N if killed by signal N), 1 the runtime could not prepare the
    image, 2 bad EDF, unknown or uninstalled runtime, or no command.
    """
    raise typer.Exit(fastrun.execute(args))
