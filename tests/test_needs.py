"""The suite's one skip policy (tests/needs.py): a missing requirement fails a test unless
a developer opted out of that one requirement by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
from tests import needs

def test_wants_a_module():
    needs.module("hpcml_no_such_module_xyz")

def test_wants_a_tool():
    needs.tool("hpcml-no-such-tool-xyz", what="xyz-tools")

def test_has_what_it_wants():
    assert needs.module("json").dumps(1) == "1" and needs.tool("sh")
"""


def run(tmp_path: Path, **opt_out: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCML_ALLOW_SKIP_")}
    env.update(opt_out, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), str(tmp_path / "test_probe.py")], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)


def test_a_missing_requirement_fails_and_says_how_to_opt_out(tmp_path):
    p = run(tmp_path)
    assert "2 failed, 1 passed" in p.stdout, p.stdout
    assert "HPCML_ALLOW_SKIP_HPCML_NO_SUCH_MODULE_XYZ=1" in p.stdout and "HPCML_ALLOW_SKIP_XYZ_TOOLS=1" in p.stdout


def test_an_opt_out_skips_that_requirement_only(tmp_path):
    p = run(tmp_path, HPCML_ALLOW_SKIP_XYZ_TOOLS="1")
    assert "1 failed, 1 passed, 1 skipped" in p.stdout, p.stdout
