"""``hpcml env run`` without the CLI framework: argparse, resolve, exec the runtime.

``hpcml.cli.main`` routes here before importing Typer and Rich, which would add about
0.2 s to every container start; ``hpcml env run --help`` still goes through Typer. Errors
(``HpcmlError``) go up to the caller, which reports them: ``hpcml.cli.main`` here, the
command group under Typer.
"""

from __future__ import annotations

import argparse
import sys

from hpcml.fastparser import FastParser

PROG = "hpcml env run"
FLAGS = {"runtime": "--runtime", "site": "--site", "verbose": "--verbose", "lenient": "--lenient"}   # setting -> option


def wants(argv: list[str]) -> bool:
    """Every ``hpcml env run`` takes this path but --help (before ``--``), which Typer shows."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    return not {"--help", "-h"} & set(head)


def parser() -> FastParser:
    """The options of ``hpcml.env.cli.run`` (tests/test_fastpaths.py compares them)."""
    p = FastParser(prog=PROG, add_help=False)
    p.add_argument("--runtime", "-r", default="auto")
    p.add_argument("--verbose", "-v", action="store_true")
    p.add_argument("--site")
    p.add_argument("--lenient", action="store_true")
    p.add_argument("edf")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit:
        return 2
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    from hpcml.env.resolve import resolve
    from hpcml.env.run import run
    env, warnings = resolve(args.edf, site=args.site, lenient=args.lenient or None)
    for warning in warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if args.verbose:
        from hpcml.env.run import render
        launch = render(env, command, args.runtime)
        for note in launch.notes:
            print(f"{PROG}: note: {note}", file=sys.stderr)
        print("\n".join("+ " + line for line in launch.lines()), file=sys.stderr)
    return run(env, command, runtime=args.runtime)
