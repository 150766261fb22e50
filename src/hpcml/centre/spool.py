"""Node reports a prolog or health check could not send, kept to send on its next run
(issue 69): a collector that is down when a node fails must still hear of it.

Why files, one per report: a prolog is a short process that Slurm starts on every job and
every ``HealthCheckInterval``; there is no daemon to hold a queue. Each run sends the oldest
waiting reports first, each signed when it is sent (a MUNGE credential lives minutes, a
spooled report may wait hours), within what is left of its budget, and never more than
``BATCH``. The directory is root's own (0700): one that is a link, not a directory, or
writable by anyone else is not used, since what is in it is sent as this node's evidence.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from hpcml import logs

log = logs.get(__name__)

DEFAULT_DIR = Path("/var/tmp/hpcml-report-spool")
MAX_FILES = 1000                 # reports kept; the oldest go first past it
MAX_BYTES = 1 << 20              # one report (a node's: a few KB)
BATCH = 20                       # sent in one run at most


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def _usable(self, create: bool) -> bool:
        try:
            if create:
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self.folder)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log.warning(f"hpcml vet: spool {self.folder} is not this user's own private directory: not used")
            return False
        return True

    def put(self, doc: dict[str, Any]) -> Path | None:
        """Keep ``doc`` to send later; the file, or None when it cannot be kept."""
        if not self._usable(create=True):
            return None
        body = orjson.dumps(doc, default=str)
        if len(body) > MAX_BYTES:
            return None
        name = f"{time.time_ns():020d}-{os.getpid()}.json"
        tmp = self.folder / f".{name}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, self.folder / name)
        except OSError as exc:
            log.warning(f"hpcml vet: report not kept in {self.folder}: {exc.strerror or exc}")
            tmp.unlink(missing_ok=True)
            return None
        self._trim()
        return self.folder / name

    def pending(self) -> list[Path]:
        """The waiting reports, oldest first."""
        if not self._usable(create=False):
            return []
        try:
            return sorted(p for p in self.folder.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
        except OSError:
            return []

    def _trim(self) -> None:
        waiting = self.pending()
        for p in waiting[:max(0, len(waiting) - MAX_FILES)]:
            p.unlink(missing_ok=True)

    def flush(self, send: Callable[[dict[str, Any], float], Any], deadline: float) -> tuple[int, int]:
        """Send the oldest waiting reports while ``deadline`` (``time.monotonic()``) allows;
        ``send(doc, timeout)`` returns None when taken, else a ``client.Refusal``. A report the
        collector refuses for good is dropped (with a warning); any other failure stops the
        round. Returns (sent, left)."""
        waiting = self.pending()
        sent = 0
        for p in waiting[:BATCH]:
            left = deadline - time.monotonic()
            if left <= 0.05:
                break
            try:
                with open(p, "rb") as f:
                    doc = orjson.loads(f.read(MAX_BYTES + 1))
            except (OSError, ValueError):
                p.unlink(missing_ok=True)               # torn or foreign: nothing to send
                continue
            refused = send(doc, left)
            if refused is None:
                p.unlink(missing_ok=True)
                sent += 1
            elif getattr(refused, "final", False):
                log.warning(f"hpcml vet: spooled report {p.name} refused for good: {refused.why}; dropped")
                p.unlink(missing_ok=True)
            else:
                break
        return sent, len(self.pending())
