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

import typer

from hpcml.centre.cli import handle, report, serve  # the centre's commands, aliased below
from hpcml.cli_support import DefaultCommandGroup
from hpcml.optspec import typer_command
from hpcml.vet import fastvet
from hpcml.vet.cli import prolog  # one module per command
from hpcml.vet.fastvet import VetRun

app = typer.Typer(name="vet", cls=DefaultCommandGroup, no_args_is_help=True, rich_markup_mode="rich",
                  help="Vet the nodes of this allocation before the application runs.\n\n"
                       "Example: [bold]hpcml vet examples/vet/cpu.yaml --min-nodes 1[/]\n\n"
                       "Exit codes: 0 continue, 3 shrink (see the exclude file), 4 abort, "
                       "2 bad input.")


@app.command("run")
@typer_command(VetRun)
def run(args: VetRun) -> None:
    """Run PROTOCOL on every node of the allocation and decide: continue, shrink or abort.

    In a job script:

        hpcml vet protocol.yaml --min-nodes 2; rc=$?
        [ $rc -eq 4 ] && exit 1
        srun --exclude=$(cat hpcml-vet-$SLURM_JOB_ID/bad-nodes) python train.py
    """
    if args.prolog:  # exits
        from hpcml.vet.cli.prolog import run_prolog_cli  # `prolog` is the flag here
        run_prolog_cli(args.protocol, budget=args.budget, drain=args.drain, overrun_ok=args.overrun_ok,
                       as_json=args.as_json, report_to=args.report_to, report_token_file=args.report_token_file,
                       report_spool=args.report_spool)
    raise typer.Exit(fastvet.execute(args))


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
