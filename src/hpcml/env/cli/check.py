"""``hpcml env check`` and ``hpcml env venv``: command functions only; ``hpcml.env.cli``
registers them on the ``env`` group."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from hpcml.errors import UsageError

_SITE_HELP = "Site hooks file (YAML). Default: $HPCML_ENV_SITE, else the packaged example site."


def _runtime_name(runtime: str | None) -> str | None:
    from hpcml.env.runtimes import RUNTIMES
    known = [*RUNTIMES, "apptainer"]
    if runtime is not None and runtime not in known:
        raise UsageError(f"expected one of {', '.join(known)}, found {runtime!r}", key="--runtime")
    return runtime


def check(
    edf: str = typer.Argument(..., help="EDF: a NAME on EDF_PATH (or ~/.edf), ./path.toml or /abs/path.toml."),
    site: Optional[Path] = typer.Option(None, "--site", help=_SITE_HELP),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="The runtime the job will use (podman, pyxis, ...)."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Check an EDF for the common mistakes, before a job runs it.

    Missing image or mount sources, a GPU that nothing injects, an NCCL plugin built for
    another CUDA, a workdir outside the image and mounts, ~/.local leaking into the
    container, unknown or unconfigured hooks.

        hpcml env check ./pytorch.toml
        hpcml env check pytorch --site /etc/hpcml/site.yaml --runtime podman --json

    Exit codes: 0 no findings (or only info), 5 warnings only, 6 errors found,
    2 bad input (EDF, site file or option).
    """
    from hpcml.env.check import Finding, exit_code
    from hpcml.env.check import check as run_check
    from hpcml.env.edf import load
    from hpcml.env.site import load_site
    rt = _runtime_name(runtime)
    resolved = load(edf)
    site_ = load_site(site)
    findings = [Finding("warn", "edf", w) for w in resolved.warnings]
    findings += run_check(resolved.env, site_, runtime=rt)
    code = exit_code(findings)
    if as_json:
        print(json.dumps({"edf": str(resolved.env.file or edf), "site": site_.source, "exit_code": code,
                          "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
        console = Console()
        if not findings:
            console.print(escape(f"{edf}: no problems found (site: {site_.name})"))
        else:
            table = Table(title=escape(f"{edf} (site: {site_.name})"))
            for col in ("level", "key", "finding"):
                table.add_column(col, overflow="fold")
            style = {"error": "bold red", "warn": "yellow", "info": "dim"}
            for f in findings:
                table.add_row(f"[{style[f.level]}]{f.level}[/]", escape(f.key), escape(f.message))
            console.print(table)
    raise typer.Exit(code)


def venv(
    edf: str = typer.Argument(..., help="EDF whose image provides the Python."),
    path: Path = typer.Argument(..., help="Where to create the venv (shared storage); same path in the container."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="Runtime to use (default: the lightest installed)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object instead of the EDF lines."),
) -> None:
    """Create a venv inside the image's Python and print the EDF lines that activate it.

    The venv is made with --system-site-packages, so the image's packages stay visible.

        hpcml env venv ./pytorch.toml $SCRATCH/venvs/myproj
        # then, in the container: pip install <extra packages>

    Exit codes: 0 created, 1 the venv command failed in the container, 2 bad input.
    """
    from hpcml.env.cli.show import load_reporting
    from hpcml.env.venv import create_venv
    resolved = load_reporting("hpcml env venv", edf, require_image=True)
    result = create_venv(resolved.env, path, runtime=_runtime_name(runtime))
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    print(f"# venv created at {result.path} ({result.runtime}); add to {edf}:", file=sys.stderr)
    print("\n".join(result.edf_lines()))
