"""Where a running service's state lives, and the document that describes it.

One directory per instance (``$HPCML_SERVICE_STATE`` or ``~/.local/state/hpcml/services``,
then the instance's name): the service's volumes and files, its log, its token (mode
0600) and ``service.json`` (``hpcml.service.state/1``): what was started, where, on which
ports. The volumes survive ``down``/``up``; ``service.json`` says whether it runs.

An instance's name comes from a flag (``--name``) or a blueprint: it is one path component
and its directory must resolve inside the state root (a symlink out of it is refused), so
no name writes elsewhere. ``up.lock`` (``flock``) is held by the ``up`` that starts it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcml.errors import UsageError
from hpcml.files import inside, load_json_bounded, unknown_key, write_atomic
from hpcml.schemas import check, tag

SCHEMA = tag("service.state", 1)
STATE_FILE = "service.json"
STATE_MAX = 1 << 20                # a service.json is ~1 KiB


def state_root(override: str | os.PathLike[str] | None = None) -> Path:
    if override:
        return Path(override)
    if os.environ.get("HPCML_SERVICE_STATE"):
        return Path(os.environ["HPCML_SERVICE_STATE"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "hpcml" / "services"


@dataclass
class ServiceState:
    name: str
    blueprint: str                                # the blueprint file
    mode: str                                     # "local" or "slurm"
    backend: str                                  # "process" or "container"
    directory: str
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    pid: Optional[int] = None
    pgid: Optional[int] = None
    pid_started: Optional[float] = None           # with cmdline: the identity ``down`` checks before a signal
    cmdline: list[str] = field(default_factory=list)
    job_id: Optional[str] = None
    node: Optional[str] = None
    ready: bool = False
    stopped: bool = False
    started: float = 0.0
    ready_after_s: Optional[float] = None
    options: dict[str, str] = field(default_factory=dict)
    token_file: Optional[str] = None

    @property
    def log(self) -> Path:
        return Path(self.directory) / "service.log"

    def urls(self) -> dict[str, str]:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return {name: f"http://{host}:{port}" for name, port in self.ports.items()}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self), "urls": self.urls()}


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def instance_dir(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``ROOT/NAME``, refused (one line, exit 2) unless NAME is one plain path component and
    the directory resolves inside ROOT (symlinks included)."""
    base = state_root(root)
    if base.exists() and not base.is_dir():
        raise UsageError(f"{base} is not a directory", key="state_dir")
    if not _NAME.match(name) or ".." in name:
        raise UsageError(f"expected an instance name of letters, digits, '.', '_' and '-' (one path component, "
                         f"no '..'), found {name!r}", key="name")
    try:
        inside(base, name)
    except ValueError as exc:
        raise UsageError(f"{name}: {exc}", key="name") from None
    return base / name


def write(state: ServiceState) -> None:
    Path(state.directory).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(state.directory) / STATE_FILE, json.dumps(state.to_json(), indent=2) + "\n")


def read(directory: str | os.PathLike[str]) -> ServiceState | None:
    """The instance's state, or None if it never started."""
    path = Path(directory) / STATE_FILE
    try:       # bounded: a FIFO or a huge file put in its place must not hang or fill memory
        doc = load_json_bounded(path, STATE_MAX)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read: {exc}", file=str(path)) from None
    check(doc, SCHEMA, str(path))
    doc.pop("schema", None)
    doc.pop("urls", None)
    unknown = sorted(set(doc) - set(ServiceState.__dataclass_fields__))
    if unknown:
        raise UsageError(unknown_key(unknown[0], list(ServiceState.__dataclass_fields__)), file=str(path),
                         key=unknown[0])
    try:
        return ServiceState(**doc)
    except TypeError as exc:             # a required key missing
        raise UsageError(f"not a service state: {exc}", file=str(path)) from None


def instances(root: str | os.PathLike[str] | None = None) -> list[ServiceState]:
    base = state_root(root)
    found = [read(d) for d in sorted(base.iterdir()) if (d / STATE_FILE).is_file()] if base.is_dir() else []
    return [s for s in found if s is not None]


LOCK_FILE = "up.lock"


def _lock(fd: int, wait: float) -> None:
    """``flock`` of ``fd``, tried until ``wait`` seconds have passed; BlockingIOError then."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


#: how long a Slurm service job's own ``up`` waits for the lock: the ``up --slurm`` that
#: submitted it holds the lock from sbatch until the job is recorded, and a job that starts
#: at once (an idle cluster) finds it held for those milliseconds
SUBMITTER_WAIT_S = 30.0


@contextlib.contextmanager
def starting(directory: Path, wait: float = 0.0) -> Iterator[None]:
    """Hold the instance's ``up.lock`` while this process starts it: a second ``up`` of the
    same instance at the same time (two servers on one SQLite database, one of them
    untracked) is refused with who holds it, one line, exit 2, after waiting up to ``wait``
    seconds for it. ``flock`` is released by the kernel when the holder dies, so a killed
    ``up`` leaves no stale lock."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            _lock(fd, wait)
        except BlockingIOError:
            holder = ""
            for _ in range(50):               # the holder writes its pid just after it got the lock
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                if holder:
                    break
                time.sleep(0.05)
            s = read(directory)
            svc = f"; the service: pid {s.pid}, ports {', '.join(f'{k} {v}' for k, v in s.ports.items())}" \
                if s is not None and s.pid and not s.stopped else ""
            raise UsageError(f"{directory.name} is being started by another hpcml service up (pid {holder or '?'}{svc}): "
                             f"wait for it, then hpcml service status {directory.name}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
