"""Names a job logged are its own words, printed as text: never as Rich markup (``[/x]``
ended ``observe report`` with a traceback, ``[link=...]`` made a hyperlink, ``[green]...``
faked a verdict) nor as terminal control (an escape sequence cleared the screen, a newline
added a line that read as a finding). A real job logs them through ``hpcml.observe``;
``observe report`` and ``hpcml run``'s summary print them with colours forced on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TRAIN = r'''
import hpcml.observe as observe
for step in range(3):
    with observe.section("step"):
        pass
    observe.log(**{"[/oops]": 1.0, "[link=https://evil.example/]loss": 2.0, "[green]all healthy[/green]": 3.0,
                   "loss\x1b[2J\x1b]0;PWNED\x07\rFAKE": 4.0, "x\n-> forged finding": 5.0}, step=step)
'''
CONTROL = ("\x1b]", "\x1b[2J", "\x07", "\r")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(FORCE_COLOR="1", COLUMNS="400")
    return env


def _hpcml(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=180)


def _printed_as_text(out: str) -> None:
    for c in CONTROL:
        assert c not in out, (c, out)
    assert "evil.example/]loss" in out and "[/oops]" in out and "[green]all healthy[/green]" in out, out
    assert not any(line.lstrip().startswith("-> forged") for line in out.splitlines()), out


def test_observe_report_prints_hostile_metric_names_as_text(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    rec = _hpcml("observe", "record", "--dir", "obs", "--", sys.executable, "train.py", cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    out = _hpcml("observe", "report", "obs", cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    _printed_as_text(out.stdout)


def test_hpcml_run_s_summary_prints_hostile_metric_names_as_text(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    run = _hpcml("run", "--ntasks", "1", "--dir", "job", "--gpu-metrics", "none", "--", sys.executable, "train.py",
                 cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    _printed_as_text(run.stdout + run.stderr)
    again = _hpcml("report", "job", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    _printed_as_text(again.stdout)
