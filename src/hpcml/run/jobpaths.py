"""Where a job directory keeps each attempt's files: path arithmetic only.

Each rank's task wrapper needs these three paths and nothing else of ``hpcml.run.jobdir``,
whose run.json model (pydantic) costs every wrapper 0.2 s of start-up; ``jobdir``
re-exports them.
"""

from __future__ import annotations

from pathlib import Path


def attempt_dir(d: Path, attempt: int = 0) -> Path:
    """Where attempt ``attempt`` keeps its observe store and requeue marker."""
    return d if attempt == 0 else d / "attempts" / str(attempt)


def observe_dir(d: Path, attempt: int = 0) -> Path:
    return attempt_dir(d, attempt) / "observe"


def log_path(d: Path, rank: int, stream: str) -> Path:
    return d / "logs" / f"rank-{rank:05d}.{stream}"
