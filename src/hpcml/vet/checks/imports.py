"""Python modules the application imports, importable on this node (a broken venv or a
missing shared library shows up here, not 20 minutes into the job)."""

from __future__ import annotations

import importlib

from pydantic import BaseModel, ConfigDict, Field

from hpcml.vet.checks.base import Check, CheckReport, judge


class ImportsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    modules: list[str] = Field(min_length=1)


class ImportsCheck(Check[ImportsParams]):
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
