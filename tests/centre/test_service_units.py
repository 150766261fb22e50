"""The systemd units of examples/centre/ (docs/centre.md, "Running the centre"): systemd's
own ``systemd-analyze verify`` finds nothing wrong in them, and the collector's command line
in the unit starts a real collector (its database and token files swapped for the test's)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "examples" / "centre").glob("hpcml-*.*"))
HPCML = "/opt/hpcml/venv/bin/hpcml"


def _here(text: str) -> str:
    """The unit with this environment's hpcml, which verify needs to find."""
    return text.replace(HPCML, str(Path(sys.executable).parent / "hpcml"))


def test_the_units_verify_clean(tmp_path):
    if shutil.which("systemd-analyze") is None:
        needs.missing("systemd", "systemd-analyze is not installed")
    assert {u.name for u in UNITS} == {"hpcml-collector.service", "hpcml-handle.service", "hpcml-handle.timer"}
    for unit in UNITS:
        (tmp_path / unit.name).write_text(_here(unit.read_text()))
    p = subprocess.run(["systemd-analyze", "verify", *[str(tmp_path / u.name) for u in UNITS]],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and not p.stderr.strip() and not p.stdout.strip(), (p.stdout, p.stderr)


def test_the_collectors_command_line_starts_a_collector(tmp_path):
    unit = (ROOT / "examples" / "centre" / "hpcml-collector.service").read_text()
    argv = shlex.split(next(ln for ln in unit.splitlines() if ln.startswith("ExecStart=")).split("=", 1)[1])
    assert argv[0] == HPCML
    swap = {"--db": f"sqlite:///{tmp_path}/c.db", "--port": "0", "--token-file": str(tmp_path / "t"),
            "--job-token-file": str(tmp_path / "j")}
    (tmp_path / "t").write_text("write-token-0123456789abcdef\n")
    (tmp_path / "j").write_text("job-token-0123456789abcdef\n")
    args = [swap.get(argv[i - 1], a) for i, a in enumerate(argv) if i > 0]
    proc = subprocess.Popen([sys.executable, "-m", "hpcml", *args, "--slurm-check", "off"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PGPASSFILE": str(tmp_path / "none")})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line + (proc.stderr.read() if proc.stderr else "")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


@pytest.mark.parametrize("unit", [u for u in UNITS if u.suffix == ".service"], ids=lambda u: u.name)
def test_every_unit_runs_hpcml_by_absolute_path(unit):
    start = next(ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart="))
    assert start.split("=", 1)[1].startswith(HPCML + " centre ")
