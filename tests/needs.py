"""The suite's one skip policy: what a test needs is there, or the test fails.

CI installs everything the suite uses (``scripts/test``: the test extra, torch's CPU
build, Debian's Slurm, PostgreSQL, Prometheus, Chromium, container runtimes) and runs as
root, so a missing piece there is a broken CI, never a reason to pass quietly. A developer
without one opts out by name: ``HPCML_ALLOW_SKIP_<WHAT>=1`` (``HPCML_ALLOW_SKIP_TORCH=1``,
``..._CHROMIUM``, ``..._ROOT``, ``..._SLURM``, ...) turns that failure into a skip that
says so. No test installs anything itself.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest


def opt_out(what: str) -> str:
    return f"HPCML_ALLOW_SKIP_{what.upper().replace('-', '_').replace('.', '_')}"


def missing(what: str, why: str) -> NoReturn:
    """Fail (or, opted out, skip) a test that cannot run without ``what``."""
    var = opt_out(what)
    if os.environ.get(var) == "1":
        pytest.skip(f"{why} ({var}=1)", allow_module_level=True)
    pytest.fail(f"{why}: this test needs it ({var}=1 skips it on a machine without)", pytrace=False)


def module(name: str, what: str | None = None) -> ModuleType:
    """``import name``, or fail/skip (``what``: the opt-out's name, default the top package)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(what or name.split(".")[0], f"Python module {name} cannot be imported ({exc})")


def tool(command: str, what: str | None = None) -> str:
    """The path of ``command`` on PATH, or fail/skip."""
    path = shutil.which(command)
    if path is None:
        missing(what or command, f"{command} is not installed (scripts/test installs it as root)")
    return path


def root(why: str) -> None:
    if os.geteuid() != 0:
        missing("root", f"not root: {why}")


def shared_testdata(*parts: str) -> Path:
    """``../shared/testdata/<parts>`` beside the checkout (real files from other producers,
    ``../shared/testdata/README.md``), or skip the whole calling module in one visible line.

    The one exception to the rule above, by that README's rule: a user's clone has no
    ``../shared`` and must still pass; every machine that has it runs the tests.
    """
    base = Path(__file__).resolve().parents[1] / ".." / "shared" / "testdata"
    path = base.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"no {path} (real files from other producers: a checkout beside ../shared has them)",
                    allow_module_level=True)
    return path
