"""hpcml's messages to the person running it, through :mod:`logging`.

Library code logs to a logger under ``hpcml`` (``logs.get(__name__)``) instead of printing.
The ``hpcml`` logger carries one handler of its own, as Hugging Face's libraries do: the
message alone, on whatever ``sys.stderr`` is when it is written (a test's capture, Typer's
runner, a job's log), INFO and above, not passed on to the root logger. So a command and a
training script that uses ``hpcml.ckpt`` print what they printed before, and an application
that wants the messages elsewhere replaces that handler (``logging.getLogger("hpcml")``).
"""

from __future__ import annotations

import logging
import sys

ROOT = "hpcml"


class _Stderr(logging.Handler):
    """The message, one line, on the current ``sys.stderr`` (looked up at each record: a
    handler holding the stream it was made with would write past a capture)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a failed record never raises
            self.handleError(record)


def _configure() -> logging.Logger:
    root = logging.getLogger(ROOT)
    if not getattr(root, "_hpcml_configured", False):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        if root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        root.propagate = False
        root._hpcml_configured = True  # type: ignore[attr-defined]
    return root


def get(name: str) -> logging.Logger:
    """The logger of module ``name`` (``__name__``), under ``hpcml``'s configured one."""
    _configure()
    return logging.getLogger(name)


class _Json(logging.Formatter):
    """One JSON object a line: time (ISO 8601, UTC), level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        import json
        from datetime import datetime, timezone
        return json.dumps({"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                           "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()})


def for_service(json_lines: bool = False) -> None:
    """A long-running service's log lines (``hpcml centre serve``): each with its time (UTC)
    and level, or one JSON object a line for a log shipper. A command's lines stay bare."""
    import time
    root = _configure()
    for handler in root.handlers:
        if isinstance(handler, _Stderr):
            if json_lines:
                handler.setFormatter(_Json())
            else:
                fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%SZ")
                fmt.converter = time.gmtime
                handler.setFormatter(fmt)
