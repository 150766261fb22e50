"""Node reports a prolog or health check could not send, kept to send on its next run
(issue 69): a collector that is down when a node fails must still hear of it.

Why files, one per report: a prolog is a short process that Slurm starts on every job and
every ``HealthCheckInterval``; there is no daemon to hold a queue. Each run sends the oldest
waiting reports first, each signed when it is sent (a MUNGE credential lives minutes, a
spooled report may wait hours), within what is left of its budget, and never more than
``BATCH``. A report is kept before it is sent and removed once the collector took it, so a
prolog killed mid-send loses nothing. The directory is root's own (0700) in a parent no one
else may write: one that is a link, not a directory, or writable by anyone else is not used,
since what is in it is sent as this node's evidence; only its own files (``NAME``, regular,
this user's) are read. A report waits at most ``MAX_AGE``; a collector's answer that this
report can never be taken (400, 413) drops it, any other failure keeps it for later.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from hpcml import logs
from hpcml.files import load_json_bounded, private_dir

log = logs.get(__name__)

DEFAULT_DIR = Path("/var/spool/hpcml-reports")
MAX_FILES = 1000                 # reports kept; the oldest go first past it
MAX_AGE = 7 * 86400.0            # seconds a report waits at most
NAME = re.compile(r"^(\d{20})-\d+\.json$")
FINAL = (400, 413)               # the collector can never take this report (anything else: later)
MAX_BYTES = 1 << 20              # one report (a node's: a few KB)
BATCH = 20                       # sent in one run at most


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def _usable(self, create: bool) -> bool:
        problem = private_dir(self.folder, create=create)
        if problem is not None and (create or self.folder.exists()):
            log.warning(f"hpcml vet: spool {self.folder}: {problem}: not used")
        return problem is None

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
        """The waiting reports, oldest first: this spool's own files only."""
        if not self._usable(create=False):
            return []
        out = []
        try:
            for entry in os.scandir(self.folder):
                if NAME.match(entry.name):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                        out.append(Path(entry.path))
        except OSError:
            return []
        return sorted(out)

    def _trim(self) -> None:
        waiting = self.pending()
        oldest = time.time_ns() - int(MAX_AGE * 1e9)
        for i, p in enumerate(waiting):
            m = NAME.match(p.name)
            if i < len(waiting) - MAX_FILES or (m is not None and int(m.group(1)) < oldest):
                p.unlink(missing_ok=True)
        try:
            for entry in os.scandir(self.folder):           # a kill between write and rename leaves these
                if entry.name.startswith(".") and entry.name.endswith(".tmp") and \
                        time.time() - entry.stat(follow_symlinks=False).st_mtime > 60:
                    os.unlink(entry.path)
        except OSError:
            pass

    def flush(self, send: Callable[[dict[str, Any], float], Any], deadline: float, skip: Path | None = None) \
            -> tuple[int, int]:
        """Send the oldest waiting reports (but ``skip``) while ``deadline``
        (``time.monotonic()``) allows; ``send(doc, deadline)`` returns None when taken, else a
        ``client.Refusal``. A report the collector can never take (``FINAL``) is dropped with a
        warning; any other failure stops the round. Returns (sent, left)."""
        self._trim()
        sent = 0
        for p in [p for p in self.pending() if p != skip][:BATCH]:
            if deadline - time.monotonic() <= 0.05:
                break
            try:
                doc = load_json_bounded(p, MAX_BYTES, follow_symlinks=False, loads=orjson.loads)
            except (OSError, ValueError):
                doc = None
            if not isinstance(doc, dict):
                p.unlink(missing_ok=True)               # torn: nothing to send
                continue
            refused = send(doc, deadline)
            if refused is None:
                p.unlink(missing_ok=True)
                sent += 1
            elif getattr(refused, "status", None) in FINAL:
                log.warning(f"hpcml vet: spooled report {p.name} refused for good: {refused.why}; dropped")
                p.unlink(missing_ok=True)
            else:
                break
        return sent, len([p for p in self.pending() if p != skip])

    @contextmanager
    def sending(self) -> Iterator[bool]:
        """Whether this run may send (the spool's lock, not waited for): two runs of one node
        at once (two jobs starting, a health check beside a prolog) would send the same
        reports twice; the one that does not get it only keeps its report for the next."""
        import fcntl
        try:
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            yield True                        # no spool here: nothing to send twice
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def taken(self, path: Path | None) -> None:
        if path is not None:
            path.unlink(missing_ok=True)
