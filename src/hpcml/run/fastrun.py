"""``hpcml run [OPTIONS] -- CMD`` without the CLI framework: argparse, then the launcher.

Every job script runs it once, on the critical path of the allocation, so ``hpcml.cli.main``
routes it here before importing Typer (Typer, its pydantic parameter adapters and Rich's
help formatting cost ~0.1 s of the launcher's start). ``--help`` before ``--`` still goes to
Typer, whose command calls ``execute`` too. Both parsers are built from the one declaration
of the options, ``hpcml.run.config.Options`` (``hpcml.optspec``). Errors (``HpcmlError``) go
up to the caller, which reports them.
"""

from __future__ import annotations

from hpcml import optspec
from hpcml.fastparser import FastParser
from hpcml.run.config import Options

PROG = "hpcml run"
#: settings an error may name -> the option the user typed
FLAGS = optspec.flags(Options)


def wants(argv: list[str]) -> bool:
    """Every ``hpcml run`` but one asking for help before ``--`` (Typer shows it)."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    return not {"--help", "-h"} & set(head)


def parser() -> FastParser:
    """The options of ``hpcml.run.cli.run_cmd``, from ``Options``."""
    return optspec.fast_parser(PROG, Options)


def main(argv: list[str]) -> int:
    try:
        values = optspec.parse(parser(), Options, argv)
    except SystemExit:
        return 2
    return execute(Options(**values))


def execute(opts: Options) -> int:
    """Run the job; its exit code. ``--vet``'s workers start first (``hpcml.run.earlyvet``)."""
    from hpcml.run import earlyvet
    early = earlyvet.start(opts)
    try:
        from hpcml.run.launcher import run
    except BaseException:                            # Ctrl-C while it imports: the workers go too
        if early is not None:
            early.step.cancel()
        raise
    return run(opts, early)
