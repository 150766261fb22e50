"""A site package with an ``hpcml.checks`` and an ``hpcml.run_backends`` entry point, laid out
on disk the way pip installs one (a ``*.dist-info`` with ``entry_points.txt`` beside the
package), for the tests and benchmarks that use the documented plug-in paths rather than a
hook inside hpcml (CONTRIBUTING's recipes).

Its launcher backend, ``site-local``, runs the ranks on this host as ``local`` does and
says so in its own words; it runs only when named (``HPCML_RUN_BACKEND=site-local``).

Its check, ``marked-bad``, fails on the nodes listed (whitespace-separated) in the file its
``nodes_file`` parameter names. It names its parameters' model as a string, so a node's
worker runs it without importing pydantic, as a site's own check should.
"""

from __future__ import annotations

from pathlib import Path

CHECK = '''"""A site's check: fails on the nodes listed in a file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:
    from hpcml_sitecheck.params import MarkedParams  # noqa: F401


class MarkedBad(Check["MarkedParams"]):
    params_module = "hpcml_sitecheck.params"
    default_timeout = 5.0

    def run(self) -> CheckReport:
        with open(self.params.nodes_file) as f:
            bad = self.ctx.node in f.read().split()
        return judge(not bad, int(bad), threshold="not marked",
                     message="marked bad" if bad else "not marked")
'''
PARAMS = '''from pydantic import BaseModel, ConfigDict


class MarkedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes_file: str
'''
BACKEND_MODULE = '''"""A site's launcher backend: this host's tasks, as hpcml's local backend runs them."""

from __future__ import annotations

from typing import Any, ClassVar

from hpcml.run.backends import Local, Plan


class SiteLocal(Local):
    mode: ClassVar[str] = "site-local"
    spans_nodes: ClassVar[bool] = False

    @classmethod
    def applies(cls, allocation: Any, in_farm: bool) -> bool:
        return False                      # only when named

    def where(self, plan: Plan) -> str:
        return f"{plan.ntasks} site tasks here"
'''
#: the check's name in a protocol's ``type:``
TYPE = "marked-bad"
#: the launcher backend's name (``HPCML_RUN_BACKEND``)
BACKEND = "site-local"


def install(site: Path) -> Path:
    """Write the package into ``site`` (put it on PYTHONPATH); returns ``site``."""
    pkg = site / "hpcml_sitecheck"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(CHECK)
    (pkg / "params.py").write_text(PARAMS)
    (pkg / "backend.py").write_text(BACKEND_MODULE)
    dist = site / "hpcml_sitecheck-1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hpcml-sitecheck\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[hpcml.checks]\n{TYPE} = hpcml_sitecheck:MarkedBad\n\n"
                                           f"[hpcml.run_backends]\n{BACKEND} = hpcml_sitecheck.backend:SiteLocal\n")
    return site
