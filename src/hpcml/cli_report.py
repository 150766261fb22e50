"""The one place an error becomes its message: ``COMMAND: error: MESSAGE``, exit code.

Below ``hpcml.cli`` (the program, its fast paths) and ``hpcml.cli_support`` (the Typer
groups every component CLI uses), so neither imports the other: the fast paths stay free
of Typer, and a component CLI does not pull in the program and through it every other CLI.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from hpcml.errors import HpcmlError


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
