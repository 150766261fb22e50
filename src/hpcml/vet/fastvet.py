"""``hpcml vet [run] [PROTOCOL]`` without the CLI framework: argparse, then the command.

Every job script runs it before its training starts, on the critical path of the
allocation, so ``hpcml.cli.main`` routes it here before importing Typer (~0.2 s with the
pydantic adapters and Rich's help formatting it loads). ``--help``, ``--prolog`` and the
other subcommands still go through Typer. The options are declared once, in ``VetRun``, and
both parsers are built from it (``hpcml.optspec``: the Typer command ``hpcml.vet.cli.run``
too, which calls ``execute`` as well); ``--prolog`` and what it alone reads are declared
``typer_only``. Errors (``HpcmlError``) go up to the caller, which reports them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hpcml import optspec
from hpcml.fastparser import FastParser
from hpcml.optspec import argument, option

PROG = "hpcml vet"
#: the group's other commands, which only Typer runs
OTHERS = {"setup", "validate", "checks", "serve", "handle", "rules", "prolog-script", "fleet-report"}
DEFAULT_PROTOCOL = Path(__file__).parent / "protocols" / "cpu.yaml"


def _positive(text: str) -> int:
    import argparse
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, found {value}")
    return value


@dataclass                   # not frozen: a frozen dataclass costs 0.5 ms more to make, on every start
class VetRun:
    """The command line of ``hpcml vet run`` (in --help's order)."""

    protocol: Path | None = argument(default=None, help="Protocol YAML (hpcml or vetnode format); "
                                     "default: the built-in CPU protocol.")
    min_nodes: int | None = option("--min-nodes", min=1, convert=_positive,
                                   help="Good nodes needed to continue (default: protocol, else all).")
    deadline: str | None = option("--deadline", help="Whole-run deadline, e.g. '90 s' (default: protocol, "
                                  "else 300 s).")
    nodes: str | None = option("--nodes", help="Vet only these nodes of the allocation (hostlist).")
    out: Path | None = option("--out", help="Output directory (default: ./hpcml-vet-<jobid>).")
    exclude_file: Path | None = option("--exclude-file", help="Where to write the bad nodes (default: "
                                       "OUT/bad-nodes).")
    good_file: Path | None = option("--good-file", help="Where to write the good nodes (default: OUT/good-nodes).")
    workdir: Path | None = option("--workdir", help="Directory shared by all nodes, for collectives "
                                  "(default: OUT/work).")
    venv_root: Path | None = option("--venv-root", envvar="HPCML_VET_VENV_ROOT",
                                    help="Where `hpcml vet setup` put the checks' requirements.")
    local: bool = option("--local", default=False, help="Vet only this node, without srun.")
    as_json: bool = option("--json", default=False, help="Print the JSON report instead of the table.")
    prolog: bool = option("--prolog", default=False, typer_only=True,
                          help="Slurm Prolog/HealthCheckProgram mode: only this node's fast checks, "
                               "within --budget; exit 1 if bad.")
    budget: str | None = option("--budget", typer_only=True,
                                help="With --prolog: time for the whole run (default 5 s).")
    drain: bool = option("--drain", default=False, typer_only=True,
                         help="With --prolog: drain a bad node, reason naming the check.")
    overrun_ok: bool = option("--overrun-ok", default=False, typer_only=True,
                              help="With --prolog: a check cut at the budget does not fail the node.")
    report_to: str | None = option("--report-to", envvar="HPCML_VET_REPORT_TO",
                                   help="Also send the results to a collector (`hpcml centre serve`), "
                                        "opt-in; token from $HPCML_VET_TOKEN or --report-token-file.")
    report_token_file: Path | None = option("--report-token-file", help="File holding the collector token.")
    report_spool: Path | None = option("--report-spool", typer_only=True,
                                       help="With --prolog --report-to: reports the collector did not take wait "
                                            "here for the next run (default /var/spool/hpcml-reports).")


#: settings an error may name -> the option the user typed
FLAGS = optspec.flags(VetRun)
#: options only Typer takes: --help, and --prolog and what it alone reads (without --prolog
#: Typer ignores them)
TYPER_ONLY = {"--help", "-h", *optspec.typer_only(VetRun)}


def wants(argv: list[str]) -> bool:
    """Whether this command line is one the fast path takes: a plain vetting run."""
    if not argv or TYPER_ONLY & {a.split("=", 1)[0] for a in argv}:
        return False
    return argv[0] not in OTHERS


def parser() -> FastParser:
    """The options of ``hpcml.vet.cli.run`` but its ``typer_only`` ones, from ``VetRun``."""
    return optspec.fast_parser(PROG, VetRun)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        argv = argv[1:]
    return execute(VetRun(**optspec.parse(parser(), VetRun, argv)))


def execute(args: VetRun) -> int:
    """Vet, write the files, print the table (or the JSON), send to a collector if asked;
    the verdict's exit code (130 when interrupted)."""
    from hpcml import progress
    from hpcml.vet import report
    from hpcml.vet.session import vet_job
    with progress.on_terminal(progress.wanted(args.as_json)):      # nodes reporting, on a terminal
        run_, paths = vet_job(args.protocol or DEFAULT_PROTOCOL, min_nodes=args.min_nodes, deadline=args.deadline,
                              nodes=args.nodes, out=args.out, exclude_file=args.exclude_file, good_file=args.good_file,
                              workdir=args.workdir, venv_root=args.venv_root, local=args.local)
    if args.report_to:
        _send(report.to_json(run_), args.report_to, args.report_token_file)
    if args.as_json:
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
    from hpcml.words import LINE_MAX, shown
    console = Console(stderr=False, soft_wrap=not sys.stdout.isatty())
    if sys.stdout.isatty():
        console.print(report.table(run_))
    else:                                   # a batch log: lines, not a table wrapped at 80 columns
        for line in report.log_lines(run_):
            print(line)
    for line in report.problems(run_):
        console.print(f"  {line}", highlight=False, markup=False)
    for note in run_.notes:              # notes name checks and nodes: never markup
        if NOTHING_CHECKED in note:
            console.print(f"  [bold yellow]warning:[/] {shown(note, LINE_MAX)}", highlight=False)
        else:
            console.print(f"  note: {shown(note, LINE_MAX)}", highlight=False)
    v = run_.verdict
    colour = {"continue": "green", "shrink": "yellow", "abort": "bold red"}[v.decision.value]
    console.print(f"verdict: [{colour}]{v.decision.value}[/] ({len(v.good)} good, {len(v.bad)} bad, "
                  f"need {v.min_nodes}) in {run_.duration:.2f} s; exclude list: {shown(paths['exclude'], LINE_MAX)}")
