"""``hpcml vet``: parse arguments, call the engine, render. No vetting logic here.

The group and ``run``, ``setup``, ``validate``, ``checks`` live here; ``prolog`` (``--prolog``,
``prolog-script``) has a module of its own. ``serve``, ``handle``, ``rules`` and ``fleet-report``
are aliases of ``hpcml centre serve | handle | rules | report`` (``hpcml.centre.cli``): the same
callbacks, so the same options and behaviour, with help that says so.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer

from hpcml.centre.cli import handle, report, serve  # the centre's commands, aliased below
from hpcml.cli_support import DefaultCommandGroup
from hpcml.vet.cli import prolog  # one module per command

app = typer.Typer(name="vet", cls=DefaultCommandGroup, no_args_is_help=True, rich_markup_mode="rich",
                  help="Vet the nodes of this allocation before the application runs.\n\n"
                       "Example: [bold]hpcml vet examples/vet/cpu.yaml --min-nodes 1[/]\n\n"
                       "Exit codes: 0 continue, 3 shrink (see the exclude file), 4 abort, "
                       "2 bad input.")


@app.command("run")
def run(
    protocol: Optional[Path] = typer.Argument(None, help="Protocol YAML (hpcml or vetnode format); "
                                              "default: the built-in CPU protocol."),
    min_nodes: Optional[int] = typer.Option(None, "--min-nodes", min=1,
                                            help="Good nodes needed to continue (default: protocol, else all)."),
    deadline: Optional[str] = typer.Option(None, help="Whole-run deadline, e.g. '90 s' (default: protocol, else 300 s)."),
    nodes: Optional[str] = typer.Option(None, help="Vet only these nodes of the allocation (hostlist)."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default: ./hpcml-vet-<jobid>)."),
    exclude_file: Optional[Path] = typer.Option(None, help="Where to write the bad nodes (default: OUT/bad-nodes)."),
    good_file: Optional[Path] = typer.Option(None, help="Where to write the good nodes (default: OUT/good-nodes)."),
    workdir: Optional[Path] = typer.Option(None, help="Directory shared by all nodes, for collectives (default: OUT/work)."),
    venv_root: Optional[Path] = typer.Option(None, envvar="HPCML_VET_VENV_ROOT",
                                             help="Where `hpcml vet setup` put the checks' requirements."),
    local: bool = typer.Option(False, "--local", help="Vet only this node, without srun."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON report instead of the table."),
    prolog: bool = typer.Option(False, "--prolog", help="Slurm Prolog/HealthCheckProgram mode: only "
                                "this node's fast checks, within --budget; exit 1 if bad."),
    budget: Optional[str] = typer.Option(None, help="With --prolog: time for the whole run (default 5 s)."),
    drain: bool = typer.Option(False, "--drain", help="With --prolog: drain a bad node, reason naming the check."),
    overrun_ok: bool = typer.Option(False, "--overrun-ok", help="With --prolog: a check cut at the budget does not fail the node."),
    report_to: Optional[str] = typer.Option(None, "--report-to", envvar="HPCML_VET_REPORT_TO",
                                            help="Also send the results to a collector (`hpcml centre serve`), "
                                                 "opt-in; token from $HPCML_VET_TOKEN or --report-token-file."),
    report_token_file: Optional[Path] = typer.Option(None, "--report-token-file",
                                                     help="File holding the collector token."),
) -> None:
    """Run PROTOCOL on every node of the allocation and decide: continue, shrink or abort.

    In a job script:

        hpcml vet protocol.yaml --min-nodes 2; rc=$?
        [ $rc -eq 4 ] && exit 1
        srun --exclude=$(cat hpcml-vet-$SLURM_JOB_ID/bad-nodes) python train.py
    """
    if prolog:  # exits
        from hpcml.vet.cli.prolog import run_prolog_cli  # `prolog` is the flag here
        run_prolog_cli(protocol, budget=budget, drain=drain, overrun_ok=overrun_ok, as_json=as_json,
                       report_to=report_to, report_token_file=report_token_file)
    from hpcml.vet.fastvet import execute
    raise typer.Exit(execute(protocol, min_nodes=min_nodes, deadline=deadline, nodes=nodes, out=out,
                             exclude_file=exclude_file, good_file=good_file, workdir=workdir,
                             venv_root=venv_root, local=local, as_json=as_json, report_to=report_to,
                             report_token_file=report_token_file))


def _alias(name: str, centre: str, callback: Callable[..., None]) -> None:
    """``hpcml vet NAME``: ``hpcml centre CENTRE``'s own callback, its help first saying whose alias it is."""
    app.command(name, help=f"Alias of [bold]hpcml centre {centre}[/]. {inspect.getdoc(callback)}")(callback)


_alias("serve", "serve", serve.serve)
_alias("handle", "handle", handle.handle)
_alias("fleet-report", "report", report.report)
_alias("rules", "rules", handle.validate_rules)
app.command("prolog-script")(prolog.prolog_script)


@app.command("setup")
def setup_cmd(
    protocol: Path = typer.Argument(..., help="Protocol whose checks' requirements to install."),
    venv_root: Path = typer.Option(..., envvar="HPCML_VET_VENV_ROOT",
                                   help="Directory on shared storage for the cached venvs."),
) -> None:
    """Install the checks' requirements once, into a venv keyed by their hash.

    Example: [bold]hpcml vet setup gpu.yaml --venv-root /shared/$USER/hpcml-venvs[/]
    """
    from hpcml.vet import setup
    from hpcml.vet.protocol import load
    proto = load(protocol)
    if not proto.requirements():
        print("nothing to install: no check of this protocol has requirements")
        return
    path = setup.setup(proto, venv_root)
    print(f"ready: {path}")


@app.command("validate")
def validate(protocol: Path = typer.Argument(..., help="Protocol to check.")) -> None:
    """Check a protocol without running it (exit 0 valid, 2 invalid)."""
    from hpcml.vet.protocol import load
    proto = load(protocol)
    proto.unset_variables()
    kind = "vetnode protocol" if proto.vetnode else "protocol"
    print(f"{protocol}: valid {kind} '{proto.name}' with {len(proto.evals)} checks: "
          + ", ".join(f"{e.name} ({e.type})" for e in proto.evals))


@app.command("checks")
def checks() -> None:
    """List the built-in check types and their parameters."""
    from hpcml.vet import registry
    for name, path in registry.BUILTIN.items():
        try:
            cls = registry.load(path)
        except registry.UnknownCheck as exc:
            print(f"{name:12} (unavailable: {exc})")
            continue
        fields = ", ".join(f"{k}" for k in cls.Params.model_fields)
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        print(f"{name:12} {cls.scope:10} timeout {cls.default_timeout:g} s  {doc}\n{'':12} params: {fields}")
