"""``hpcml scan [files] PATHS`` without the CLI framework: argparse, then the command.

``hpcml.cli.main`` routes a scan here before importing Typer, which (with the pydantic it
imports for its parameter adapters) costs about 0.2 s of every run; ``--help`` and ``scan
requirements`` still go through Typer. Same options as the Typer command; errors
(``HpcmlError``) go up to the caller, which reports them.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcml.fastparser import FastParser

PROG = "hpcml scan"
FLAGS = {"policy": "--policy", "sarif": "--sarif", "jobs": "--jobs"}


def wants(argv: list[str]) -> bool:
    """Whether this command line is one the fast path takes (not --help, not requirements)."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    if {"--help", "-h"} & set(head) or not argv:
        return False
    return argv[0] != "requirements"


def parser() -> FastParser:
    """The options of ``hpcml.scan.cli.files`` (tests/test_fastpaths.py compares them)."""
    p = FastParser(prog=PROG, add_help=False)
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--policy", action="append", type=Path, default=None)
    p.add_argument("--json", dest="as_json", action="store_true")
    p.add_argument("--sarif", type=Path)
    p.add_argument("--jobs", "-j", type=int)
    p.add_argument("--all", dest="show_all", action="store_true")
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["files"]:
        argv = argv[1:]
    fast = parser()
    args = fast.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        fast.error(f"--jobs must be at least 1, got {args.jobs}")
    # no --policy: $HPCML_SCAN_POLICY, a list split at os.pathsep, as Typer splits a path list
    env = os.environ.get("HPCML_SCAN_POLICY", "")
    policy = args.policy if args.policy is not None else [Path(p) for p in env.split(os.pathsep)] if env else []
    from hpcml.scan.command import scan_files
    return scan_files(args.paths, policy=policy, as_json=args.as_json, sarif=args.sarif, jobs=args.jobs,
                      show_all=args.show_all)
