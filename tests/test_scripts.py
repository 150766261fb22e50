"""scripts/venv.sh, which ./scripts/example and ./scripts/test share: a venv is rebuilt when
its inputs change, and only then (a rebuild costs minutes and, with torch, hundreds of MB)."""

from __future__ import annotations

import json
import os
import shutil
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


def test_the_example_venv_resolves_the_pinned_cpu_torch_alone_without_cuda_wheels(tmp_path):
    """Was: ``pip install -e .[torch]`` and then ``torch==2.13.0``: the first call took the
    newest torch, a CUDA build with 3.2 GB of nvidia-* wheels and triton, and the pin replaced
    torch alone (a 5.2 GB venv). One resolver call now: pip's own report of what it would
    install (a dry run, on a copy of the project: nothing is written into the checkout)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "src", proj / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    report = tmp_path / "install.json"
    out = _venv_sh(f"venv_install {sys.executable} '{proj}[torch]' --dry-run --ignore-installed --report {report}",
                   sys.executable)
    assert out.returncode == 0, out.stderr
    names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert names["torch"] == "2.13.0+cpu" and "hpcml" in names, names
    assert not [n for n in names if n == "triton" or (n.startswith("nvidia-") and n != "nvidia-ml-py")], names
