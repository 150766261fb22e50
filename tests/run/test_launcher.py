"""The launcher before its command starts (hpcml.run.launcher): a TERM while it vets ends
the job said so, every check it started is stopped, and a HUP inherited ignored (``nohup``)
stays ignored. Local vetting (no Slurm): its checks are forked from the launcher itself;
the Slurm twin is tests/run/test_run_slurm.py's scancel while vetting."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.run.test_ownership import PY, WAIT, _env

ROOT = Path(__file__).resolve().parents[2]
HANG = "name: hang\ndeadline: 300 s\nevals:\n  - {name: hang, type: tests.plugins.testchecks.Hang, seconds: 600}\n"


def _vetting(tmp_path: Path, ignore_hup: bool = False) -> subprocess.Popen:
    """``hpcml run --vet`` of a hanging check, once its vetting runs."""
    (tmp_path / "hang.yaml").write_text(HANG)
    env = {**_env(), "PYTHONPATH": str(ROOT)}
    hup = signal.SIG_IGN if ignore_hup else signal.SIG_DFL       # not as the suite's own (nohup: ignored)
    pre = lambda: signal.signal(signal.SIGHUP, hup)                       # noqa: E731
    p = subprocess.Popen([PY, "-m", "hpcml", "run", "--vet", "hang.yaml", "--dir", "job", "--",
                          "touch", str(tmp_path / "started")], cwd=tmp_path, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=pre)
    end = time.monotonic() + WAIT
    while not _checks(p.pid) and time.monotonic() < end and p.poll() is None:
        time.sleep(0.1)
    assert _checks(p.pid), p.communicate(timeout=5) if p.poll() is not None else "no check started"
    return p


def _checks(pid: int) -> list[psutil.Process]:
    """The launcher's forked checks (hpcml.vet.isolate: its own command line, another pid)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _left(cmdline_part: str) -> list[int]:
    return [q.pid for q in psutil.process_iter(["cmdline"]) if cmdline_part in " ".join(q.info["cmdline"] or [])]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["term", "hup"])
def test_a_signal_while_vetting_ends_the_job_said_so_and_stops_every_check(tmp_path, sig):
    p = _vetting(tmp_path)
    checks = _checks(p.pid)
    try:
        p.send_signal(sig)
        _, err = p.communicate(timeout=WAIT)
    finally:
        p.kill()
    assert p.returncode == 128 + sig, err
    gone, alive = psutil.wait_procs(checks, timeout=10)
    assert not alive, [c.pid for c in alive]
    assert not _left(str(tmp_path / "started"))
    assert not (tmp_path / "started").exists()
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    name = signal.Signals(sig).name
    assert run["signals_forwarded"] == [name] and run["exit_code"] == 128 + sig, run
    text = subprocess.run([PY, "-m", "hpcml", "report", "job"], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=WAIT).stdout
    assert f"hpcml run got {name} before the command started: no rank ran; exit code {128 + sig}" in text, text


def test_a_hup_inherited_ignored_stays_ignored_while_vetting(tmp_path):
    """``nohup hpcml run``: the terminal's hangup is not a stop (it was ignored before the
    launcher's handlers, and stays so); TERM still is."""
    p = _vetting(tmp_path, ignore_hup=True)
    try:
        p.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert p.poll() is None, p.communicate(timeout=5)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=WAIT)
    finally:
        p.kill()
    assert p.returncode == 143, err
    assert json.loads((tmp_path / "job" / "run.json").read_text())["signals_forwarded"] == ["SIGTERM"]
