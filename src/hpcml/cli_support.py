"""What every sub-command shares: a group that has a default command, and error exits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import typer
import typer.core

from hpcml.errors import HpcmlError


class DefaultCommandGroup(typer.core.TyperGroup):
    """``hpcml vet protocol.yaml`` means ``hpcml vet run protocol.yaml``.

    Written here because it is ten lines; click-default-group does the same for click but
    not for Typer's group class (Typer >= 0.29 carries its own click).
    """

    default_command = "run"

    def resolve_command(self, ctx: typer.Context, args: list[str]):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args.insert(0, self.default_command)
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args.insert(0, self.default_command)
        return super().parse_args(ctx, args)


def fail(command: str, exc: HpcmlError) -> None:
    """End a sub-command with its one-line error and the error's exit code."""
    print(f"{command}: error: {exc}", file=sys.stderr)
    raise typer.Exit(exc.exit_code)


def write_report(write: Callable[[Any, Path], Any], report: Any, out: Path) -> Path:
    """Write a report file; a path that cannot be written is bad input (exit 2)."""
    from hpcml.errors import UsageError
    try:
        write(report, out)
    except OSError as exc:
        raise UsageError(f"cannot write the HTML report: {exc.strerror}", file=str(out)) from None
    return out


def parse_size(value: str | None, option: str, minimum: int = 1) -> int | None:
    """A size option (``256 MB``, ``1 GiB``, bytes) as bytes; a bad one is exit 2 naming it."""
    from hpcml.errors import UsageError
    from hpcml.units import parse_bytes
    if value is None:
        return None
    try:
        n = int(parse_bytes(value))
    except ValueError as exc:
        raise UsageError(str(exc), key=option) from None
    if n < minimum:
        what = "positive" if minimum == 1 else f"at least {minimum}"
        raise UsageError(f"expected a {what} size, found {value!r}", key=option)
    return n


def progress_bar(enabled: bool):
    """A Rich progress bar on stderr (bytes, rate, time left), or None when not wanted."""
    if not enabled or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=Console(stderr=True), transient=True)


def show(result: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """``--json`` prints the result's ``to_json()``; otherwise the command's own rendering."""
    if as_json:
        import json
        print(json.dumps(result.to_json(), indent=2))
    else:
        render(result)
