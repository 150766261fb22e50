"""The ``hpcml`` command's entry point.

Light on purpose: ``hpcml env run`` sits in front of every container start (once per
task under srun), so it takes a path that imports no CLI framework; every other command
goes to the Typer app in ``hpcml.cli_app``.
"""

from __future__ import annotations

import sys


def __getattr__(name: str):
    if name == "app":                      # ``from hpcml.cli import app`` (tests, plugins)
        from hpcml.cli_app import app
        return app
    raise AttributeError(name)


def main() -> None:
    from hpcml.errors import HpcmlError
    argv = sys.argv[1:]
    if argv[:2] == ["env", "run"] and not {"--help", "-h"} & set(argv[2:argv.index("--") if "--" in argv else None]):
        from hpcml.env.fastrun import main as run_main
        sys.exit(run_main(argv[2:]))
    from hpcml.cli_app import app
    try:
        app(standalone_mode=True)
    except HpcmlError as exc:
        print(f"hpcml: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
