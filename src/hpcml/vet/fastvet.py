"""``hpcml vet [run] [PROTOCOL]`` without the CLI framework: argparse, then the command.

Every job script runs it before its training starts, on the critical path of the
allocation, so ``hpcml.cli.main`` routes it here before importing Typer (~0.2 s with the
pydantic adapters and Rich's help formatting it loads). ``--help``, ``--prolog`` and the
other subcommands still go through Typer. Same options as the Typer command, which calls
``execute`` too; errors (``HpcmlError``) go up to the caller, which reports them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpcml.fastparser import FastParser

PROG = "hpcml vet"
FLAGS = {"min_nodes": "--min-nodes", "deadline": "--deadline", "nodes": "--nodes", "out": "--out",
         "exclude_file": "--exclude-file", "good_file": "--good-file", "workdir": "--workdir",
         "venv_root": "--venv-root", "report_to": "--report-to", "report_token_file": "--report-token-file"}
#: the group's other commands, which only Typer runs
OTHERS = {"setup", "validate", "checks", "serve", "handle", "rules", "prolog-script", "fleet-report"}
#: options only Typer takes: --prolog and what it alone reads (without --prolog Typer ignores them)
TYPER_ONLY = {"--help", "-h", "--prolog", "--budget", "--drain", "--overrun-ok"}
DEFAULT_PROTOCOL = Path(__file__).parent / "protocols" / "cpu.yaml"


def wants(argv: list[str]) -> bool:
    """Whether this command line is one the fast path takes: a plain vetting run."""
    if not argv or TYPER_ONLY & {a.split("=", 1)[0] for a in argv}:
        return False
    return argv[0] not in OTHERS


def _positive(text: str) -> int:
    import argparse
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, found {value}")
    return value


def parser() -> FastParser:
    """The options of ``hpcml.vet.cli.run`` but its --prolog ones (tests/test_fastpaths.py
    compares them)."""
    p = FastParser(prog=PROG, add_help=False)
    p.add_argument("protocol", nargs="?", type=Path)
    p.add_argument("--min-nodes", type=_positive)
    p.add_argument("--deadline")
    p.add_argument("--nodes")
    for flag in ("--out", "--exclude-file", "--good-file", "--workdir", "--report-token-file"):
        p.add_argument(flag, type=Path)
    p.add_argument("--venv-root", type=Path, default=os.environ.get("HPCML_VET_VENV_ROOT") or None)
    p.add_argument("--local", action="store_true")
    p.add_argument("--json", dest="as_json", action="store_true")
    p.add_argument("--report-to", default=os.environ.get("HPCML_VET_REPORT_TO") or None)
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        argv = argv[1:]
    args = parser().parse_args(argv)
    return execute(**vars(args))


def execute(protocol: Path | None, *, min_nodes: int | None = None, deadline: str | None = None,
            nodes: str | None = None, out: Path | None = None, exclude_file: Path | None = None,
            good_file: Path | None = None, workdir: Path | None = None, venv_root: Path | None = None,
            local: bool = False, as_json: bool = False, report_to: str | None = None,
            report_token_file: Path | None = None) -> int:
    """Vet, write the files, print the table (or the JSON), send to a collector if asked;
    the verdict's exit code (130 when interrupted)."""
    from hpcml.vet import report
    from hpcml.vet.session import vet_job
    run_, paths = vet_job(protocol or DEFAULT_PROTOCOL, min_nodes=min_nodes, deadline=deadline, nodes=nodes,
                          out=out, exclude_file=exclude_file, good_file=good_file, workdir=workdir,
                          venv_root=venv_root, local=local)
    if report_to:
        _send(report.to_json(run_), report_to, report_token_file)
    if as_json:
        print(report.dumps(report.to_json(run_)))
    else:
        _print_human(run_, paths)
    from hpcml.vet.isolate import interrupted
    if interrupted():
        print(f"hpcml vet: interrupted: checks that were running were stopped; what was known is in "
              f"{paths['report']}", file=sys.stderr)
        return 130
    return run_.verdict.exit_code


def _send(data: dict, url: str, token_file: Path | None) -> None:
    """Opt-in reporting never changes the verdict: a failure is one warning line."""
    from hpcml.centre.client import send_with_token_file
    send_with_token_file(data, url, token_file)


def _print_human(run_, paths) -> None:
    from rich.console import Console

    from hpcml.vet import report
    from hpcml.vet.engine import NOTHING_CHECKED
    console = Console(stderr=False, soft_wrap=not sys.stdout.isatty())
    if sys.stdout.isatty():
        console.print(report.table(run_))
    else:                                   # a batch log: lines, not a table wrapped at 80 columns
        for line in report.log_lines(run_):
            print(line)
    for line in report.problems(run_):
        console.print(f"  {line}", highlight=False, markup=False)
    for note in run_.notes:
        if NOTHING_CHECKED in note:
            console.print(f"  [bold yellow]warning:[/] {note}", highlight=False)
        else:
            console.print(f"  note: {note}", highlight=False)
    v = run_.verdict
    colour = {"continue": "green", "shrink": "yellow", "abort": "bold red"}[v.decision.value]
    console.print(f"verdict: [{colour}]{v.decision.value}[/] ({len(v.good)} good, {len(v.bad)} bad, "
                  f"need {v.min_nodes}) in {run_.duration:.2f} s; exclude list: {paths['exclude']}")
