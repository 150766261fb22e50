"""Data loading judged cold or warm (issue 66 item 5): the same data-bound script, run
twice under ``hpcml run``. The first run reads its file after it was evicted from the page
cache (``posix_fadvise(DONTNEED)``, as after a copy to a fresh node); the second reads it
from the page cache. Each rank's reads are counted by the recorder from ``/proc/PID/io``
(``hpcml.samplers.host``); the report's data finding says which run read cold, and does
not advise packing data that a warm run would not wait for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """\
import os, sys, time
from hpcml import observe
path, chunk = sys.argv[1], 4 << 20
with open(path, "rb", buffering=0) as f:
    for step in range(8):
        with observe.section("step", step=step):
            with observe.section("dataload"):
                f.seek((step % 8) * chunk)
                f.read(chunk)
                time.sleep(0.2)
            time.sleep(0.05)
time.sleep(2)          # the recorder samples the last counts
"""


def _run(tmp: Path, name: str, data: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--dir", name, "--no-report", "--",
                        sys.executable, "load.py", str(data)], cwd=tmp, env=env, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", name, "--json"], cwd=tmp, env=env,
                         capture_output=True, text=True, timeout=240)
    assert rep.returncode == 0, rep.stderr
    return next(f for f in json.loads(rep.stdout)["findings"] if f["kind"] == "data_bound")


def test_the_first_cold_run_and_the_warm_second_are_told_apart(tmp_path):
    (tmp_path / "load.py").write_text(SCRIPT)
    data = tmp_path / "data.bin"
    with open(data, "wb") as f:
        f.write(os.urandom(32 << 20))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(data, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)        # out of the page cache: a cold read
    finally:
        os.close(fd)
    cold = _run(tmp_path, "cold", data)
    assert "its reads were cold: " in cold["message"] and "run again before packing" in cold["advice"], cold
    warm = _run(tmp_path, "warm", data)
    assert "its reads were warm: " in warm["message"] and "hpcml data" in warm["advice"], warm
