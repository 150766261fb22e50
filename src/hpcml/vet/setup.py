"""Install the checks' requirements once, into a cached virtual environment.

vetnode pip-installs on every node at job start: minutes of pip against a shared index,
from every node at once. Here ``hpcml vet setup`` builds one venv on shared storage, named
by the hash of what it holds, and ``hpcml vet`` only looks it up. The venv sees the
system's site-packages, so hpcml itself and anything already installed stay importable.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import platform
import subprocess
import sys
import venv
from pathlib import Path

from hpcml.errors import HpcmlError
from hpcml.vet.protocol import Protocol

MARKER = ".hpcml-vet-complete"


def key(protocol: Protocol) -> str:
    blob = json.dumps({"requirements": sorted(protocol.requirements()),
                       "index_url": protocol.index_url,
                       "python": platform.python_version_tuple()[:2],
                       "machine": platform.machine()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def venv_dir(protocol: Protocol, root: str | Path) -> Path:
    return Path(root).expanduser() / f"vet-{key(protocol)}"


def python_of(protocol: Protocol, root: str | Path | None) -> str | None:
    """The cached venv's interpreter, or None when it has not been set up."""
    if not root or not protocol.requirements():
        return None
    path = venv_dir(protocol, root)
    return str(path / "bin" / "python") if (path / MARKER).exists() else None


def setup(protocol: Protocol, root: str | Path, *, log=print) -> Path:
    """Create (or reuse) the venv for this protocol's requirements; safe to run concurrently."""
    path = venv_dir(protocol, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / MARKER).exists():
            log(f"already set up: {path}")
            return path
        venv.EnvBuilder(system_site_packages=True, with_pip=True, clear=True).create(path)
        pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        if protocol.index_url:
            pip += ["--index-url", protocol.index_url]
        for req in protocol.requirements():
            log(f"installing {' '.join(req)}")
            proc = subprocess.run(pip + req, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise HpcmlError(f"pip install {' '.join(req)} failed: {tail[0]}")
        (path / MARKER).write_text(json.dumps({"requirements": protocol.requirements(),
                                               "python": sys.version}) + "\n")
    return path
