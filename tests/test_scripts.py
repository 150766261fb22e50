"""scripts/venv.sh, which ./scripts/example and ./scripts/test share: a venv is rebuilt when
its inputs change, and only then (a rebuild costs minutes and, with torch, hundreds of MB)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def _venv_sh(script: str, py: Path | str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". scripts/venv.sh; {script}"], cwd=ROOT, capture_output=True, text=True,
                          env={**(env or os.environ), "PY": str(py)}, timeout=300)


def test_an_active_venv_does_not_force_the_example_venv_to_be_rebuilt(tmp_path):
    """Was: the stamp held ``$PY``'s own path, so ``./scripts/example`` run with a venv active
    (python3 = that venv's python) rebuilt .venv-example from scratch. This test runs from
    the test venv: its python is such a ``$PY``."""
    assert Path(sys.prefix) != Path(sys.base_prefix), "the suite runs from a venv (scripts/test)"
    venv = tmp_path / "venv-example"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(BASE_PYTHON)
    built = _venv_sh("venv_stamp scripts/example", BASE_PYTHON)
    assert built.returncode == 0 and len(built.stdout.strip()) == 16, built.stderr
    (venv / ".hpcml-stamp").write_text(built.stdout)
    # a rebuild would say so and fail at once: the spec names nothing pip can install
    active = {**os.environ, "VIRTUAL_ENV": sys.prefix, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    again = _venv_sh(f"ensure_venv {venv} {tmp_path / 'no-such-project'} scripts/example", sys.executable, active)
    assert again.returncode == 0 and "building" not in again.stderr, again.stderr
    assert (venv / ".hpcml-stamp").read_text() == built.stdout
