"""Install the checks' requirements once, into a cached virtual environment.

vetnode pip-installs on every node at job start: minutes of pip against a shared index,
from every node at once. Here ``hpcml vet setup`` builds one venv on shared storage, named
by the hash of what it holds, and ``hpcml vet`` only looks it up.

The venv sees exactly what the interpreter running hpcml sees: a ``.pth`` file adds each of
its site directories with ``site.addsitedir`` (which also runs their ``.pth`` files, so an
editable install of hpcml works), after the venv's own site-packages. hpcml installed in the
system, the user site or another venv therefore stays importable without a reinstall, and
pip skips requirements already met there. ``system_site_packages`` alone would not do: from
a venv it exposes the base interpreter's site-packages, not the venv that holds hpcml.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import site
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


def parent_site_dirs() -> list[str]:
    """The site directories of the running interpreter, in its own order (user site last)."""
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return dirs


def _link_parent(path: Path) -> None:
    """Make the venv import what this interpreter imports (see the module docstring)."""
    purelib = path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    lines = [f"import site; site.addsitedir({d!r})" for d in parent_site_dirs()]
    (purelib / "zz-hpcml-parent.pth").write_text("\n".join(lines) + "\n")


def _pip(argv: list[str]) -> tuple[int, list[str]]:
    """Run pip with its output on our stderr as it comes (its download progress bar too on
    a terminal), keeping the last lines for the error message."""
    tail: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        if line.strip():
            tail = (tail + [line.strip()])[-20:]
    return proc.wait(), tail


def setup(protocol: Protocol, root: str | Path, *, log=print) -> Path:
    """Create (or reuse) the venv for this protocol's requirements; safe to run concurrently."""
    path = venv_dir(protocol, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / MARKER).exists():
            log(f"already set up: {path}")
            return path
        venv.EnvBuilder(with_pip=True, clear=True).create(path)
        _link_parent(path)
        pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
        if protocol.index_url:
            pip += ["--index-url", protocol.index_url]
        for req in protocol.requirements():
            log(f"installing {' '.join(req)} (pip's progress follows; torch alone is gigabytes)")
            code, tail = _pip(pip + req)
            if code != 0:
                raise HpcmlError(f"pip install {' '.join(req)} failed: {tail[-1] if tail else 'no output'}")
        (path / MARKER).write_text(json.dumps({"requirements": protocol.requirements(),
                                               "python": sys.version}) + "\n")
    return path
