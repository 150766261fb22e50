"""What every sub-command shares: the group class that turns errors into their one line,
a group that has a default command, report files, sizes, progress bars."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, overload

import typer
import typer.core
import typer.rich_utils

from hpcml.errors import HpcmlError

if TYPE_CHECKING:
    from typer._click import Context  # the click Typer carries (>= 0.29): what groups are given

_IMPLIED = "hpcml.implied_default"       # ctx.meta: the groups whose default command was implied


def _flag_type(self: Any, ctx: Any) -> str | None:
    """--help shows on/off switches as flags: Typer prints ``<bool>`` beside each (and
    beside --help itself), which reads as if the switch took a value."""
    return "" if getattr(self, "is_flag", False) else _typer_display_type(self, ctx)


_typer_display_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


def _reflow(paragraphs: list[str], markup_mode: Any) -> str:
    """--help prose is reflowed to the terminal: Typer >= 0.29 keeps a docstring's own line
    breaks and then wraps again at 80 columns, leaving ragged half-lines. Paragraphs with
    indented lines (examples) keep their lines."""
    out = []
    for p in paragraphs:
        lines = p.split("\n")
        keep = p.startswith("\b") or any(line.startswith((" ", "\t")) for line in lines)
        out.append(p if keep else " ".join(line.strip() for line in lines))
    return "\n\n".join(out)


typer.rich_utils._fix_linebreaks = _reflow


def _one_line_error(self: Any) -> None:
    """A usage error (a bad or missing flag value, an unknown option) as every hpcml error
    is worded: ``hpcml centre serve: error: ...`` on one line, instead of Typer's usage lines
    and box (Typer exits 2 after it)."""
    if self.__class__.__name__ == "NoArgsIsHelpError":        # Typer's own rule: help is shown
        return
    ctx = getattr(self, "ctx", None)
    where = ctx.command_path if ctx is not None else "hpcml"
    print(f"{where}: error: {' '.join(self.format_message().split())}", file=sys.stderr)


typer.rich_utils.rich_format_error = _one_line_error


class Group(typer.core.TyperGroup):
    """The class of every hpcml command group, and the one place a command's error ends it.

    Library code raises an ``HpcmlError`` subclass; the command lets it through, and the
    innermost group prints ``hpcml <component> <command>: error: <message>`` on stderr and
    exits with the error's ``exit_code`` (2 for a ``UsageError``). A bad setting the error
    names (``UsageError.key``, e.g. ``prometheus_port``) is shown as the command's option
    (``--prometheus-port``). A component's app run on its own words its errors the same way.
    """

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except HpcmlError as exc:
            from hpcml.cli_report import report
            name = ctx.invoked_subcommand
            command = self.commands.get(name) if name else None
            words = command_words(ctx)
            if name and id(ctx) not in ctx.meta.get(_IMPLIED, ()):
                words.append(name)
            raise typer.Exit(report(" ".join(words), exc, flags_of(command))) from None


def command_words(ctx: Context) -> list[str]:
    """``["hpcml", "data"]`` for the ``data`` group's context, however the program was started
    (``python -m hpcml``, the ``hpcml`` script, a test's runner, the ``data`` app alone)."""
    words: list[str] = []
    while ctx.parent is not None:
        words.append(ctx.info_name or "")
        ctx = ctx.parent
    root = ctx.command.name
    if root and root != "hpcml":         # a component's app invoked on its own
        words.append(root)
    return ["hpcml", *reversed([w for w in words if w])]


def flags_of(command: Any) -> dict[str, str]:
    """A command's settings -> its options: ``{"shard_size": "--shard-size", "shard-size": ...}``,
    and its arguments -> their names in --help (``{"blueprint": "BLUEPRINT"}``)."""
    flags: dict[str, str] = {}
    for param in getattr(command, "params", ()):
        if getattr(param, "param_type_name", "") == "argument" and param.name:
            flags.setdefault(param.name, param.name.upper())
            continue
        if getattr(param, "param_type_name", "") != "option" or not param.opts:
            continue
        flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        for key in (param.name, *(o.lstrip("-") for o in param.opts if o.startswith("--"))):
            if key:
                flags.setdefault(key, flag)
    return flags


class DefaultCommandGroup(Group):
    """``hpcml vet protocol.yaml`` means ``hpcml vet run protocol.yaml``.

    Written here because it is ten lines; click-default-group does the same for click but
    not for Typer's group class (Typer >= 0.29 carries its own click). An error of the
    implied command is worded as the user typed it (``hpcml vet: error: ...``).
    """

    default_command = "run"

    def resolve_command(self, ctx: Context, args: list[str]):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args.insert(0, self.default_command)
            ctx.meta.setdefault(_IMPLIED, set()).add(id(ctx))
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args.insert(0, self.default_command)
            ctx.meta.setdefault(_IMPLIED, set()).add(id(ctx))
        return super().parse_args(ctx, args)


def write_report(write: Callable[[Any, Path], Any], report: Any, out: Path) -> Path:
    """Write a report file; a path that cannot be written is bad input (exit 2)."""
    from hpcml.errors import UsageError
    try:
        write(report, out)
    except OSError as exc:
        raise UsageError(f"cannot write the HTML report: {exc.strerror}", file=str(out)) from None
    return out


@overload
def parse_size(value: str, option: str, minimum: int = 1) -> int: ...
@overload
def parse_size(value: str | None, option: str, minimum: int = 1) -> int | None: ...
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
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=Console(stderr=True), transient=True)


def show(result: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """``--json`` prints the result's ``to_json()``; otherwise the command's own rendering."""
    if as_json:
        import json
        print(json.dumps(result.to_json(), indent=2))
    else:
        render(result)
