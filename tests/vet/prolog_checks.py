"""Plugin checks for the prolog tests (``type: tests.vet.prolog_checks.Sleep``)."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict

from hpcml.vet.checks.base import Check, CheckReport, passed


class SleepParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = 0.0


class Sleep(Check):
    """Sleeps, then passes; declares itself fast like a plugin would."""

    type_name = "sleep"
    Params = SleepParams
    default_timeout = 60.0
    fast = True

    def run(self) -> CheckReport:
        time.sleep(self.params.seconds)
        return passed(self.params.seconds, unit="s")


class Unmarked(Sleep):
    """The same without a ``fast`` declaration: not run in a prolog unless the eval says so."""

    fast = None
