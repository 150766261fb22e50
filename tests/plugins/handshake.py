"""A test check that says when it runs, so a test waits for that instead of sleeping.

Loaded as a protocol plugin (``type: tests.plugins.handshake.HangOnceStarted``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from hpcml.vet.checks.base import Check, CheckReport, passed


class StartedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    started: str                       # a file created, holding the check's pid, once it runs
    seconds: float = 3600.0


class HangOnceStarted(Check[StartedParams]):
    """Writes its pid to ``started`` (through a rename: the file is whole once it exists),
    then sleeps for ``seconds``: a hung check that a test knows is running."""

    type_name = "test-hang-once-started"

    def run(self) -> CheckReport:
        began = time.time()
        path = Path(self.params.started)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(str(os.getpid()))
        tmp.rename(path)
        time.sleep(self.params.seconds)
        return passed(0, message="did not hang", began=began, ended=time.time())
