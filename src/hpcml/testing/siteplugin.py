"""Site packages laid out on disk the way pip installs one (a ``*.dist-info`` with
``entry_points.txt`` beside the package), for the tests and benchmarks that use the
documented plug-in paths rather than a hook inside hpcml (CONTRIBUTING's recipes).

``write_distribution`` writes any such package (tests/test_contributing.py builds one from
each of CONTRIBUTING's recipes, tests/test_registry.py its fake site); ``install`` writes
the one below, with an ``hpcml.checks`` and an ``hpcml.run_backends`` entry point.

Its launcher backend, ``site-local``, runs the ranks on this host as ``local`` does and
says so in its own words; it runs only when named (``HPCML_RUN_BACKEND=site-local``).

Its check, ``marked-bad``, fails on the nodes listed (whitespace-separated) in the file its
``nodes_file`` parameter names. It names its parameters' model as a string, so a node's
worker runs it without importing pydantic, as a site's own check should.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def write_distribution(site: Path, name: str, version: str, entry_points: Mapping[str, Mapping[str, str]],
                       files: Mapping[str, str]) -> Path:
    """Install the distribution ``name`` ``version`` into the directory ``site`` as pip would
    (put ``site`` on sys.path or PYTHONPATH): ``files`` (paths relative to ``site`` -> text)
    and ``NAME-VERSION.dist-info`` with METADATA and ``entry_points.txt`` (group -> entry
    name -> ``"module:attr"``, what ``[project.entry-points."GROUP"]`` declares). Returns ``site``."""
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text("\n".join(
        f"[{group}]\n" + "".join(f"{ep} = {target}\n" for ep, target in eps.items())
        for group, eps in entry_points.items()))
    return site


def install(site: Path) -> Path:
    """Write the package into ``site`` (put it on PYTHONPATH); returns ``site``."""
    return write_distribution(
        site, "hpcml-sitecheck", "1.0",
        {"hpcml.checks": {TYPE: "hpcml_sitecheck:MarkedBad"},
         "hpcml.run_backends": {BACKEND: "hpcml_sitecheck.backend:SiteLocal"}},
        {"hpcml_sitecheck/__init__.py": CHECK, "hpcml_sitecheck/params.py": PARAMS,
         "hpcml_sitecheck/backend.py": BACKEND_MODULE})
