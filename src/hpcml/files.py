"""Small file helpers shared by the components."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write through a temporary file and rename it, so a reader never sees half a file
    (several processes may write their own files in one shared directory)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
