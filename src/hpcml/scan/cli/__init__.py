"""``hpcml scan``: parse arguments, call the scanner, render. No scanning logic here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import DefaultCommandGroup
from hpcml.optspec import typer_command
from hpcml.scan import fastscan


class _ScanGroup(DefaultCommandGroup):
    default_command = "files"


app = typer.Typer(name="scan", cls=_ScanGroup, no_args_is_help=True, rich_markup_mode="rich",
                  help="Scan model files and requirements without executing them.\n\n"
                       "Example: [bold]hpcml scan checkpoints/ --sarif scan.sarif[/]\n\n"
                       "Exit codes: 0 safe, 5 unknown globals (blocked), 6 dangerous, "
                       "7 unreadable or malformed, 8 not scanned (a format hpcml does not read), "
                       "2 bad input.")


@app.command("files")
@typer_command(fastscan.Files)    # its parameters: the fields of fastscan.Files, declared there once
def files(args: fastscan.Files) -> None:
    """Scan PATHS: every pickle, PyTorch, numpy, joblib and safetensors file, by content
    (Keras, ONNX, GGUF and TF SavedModel files are judged for code on load, never called safe).

        hpcml scan model.pt                 # one file
        hpcml scan ckpts/ --json > r.json   # a directory, for a script
        hpcml scan . --policy site.yaml --sarif scan.sarif
    """
    raise typer.Exit(fastscan.execute(args))


@app.command("requirements")
def requirements(
    file: Path = typer.Argument(..., help="requirements.txt, uv.lock, poetry.lock, pylock.toml or Pipfile.lock."),
    internal: list[str] = typer.Option([], "--internal", help="A private package name that must not come from PyPI (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    sarif: Optional[Path] = typer.Option(None, help="Also write a SARIF 2.1.0 log here."),
) -> None:
    """Check a requirements or lock file for dependency-confusion risks, offline.

        hpcml scan requirements requirements.txt --internal mylab-utils
    """
    from hpcml.scan import reqreport
    from hpcml.scan.requirements import check_requirements
    rep = check_requirements(file, internal_names=internal)
    code = reqreport.exit_code(rep)
    if sarif:
        from hpcml.scan.report import write_json
        write_json(reqreport.to_sarif(rep), sarif)
    if as_json:
        print(json.dumps(reqreport.to_json(rep, code), indent=2))
    else:
        from rich.console import Console
        Console().print(reqreport.table(rep))
    raise typer.Exit(code)
