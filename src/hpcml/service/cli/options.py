"""Options several ``hpcml service`` commands share."""

from __future__ import annotations

from typing import Optional

import typer

from hpcml.errors import UsageError

SET = typer.Option(None, "--set", help="Set a blueprint option: NAME=VALUE (repeatable).")
STATE_DIR = typer.Option(None, "--state-dir", help="Where instances keep their state "
                                                  "(default $HPCML_SERVICE_STATE or ~/.local/state/hpcml/services).")
JSON = typer.Option(False, "--json", help="Print a JSON object instead of text.")


def parse_set(values: Optional[list[str]]) -> dict[str, str]:
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"expected NAME=VALUE, found {item!r}", key="set")
        out[key.strip()] = value
    return out
