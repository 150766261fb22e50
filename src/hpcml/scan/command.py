"""``hpcml scan [files]``: the command's body, shared by the Typer CLI and the fast path.

Kept free of Typer (and of anything heavy at import): ``hpcml scan model.pt`` in a CI loop
or before every load pays the start-up each time. See ``hpcml.scan.fastscan``.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpcml.errors import UsageError


def scan_files(paths: list[Path], *, policy: list[Path], as_json: bool, sarif: Path | None,
               jobs: int | None, show_all: bool) -> int:
    """Scan PATHS, print the table or JSON (and write SARIF); the exit code."""
    from hpcml.scan import report
    from hpcml.scan.policy import load_policy
    from hpcml.scan.scanner import exit_code, scan_paths
    missing = [p for p in paths if not p.exists()]
    if missing:                        # a path that is not there is bad input (2), not an unreadable file (7)
        raise UsageError("no such file or directory", file=str(missing[0]))
    pol = load_policy(*policy)
    from hpcml import progress
    with progress.on_terminal(progress.wanted(as_json)):          # a bar on stderr, never in stdout's result
        results = scan_paths(paths, pol, jobs=jobs)
    code = exit_code(results, pol)
    if sarif:
        report.write_json(report.to_sarif(results), sarif)
    if as_json:
        print(json.dumps(report.to_json(results, code, pol.sources), indent=2))
    else:
        from rich.console import Console
        Console().print(report.table(results, show_all=show_all))
        for line in report.advice(results, policy=pol):
            print(line)
    return code
