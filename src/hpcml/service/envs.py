"""The virtual environment a Python-package service runs in, created once and cached.

One venv per set of requirements (and Python minor version), at
``<root>/<name>-<hash>``, the root being, first set first:

    $HPCML_SERVICE_ENVS                 the service venvs' own directory
    $HPCML_CACHE_DIR/service-envs       hpcml's cache directory
    $XDG_CACHE_HOME/hpcml/service-envs  (an absolute XDG_CACHE_HOME only, as the spec says)
    ~/.cache/hpcml/service-envs

MLflow's took 280 s (``pip install``) and 851 MB the first time, so ``up`` says where it
builds, and what it costs, before it starts (on a cluster home often has a small quota:
point HPCML_CACHE_DIR at a project or scratch directory the compute nodes see too); ``up``
after ``down`` (and every test) reuses it. The service's packages never enter hpcml's own
environment. A venv is complete once its marker file exists (written after pip
succeeded); a half-built one is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hpcml import logs
from hpcml.errors import HpcmlError, UsageError

log = logs.get(__name__)

#: what the bundled MLflow blueprint's first build took (mlflow 3.17, Python 3.12), quoted
#: before every first build as the order of magnitude to expect
MLFLOW_BUILD = "MLflow's took 280 s and 851 MB"
#: below this much free space where the venv goes, the note before a build says so
LOW_SPACE = 1 << 30


class ServiceEnvError(HpcmlError):
    """Creating a service's venv failed (pip's last lines are in the message)."""


def _absolute(value: str) -> Path:
    """A directory from a variable: ``~`` expanded, a relative one taken from the current
    directory (a venv's scripts carry its absolute path, so it must have one)."""
    return Path(os.path.abspath(os.path.expanduser(value)))


def envs_location() -> tuple[Path, str]:
    """Where service venvs are cached, and what says so (a variable, or ``default``)."""
    base = os.environ.get("HPCML_SERVICE_ENVS")
    if base:
        return _absolute(base), "HPCML_SERVICE_ENVS"
    cache = os.environ.get("HPCML_CACHE_DIR")
    if cache:
        return _absolute(cache) / "service-envs", "HPCML_CACHE_DIR"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "hpcml" / "service-envs", "XDG_CACHE_HOME"
    return Path(os.path.expanduser("~")) / ".cache" / "hpcml" / "service-envs", "default"


def envs_root() -> Path:
    """Where service venvs are cached (``envs_location``)."""
    return envs_location()[0]


def env_key(packages: Sequence[str]) -> str:
    """A short hash of the requirements and the Python minor version."""
    doc = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "packages": sorted(packages)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def env_path(name: str, packages: Sequence[str]) -> Path:
    return envs_root() / f"{name}-{env_key(packages)}"


def is_built(name: str, packages: Sequence[str]) -> bool:
    path = env_path(name, packages)
    return (path / "pyvenv.cfg").is_file() and (path / ".hpcml-complete").is_file()


def _free(path: Path) -> int | None:
    """Free bytes on the filesystem ``path`` will be on (its nearest existing parent)."""
    for parent in (path, *path.parents):
        try:
            return shutil.disk_usage(parent).free
        except OSError:
            continue
    return None


def build_note(name: str, packages: Sequence[str], doing: str = "building") -> str:
    """What ``up`` says before it builds a service's venv: where, what it costs, how to move it."""
    path = env_path(name, packages)
    origin = envs_location()[1]
    whence = f" (from {origin})" if origin != "default" else ""
    free = _free(path)
    low = (f"; only {free / (1 << 30):.1f} GiB free there" if free is not None and free < LOW_SPACE else "")
    return (f"{doing} {name}'s Python environment ({' '.join(packages)}) in {path}{whence}: the first time "
            f"only, it takes minutes and can need about 1 GB ({MLFLOW_BUILD}){low}; "
            "set HPCML_CACHE_DIR to a directory with room (seen by the compute nodes) to build it there")


def _say(line: str) -> None:
    log.info(f"hpcml service: {line}")


def ensure_env(name: str, packages: Sequence[str], *, log: Path | None = None, timeout: float = 1800,
               say: Callable[[str], None] | None = _say) -> Path:
    """The venv for ``packages``, created (``python -m venv`` + ``pip install``) if missing;
    ``say`` gets ``build_note`` first (to stderr unless told otherwise, and into ``log``)."""
    path = env_path(name, packages)
    if is_built(name, packages):
        return path
    origin = envs_location()[1]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = f"cannot create {path.parent} for {name}'s Python environment: {exc.strerror or exc}"
        if origin in ("HPCML_SERVICE_ENVS", "HPCML_CACHE_DIR", "XDG_CACHE_HOME"):
            raise UsageError(f"{origin}={os.environ[origin]}: {problem}") from None
        raise ServiceEnvError(f"{problem} (set HPCML_CACHE_DIR to build it elsewhere)") from None
    with _one_builder(path):
        if is_built(name, packages):                     # built by the one we waited for
            return path
        return _build(name, packages, path, log, timeout, say)


@contextmanager
def _one_builder(path: Path) -> Iterator[None]:
    """One builder of ``path`` at a time (``flock`` on a file beside it): two ``up`` that find
    it missing at once would each ``venv --clear`` the other's half-built environment; the
    second waits and finds it built. A filesystem without locks builds unguarded, as before."""
    try:
        fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            log.debug(f"no lock on {path}'s build ({exc.strerror}): built unguarded")
        yield
    finally:
        os.close(fd)                                     # the lock goes with it


def _build(name: str, packages: Sequence[str], path: Path, log: Path | None, timeout: float,
           say: Callable[[str], None] | None) -> Path:
    note = build_note(name, packages)
    if say:
        say(note)
    (path / ".hpcml-complete").unlink(missing_ok=True)     # rebuilt below: not complete until pip succeeds
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        if log:
            out.write(f"== hpcml service: {note}\n".encode())  # type: ignore[union-attr]
            out.flush()  # type: ignore[union-attr]
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
