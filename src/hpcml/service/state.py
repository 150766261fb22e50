"""Where a running service's state lives, and the document that describes it.

One directory per instance (``$HPCML_SERVICE_STATE`` or ``~/.local/state/hpcml/services``,
then the instance's name): the service's volumes and files, its log, its token (mode
0600) and ``service.json`` (``hpcml.service.state/1``): what was started, where, on which
ports. The volumes survive ``down``/``up``; ``service.json`` says whether it runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcml.files import write_atomic
from hpcml.schemas import check, tag

SCHEMA = tag("service.state", 1)
STATE_FILE = "service.json"


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


def instance_dir(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    return state_root(root) / name


def write(state: ServiceState) -> None:
    Path(state.directory).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(state.directory) / STATE_FILE, json.dumps(state.to_json(), indent=2) + "\n")


def read(directory: str | os.PathLike[str]) -> ServiceState | None:
    """The instance's state, or None if it never started."""
    path = Path(directory) / STATE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    check(doc, SCHEMA, str(path))
    doc.pop("schema", None)
    doc.pop("urls", None)
    return ServiceState(**doc)


def instances(root: str | os.PathLike[str] | None = None) -> list[ServiceState]:
    base = state_root(root)
    found = [read(d) for d in sorted(base.iterdir()) if (d / STATE_FILE).is_file()] if base.is_dir() else []
    return [s for s in found if s is not None]
