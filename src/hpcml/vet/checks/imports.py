"""Python modules the application imports, importable on this node (a broken venv or a
missing shared library shows up here, not 20 minutes into the job)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import ImportsParams  # noqa: F401


class ImportsCheck(Check["ImportsParams"]):
    default_timeout = 60.0

    def run(self) -> CheckReport:
        problems, versions = [], {}
        for name in self.params.modules:
            try:
                mod = importlib.import_module(name)
                versions[name] = str(getattr(mod, "__version__", ""))
            except Exception as exc:  # any failure to import is the node's problem
                problems.append(f"{name}: {type(exc).__name__}: {exc}".splitlines()[0])
        return judge(not problems, len(problems), threshold="0 failed imports", unit="modules",
                     message="; ".join(problems) or f"{len(versions)} modules import",
                     versions=versions)
