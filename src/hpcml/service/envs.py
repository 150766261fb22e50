"""The virtual environment a Python-package service runs in, created once and cached.

One venv per set of requirements (and Python minor version), under
``$HPCML_SERVICE_ENVS`` or ``~/.cache/hpcml/service-envs/<name>-<hash>``: MLflow's is about
850 MB and a minute of ``pip install``, so ``up`` after ``down`` (and every test) reuses it.
The service's packages never enter hpcml's own environment. A venv is complete
once its marker file exists (written after pip succeeded); a half-built one is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hpcml.errors import HpcmlError


class ServiceEnvError(HpcmlError):
    """Creating a service's venv failed (pip's last lines are in the message)."""


def envs_root() -> Path:
    """Where service venvs are cached."""
    base = os.environ.get("HPCML_SERVICE_ENVS")
    if base:
        return Path(base)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "hpcml" / "service-envs"


def env_key(packages: Sequence[str]) -> str:
    """A short hash of the requirements and the Python minor version."""
    doc = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "packages": sorted(packages)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def env_path(name: str, packages: Sequence[str]) -> Path:
    return envs_root() / f"{name}-{env_key(packages)}"


def ensure_env(name: str, packages: Sequence[str], *, log: Path | None = None, timeout: float = 1800) -> Path:
    """The venv for ``packages``, created (``python -m venv`` + ``pip install``) if missing."""
    path = env_path(name, packages)
    if (path / "pyvenv.cfg").is_file() and (path / ".hpcml-complete").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    (path / ".hpcml-complete").unlink(missing_ok=True)     # rebuilt below: not complete until pip succeeds
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        # built at its final path (a venv's scripts carry absolute shebangs, so it cannot be
        # renamed): the marker file written last says it is complete
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True, timeout=300,
                       stdout=out, stderr=subprocess.STDOUT)
        subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                        "--no-input", *packages], check=True, timeout=timeout, stdout=out, stderr=subprocess.STDOUT)
    except subprocess.CalledProcessError as exc:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log and log.exists() else []
        raise ServiceEnvError(f"creating the service venv {path} failed ({' '.join(exc.cmd[:4])} ... exit "
                              f"{exc.returncode}){': ' + tail[0] if tail else ''}") from None
    except subprocess.TimeoutExpired as exc:
        raise ServiceEnvError(f"creating the service venv {path} timed out after {exc.timeout} s") from None
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    (path / ".hpcml-complete").write_text(json.dumps({"packages": list(packages)}) + "\n")
    return path
