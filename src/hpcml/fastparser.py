"""The argument parser of the Typer-free fast paths (``hpcml env run``, ``hpcml scan``):
argparse with the project's one error shape, ``PROG: error: MESSAGE`` on one line and exit 2,
as ``hpcml.cli_report.report`` prints for every other command."""

from __future__ import annotations

import argparse
import sys


class FastParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        # Typer (click) takes no abbreviated long options: the fast path must not either
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
