"""The quality gate, in the test run: ruff (lint and import order) over the tree and mypy over
src/ (the package ships ``py.typed``, so its annotations are a promise to users)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_is_clean():
    p = _run("ruff", "check", "--no-cache", "src", "tests", "benchmarks", "examples")
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr


def test_mypy_is_clean():
    p = _run("mypy", "--cache-dir", str(ROOT / ".venv" / ".mypy_cache"))     # files, options: pyproject
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr
