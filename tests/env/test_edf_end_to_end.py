"""EDF files end to end: a file inheriting from two base environments, run with
``python -m hpcml env run`` (the fast path a job script takes) through real bubblewrap
and podman on the suite's busybox image."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _write_edfs(tmp: Path, image: str) -> tuple[Path, Path, dict[str, str]]:
    data, scratch, edfs = tmp / "data", tmp / "scratch", tmp / "edfs"
    for d in (data, scratch, edfs):
        d.mkdir()
    (data / "input.txt").write_text("dataset\n")
    (edfs / "base.toml").write_text(f'''
image = "{image}"
workdir = "/tmp"
mounts = ["{data}:/data:ro"]
[env]
FROM_BASE = "base"
OVERRIDDEN = "base"
[annotations]
com.example.note = "kept"
''')
    (edfs / "middle.toml").write_text('''
base_environment = "base"
workdir = "/work"
mounts = ["${SCRATCH_DIR}:/mnt"]
[env]
OVERRIDDEN = "middle"
FROM_MIDDLE = "${GREETING:-hello}"
''')
    job = tmp / "job"
    job.mkdir()
    (job / "env.toml").write_text('''
base_environment = ["middle"]
writable = false
[env]
HOST_SECRET = ""
PRICE = "$$5"
''')
    environ = dict(os.environ, EDF_PATH=str(edfs), SCRATCH_DIR=str(scratch), HOST_SECRET="leak")
    return job, scratch, environ


SCRIPT = r'''
echo "pwd=$(pwd) base=$FROM_BASE over=$OVERRIDDEN mid=$FROM_MIDDLE price=$PRICE secret=${HOST_SECRET:-absent}"
echo "data=$(cat /data/input.txt)"
echo x > /data/no 2>/dev/null && echo "ro-mount=writable" || echo "ro-mount=refused"
echo x > /mnt/yes && echo "rw-mount=written"
echo x > /root-write 2>/dev/null && echo "root=writable" || echo "root=refused"
exit 3
'''


@pytest.mark.parametrize("runtime", ["bubblewrap", "podman"])
def test_inherited_edf_runs_with_mounts_env_workdir_and_read_only_root(runtime, request, tmp_path):
    image = request.getfixturevalue(f"{runtime}_image")
    job, scratch, environ = _write_edfs(tmp_path, image)
    proc = subprocess.run([sys.executable, "-m", "hpcml", "env", "run", "--runtime", runtime, "./env.toml",
                           "--", "/bin/sh", "-c", SCRIPT], cwd=job, env=environ, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3, proc.stderr          # the command's exit code
    assert proc.stdout.split("\n")[:5] == [
        "pwd=/work base=base over=middle mid=hello price=$5 secret=absent",
        "data=dataset",
        "ro-mount=refused",
        "rw-mount=written",
        "root=refused",
    ], proc.stderr
    assert (scratch / "yes").read_text() == "x\n"
    assert "Traceback" not in proc.stderr


def test_undefined_variable_is_one_line_exit_2(bubblewrap_image, tmp_path):
    job, _scratch, environ = _write_edfs(tmp_path, bubblewrap_image)
    del environ["SCRATCH_DIR"]
    proc = subprocess.run([sys.executable, "-m", "hpcml", "env", "run", "./env.toml", "--", "true"],
                          cwd=job, env=environ, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "middle.toml" in proc.stderr and "SCRATCH_DIR" in proc.stderr and "mounts" in proc.stderr


def test_bad_arguments_are_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hpcml", "env", "run", "--nope"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
