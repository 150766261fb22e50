"""``hpcml env show`` and ``hpcml env validate``: resolve an EDF and print it, or only check it.

Command functions only; ``hpcml.env.cli`` registers them on the ``env`` group.
"""

from __future__ import annotations

import json
import sys

import typer


def _rows(resolved) -> list[tuple[str, str, str]]:
    """(key, value, origin) for every value, defaults included so nothing is hidden."""
    e = resolved.env
    origin = e.origin

    def row(key: str, value: str) -> tuple[str, str, str]:
        return key, value, origin.get(key, "(default)")

    rows = [row("image", e.image or "(none)"), row("workdir", e.workdir or "(image's)"),
            row("entrypoint", str(e.entrypoint).lower()), row("writable", str(e.writable).lower())]
    rows += [row(f"mounts[{i}]", m.spec()) for i, m in enumerate(e.mounts)]
    rows += [row(f"devices[{i}]", d) for i, d in enumerate(e.devices)]
    rows += [row(f"env.{k}", "(unset)" if v is None else
                 f"{e.env_template[k]} (in the container; here: {v})" if k in e.env_template else v)
             for k, v in e.env.items()]
    rows += [row(f"annotations.{k}", v) for k, v in e.annotations.items()]
    return rows


ENGINE_HELP = ("Whose defaults and limits: ce (CSCS's Container Engine) or sarus-suite "
               "(entrypoint on by default, SRC:DST and registry images required); default $HPCML_EDF_ENGINE, else ce.")


def load_reporting(command: str, edf: str, require_image: bool, lenient: bool = False,
                   engine: str | None = None):
    """The EDF as written (no site hooks), warnings printed; bad input ends the command."""
    from hpcml.env.edf import load
    resolved = load(edf, require_image=require_image, lenient=lenient or None, engine=engine)
    for warning in resolved.warnings:
        print(f"{command}: warning: {warning}", file=sys.stderr)
    return resolved


def show(
    edf: str = typer.Argument(..., help="EDF: a NAME on EDF_PATH (or ~/.edf), ./path.toml or /abs/path.toml."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object instead of the table."),
    engine: str | None = typer.Option(None, "--engine", help=ENGINE_HELP),
) -> None:
    """Resolve an EDF (base environments, variables, ./ paths) and show each value with the file it came from.

        hpcml env show pytorch              # ~/.edf/pytorch.toml or on EDF_PATH
        hpcml env show ./my.toml --json     # for a script

    An EDF without an image (a base meant for inheriting) is shown; "hpcml env validate" requires one.

    Exit codes: 0 shown, 2 bad EDF (one line naming file, key and line).
    """
    resolved = load_reporting("hpcml env show", edf, require_image=False, engine=engine)
    if as_json:
        print(json.dumps(resolved.to_json(), indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
    table = Table(title=str(resolved.env.file),
                  caption="chain: " + " -> ".join(str(p) for p in resolved.env.chain))
    for name in ("key", "value", "from"):
        table.add_column(name, overflow="fold")
    for key, value, origin in _rows(resolved):
        table.add_row(Text(key), Text(value), Text(origin))
    Console().print(table)


def validate(
    edf: str = typer.Argument(..., help="EDF: a NAME on EDF_PATH (or ~/.edf), ./path.toml or /abs/path.toml."),
    lenient: bool = typer.Option(False, "--lenient", help="An unknown key only warns (default: an error)."),
    engine: str | None = typer.Option(None, "--engine", help=ENGINE_HELP),
) -> None:
    """Check an EDF and its base environments without running anything: prints "ok" or the error.

        hpcml env validate ./my.toml        # in CI, no GPU or container needed

    The resolved environment must name an image. Exit codes: 0 ok, 2 bad EDF (one line
    naming file, key and line). Warnings go to stderr.
    """
    load_reporting("hpcml env validate", edf, require_image=True, lenient=lenient, engine=engine)
    print("ok")
