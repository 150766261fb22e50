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
