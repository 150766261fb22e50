"""The ``hpcml`` command's entry point, and the one place an error becomes its message.

Light on purpose: ``hpcml env run`` sits in front of every container start (once per
task under srun), so it takes a path that imports no CLI framework; every other command
goes to the Typer app in ``hpcml.cli_app``, whose groups (``hpcml.cli_support.Group``)
end a command that raised an ``HpcmlError`` through :func:`report`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcml.errors import HpcmlError


def __getattr__(name: str):
    if name == "app":                      # ``from hpcml.cli import app`` (tests, plugins)
        from hpcml.cli_app import app
        return app
    raise AttributeError(name)


def report(command: str, exc: HpcmlError, flags: Mapping[str, str] | None = None) -> int:
    """Print ``COMMAND: error: MESSAGE`` as one line on stderr; return the error's exit code.

    ``flags`` maps a command's settings to its options (``prometheus_port`` ->
    ``--prometheus-port``): a bad setting named by a ``UsageError`` is shown as the option
    the user typed. A key of a file (the error names the file) is left as it is.
    """
    message = str(exc)
    key = getattr(exc, "key", None)
    if flags and isinstance(key, str) and key in flags and not getattr(exc, "file", None) \
            and hasattr(exc, "render"):
        message = exc.render(flags[key])
    print(f"{command}: error: {' '.join(message.split(chr(10)))}", file=sys.stderr)
    return exc.exit_code


#: command words -> the module of their Typer-free fast path
FAST_PATHS = ((("env", "run"), "hpcml.env.fastrun"), (("scan",), "hpcml.scan.fastscan"))
#: components whose CLI is loaded alone (``hpcml <component> ...``)
COMPONENTS = ("vet", "scan", "observe", "score", "data", "env", "ckpt", "service", "farm")


def main() -> None:
    """The ``hpcml`` program; Ctrl-C anywhere (even while it starts) is one line and exit 130,
    never a traceback."""
    try:
        _main()
    except KeyboardInterrupt:
        print("hpcml: interrupted", file=sys.stderr)
        sys.exit(130)


def _fast_path(argv: list[str]) -> tuple[Any, list[str]]:
    """The module that runs this command line without Typer, if any, and its arguments: ``hpcml env run``
    (every container start) and ``hpcml scan FILE`` (CI loops, a scan before each load).
    Each has ``wants(args)``, ``main(args)``, ``PROG`` and ``FLAGS``; --help goes to Typer."""
    for words, module in FAST_PATHS:
        if argv[:len(words)] == list(words):
            fast, args = __import__(module, fromlist=["main"]), argv[len(words):]
            return (fast if fast.wants(args) else None), args
    return None, argv


def version() -> str:
    """The installed distribution's version (what pip reports), else the source tree's."""
    from importlib import metadata
    try:
        return metadata.version("hpcml")
    except metadata.PackageNotFoundError:
        from hpcml import __version__
        return __version__


def _main() -> None:
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):
        print(f"hpcml {version()}")
        return
    fast, args = _fast_path(argv)
    if fast is not None:
        from hpcml.errors import HpcmlError
        try:
            code = fast.main(args)
        except HpcmlError as exc:
            code = report(fast.PROG, exc, fast.FLAGS)
        sys.exit(code)
    component = argv[0] if argv else ""
    if component in COMPONENTS:
        # only the component's own CLI: the others' imports (numpy, pyarrow, ...) cost every
        # command a quarter of a second otherwise
        import importlib
        app = importlib.import_module(f"hpcml.{component}.cli").app
        app(args=argv[1:], prog_name=f"hpcml {component}")
        return
    from hpcml.cli_app import app
    app()
