"""The job directory of ``hpcml run``: one place for everything a job left behind.

::

    run.json          what ran: command, mode, nodes, excluded nodes, rendezvous, launch line,
                      start, end, exit code and the first failing rank (schema hpcml.run/1)
    vet/              the vet report (report.json, bad-nodes, good-nodes), with --vet
    env.json          the resolved container environment, with --env
    observe/          the observe job store: steps, metrics, host and GPU samples per rank
                      (hpcml score reads its GPU rows)
    logs/rank-N.out   each rank's stdout and stderr
    logs/rank-N.err
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hpcml.errors import UsageError

SCHEMA = "hpcml.run/1"
RUN_JSON = "run.json"


def default_dir(job_id: str | None) -> Path:
    return Path(f"hpcml-run-{job_id}" if job_id else f"hpcml-run-local-{os.getpid()}")


def observe_dir(d: Path) -> Path:
    return d / "observe"


def vet_dir(d: Path) -> Path:
    return d / "vet"


def log_path(d: Path, rank: int, stream: str) -> Path:
    return d / "logs" / f"rank-{rank}.{stream}"


def write_run(d: Path, data: dict[str, Any]) -> None:
    tmp = d / f".{RUN_JSON}.tmp"
    tmp.write_text(json.dumps({"schema": SCHEMA, **data}, indent=2, default=str) + "\n")
    os.replace(tmp, d / RUN_JSON)


def read_run(d: Path) -> dict[str, Any]:
    from hpcml.schemas import check
    p = Path(d) / RUN_JSON
    if not p.is_file():
        raise UsageError("not an hpcml run job directory (no run.json)", file=str(d))
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable: {exc}", file=str(p)) from None
    check(data, SCHEMA, str(p))
    return data


def tail(path: Path, lines: int = 20, max_bytes: int = 64 << 10) -> list[str]:
    """The last ``lines`` lines of a log (read from its end: logs can be large)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
