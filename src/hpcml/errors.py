"""Errors that end a command with a one-line message instead of a traceback.

A ``UsageError`` is bad input (a file, a key, a value): the CLI prints its message and
exits 2 before anything has run. A ``SlurmError`` is a Slurm client that failed, timed out
or is missing.
"""

from __future__ import annotations


class HpcmlError(Exception):
    """Base class: its message is one line meant for a person."""

    exit_code = 1


class UsageError(HpcmlError):
    """Bad input: a file, key or value the user must fix. Exit code 2."""

    exit_code = 2

    def __init__(self, problem: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None) -> None:
        where = ""
        if file:
            where = f"{file}"
            if line is not None:
                where += f":{line}"
        if key:
            where = f"{where}: key '{key}'" if where else f"key '{key}'"
        self.file, self.key, self.line, self.problem = file, key, line, problem
        super().__init__(f"{where}: {problem}" if where else problem)


class SlurmError(HpcmlError):
    """A Slurm command failed, timed out, or Slurm is not installed."""

    exit_code = 1
