"""``hpcml scan [files] PATHS`` without the CLI framework: argparse, then the command.

``hpcml.cli.main`` routes a scan here before importing Typer, which (with the pydantic it
imports for its parameter adapters) costs about 0.2 s of every run; ``--help`` and ``scan
requirements`` still go through Typer. The options are declared once, in ``Files``, and
both parsers are built from it (``hpcml.optspec``: the Typer command ``hpcml.scan.cli.files``
too). Errors (``HpcmlError``) go up to the caller, which reports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcml import optspec
from hpcml.fastparser import FastParser
from hpcml.optspec import argument, option

PROG = "hpcml scan"


@dataclass                   # not frozen: a frozen dataclass costs 0.5 ms more to make, on every start
class Files:
    """The command line of ``hpcml scan files`` (in --help's order)."""

    paths: list[Path] = argument(help="Files or directories (recursive).")
    policy: list[Path] = option("--policy", default=[], envvar="HPCML_SCAN_POLICY",
                                help="Site policy YAML extending the built-in allowlist (repeatable).")
    as_json: bool = option("--json", default=False, help="Print the JSON report instead of the table.")
    sarif: Path | None = option("--sarif", help="Also write a SARIF 2.1.0 log here (for CI).")
    jobs: int | None = option("--jobs", "-j", min=1, help="Parallel processes (default: CPUs).")
    show_all: bool = option("--all", default=False, help="List safe files too when there are many.")


#: settings an error may name -> the option the user typed
FLAGS = optspec.flags(Files)


def wants(argv: list[str]) -> bool:
    """Whether this command line is one the fast path takes (not --help, not requirements)."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    if {"--help", "-h"} & set(head) or not argv:
        return False
    return argv[0] != "requirements"


def parser() -> FastParser:
    """The options of ``hpcml.scan.cli.files``, from ``Files``."""
    return optspec.fast_parser(PROG, Files)


def main(argv: list[str]) -> int:
    if argv[:1] == ["files"]:
        argv = argv[1:]
    return execute(Files(**optspec.parse(parser(), Files, argv)))


def execute(args: Files) -> int:
    """Scan; the verdict's exit code."""
    from hpcml.scan.command import scan_files
    return scan_files(args.paths, policy=args.policy, as_json=args.as_json, sarif=args.sarif, jobs=args.jobs,
                      show_all=args.show_all)
