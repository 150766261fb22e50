"""What the format tests share: scan bytes written to a file, name the findings of a verdict."""

from __future__ import annotations

from pathlib import Path

from hpcml.scan.model import FileResult, Verdict
from hpcml.scan.scanner import scan_file


def scan_written(tmp_path: Path, data: bytes, name: str) -> FileResult:
    path = tmp_path / name
    path.write_bytes(data)
    return scan_file(path)


def names(result: FileResult, verdict: Verdict) -> list[str]:
    return [f.name for f in result.findings if f.verdict is verdict]
