"""``hpcml env run`` without the CLI framework: argparse, resolve, exec the runtime.

``hpcml.cli.main`` routes here before importing Typer and Rich, which would add about
0.2 s to every container start; ``hpcml env run --help`` still goes through Typer. The
options are declared once, in ``EnvRun``, and both parsers are built from it
(``hpcml.optspec``: the Typer command ``hpcml.env.cli.run.run`` too; ``hpcml env render``
shares its arguments and options). Errors (``HpcmlError``) go up to the caller, which
reports them: ``hpcml.cli.main`` here, the command group under Typer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from hpcml import optspec
from hpcml.fastparser import FastParser
from hpcml.optspec import Opt, option

PROG = "hpcml env run"

#: what ``hpcml env run`` and ``hpcml env render`` both take
EDF = Opt((), "EDF: a NAME on EDF_PATH (or ~/.edf), ./path.toml or /abs/path.toml.")
COMMAND = Opt((), "The command to run in the container (after --).", rest=True)
RUNTIME = Opt(("--runtime", "-r"), "bubblewrap, charliecloud, enroot, podman, pyxis, or auto "
              "(an installed one that runs the image).", default="auto")
SITE = Opt(("--site",), "Site hooks file (default: $HPCML_ENV_SITE, else the packaged example).", default=None)
LENIENT = Opt(("--lenient",), "An unknown EDF key only warns (default: an error naming the nearest key; "
              "HPCML_EDF_LENIENT=1).", default=False)


@dataclass                   # not frozen: a frozen dataclass costs 0.5 ms more to make, on every start
class EnvRun:
    """The command line of ``hpcml env run`` (in --help's order)."""

    edf: str = EDF.field()
    command: list[str] = COMMAND.field()
    runtime: str = RUNTIME.field()
    site: str | None = SITE.field()
    verbose: bool = option("--verbose", "-v", default=False, help="Print the launch and its notes to stderr first.")
    lenient: bool = LENIENT.field()


#: settings an error may name -> the option the user typed
FLAGS = optspec.flags(EnvRun)


def wants(argv: list[str]) -> bool:
    """Every ``hpcml env run`` takes this path but --help (before ``--``), which Typer shows."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    return not {"--help", "-h"} & set(head)


def parser() -> FastParser:
    """The options of ``hpcml.env.cli.run.run``, from ``EnvRun``."""
    return optspec.fast_parser(PROG, EnvRun)


def main(argv: list[str]) -> int:
    try:
        values = optspec.parse(parser(), EnvRun, argv)
    except SystemExit:
        return 2
    return execute(EnvRun(**values))


def execute(args: EnvRun) -> int:
    """Resolve the EDF (its warnings on stderr), show the launch with ``--verbose``, run the
    command in it; the command's exit code."""
    from hpcml.env.resolve import resolve
    from hpcml.env.run import run
    env, warnings = resolve(args.edf, site=args.site, lenient=args.lenient or None)
    for warning in warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if args.verbose:
        from hpcml.env.run import render
        launch = render(env, args.command, args.runtime)
        for note in launch.notes:
            print(f"{PROG}: note: {note}", file=sys.stderr)
        print("\n".join("+ " + line for line in launch.lines()), file=sys.stderr)
    return run(env, args.command, runtime=args.runtime)
