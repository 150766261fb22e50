"""Errors that end a command with a one-line message instead of a traceback.

Library code raises these, worded in the user's terms (a file, a key, a setting: never a
command-line flag); the CLI alone turns one into ``hpcml <command>: error: <message>`` on
stderr and the error's ``exit_code`` (``hpcml.cli_support.Group``; ``hpcml.cli_report.report``).

A ``UsageError`` is bad input (a file, a key or a setting's value): exit 2, before anything
has run. A ``SlurmError`` is a Slurm client that failed, timed out or is missing.
"""

from __future__ import annotations


class HpcmlError(Exception):
    """Base class: its message is one line meant for a person."""

    exit_code = 1


class UsageError(HpcmlError):
    """Bad input: a file, key or value the user must fix. Exit code 2.

    ``key`` is a key of ``file``, or without a file the setting (a function's parameter,
    e.g. ``prometheus_port``) that has the bad value; the CLI shows a setting as its flag
    (``flag '--prometheus-port'``) or its argument (``argument BLUEPRINT``), never as a key.
    """

    exit_code = 2

    def __init__(self, problem: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None) -> None:
        self.file, self.key, self.line, self.problem = file, key, line, problem
        super().__init__(self.render())

    def render(self, key: str | None = None) -> str:
        """The message; ``key`` names the key another way (``--prometheus-port``)."""
        key = key or self.key
        where = ""
        if self.file:
            where = f"{self.file}"
            if self.line is not None:
                where += f":{self.line}"
        if key and not self.file and key.startswith("-"):
            where = f"flag '{key}'"             # the user typed it: say so, not 'key'
        elif key and not self.file and key.isupper():
            where = f"argument {key}"
        elif key:
            where = f"{where}: key '{key}'" if where else f"key '{key}'"
        return f"{where}: {self.problem}" if where else self.problem


class SlurmError(HpcmlError):
    """A Slurm command failed, timed out, or Slurm is not installed."""

    exit_code = 1
