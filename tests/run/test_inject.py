"""The ``sitecustomize`` ``hpcml run`` puts first on each rank's PYTHONPATH
(``hpcml.run.inject``): the site's own still runs, a failing one does not stop the
program, the same directory twice (or through a symlink) is not loaded again, and a
process without torch.distributed gets no Flight Recorder dump. The dump itself on a real
gloo job: tests/run/test_watch.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import hpcml.run.inject as inject

HERE = os.path.dirname(inject.__file__)


def python(code: str, pythonpath: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=60)


def test_the_sites_own_sitecustomize_runs_too_and_once(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nMARK = 'site-ok'\nprint('site', flush=True)\n")
    (tmp_path / "link").symlink_to(HERE)
    p = python("import sitecustomize; print(sitecustomize.MARK)", [str(tmp_path / "link"), HERE, str(site)])
    assert p.returncode == 0 and p.stdout.split() == ["site", "site-ok"], p


def test_a_failing_site_sitecustomize_is_said_and_the_program_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("raise RuntimeError('boom')\n")
    p = python("print('ran')", [HERE, str(tmp_path)])
    assert p.returncode == 0 and p.stdout == "ran\n"
    assert "the site's sitecustomize failed: RuntimeError: boom" in p.stderr


def test_no_dump_from_a_process_without_torch_distributed(tmp_path):
    observe = tmp_path / "observe"
    (observe / "beat").mkdir(parents=True)
    code = ("import json, time, os\n"
            f"open({str(observe / 'beat' / 'snapshot.json')!r}, 'w').write(json.dumps({{'id': 1}}))\n"
            "time.sleep(1.5)\nprint('done')\n")
    start = time.time()
    p = python(code, [HERE], {"HPCML_RUN_SNAPSHOT_DIR": str(observe)})
    assert p.returncode == 0 and p.stdout == "done\n" and time.time() - start < 30
    assert not (observe / "flight-recorder").exists()
    assert json.loads((observe / "beat" / "snapshot.json").read_text()) == {"id": 1}
    assert Path(HERE, "sitecustomize.py").is_file()
