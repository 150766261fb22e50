"""Claims and ends under a full disk: the farm's directory on a small tmpfs that the tasks
themselves fill. The run stops with one line naming the path (exit 1, no traceback), no
attempt is left "running", and no temp file of a claim or end is left behind."""

from __future__ import annotations

import json
import os

from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from tests.farm.farmtools import hpcml


def test_a_full_disk_stops_the_farm_with_one_line_and_leaves_nothing_running(small_disk):
    farm = small_disk / "farm"
    fill = "head -c 1500000 /dev/zero > $HPCML_FARM_DIR/../fill.$HPCML_FARM_TASK_ID; true"
    store.create(farm, [TaskSpec(fill)] * 40, {"retries": 0})
    p = hpcml("farm", "run", farm, "--slots", "2", "--node-failures", "0")
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("hpcml farm run: error: ") and "No space left on device" in lines[0], lines[0]
    assert str(farm) in lines[0]
    st = json.loads(hpcml("farm", "status", farm, "--json").stdout)
    assert st["counts"]["running"] == 0 and not st["running"], st["counts"]
    assert 0 < st["counts"]["ok"] < 40
    temps = [f for sub in ("claims", "ends", "workers") for f in os.listdir(farm / sub) if f.startswith(".")]
    assert not temps, temps


def test_create_on_a_full_disk_is_one_line_leaves_nothing_and_the_next_create_works(small_disk, tmp_path):
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("".join(f"echo {i}\n" for i in range(300)))
    fill = small_disk / "fill"
    with open(fill, "wb") as f:                     # the disk full to the last block
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    farm = small_disk / "new" / "farm"
    p = hpcml("farm", "create", farm, tasks)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "No space left on device" in lines[0] and str(farm) in lines[0], lines[0]
    assert sorted(os.listdir(small_disk)) == ["fill"]      # no directory, no empty create.lock
    fill.unlink()
    p = hpcml("farm", "create", farm, tasks)
    assert p.returncode == 0, p.stderr
    assert len((farm / "tasks.jsonl").read_text().splitlines()) == 300


def test_an_end_record_killed_at_random_is_whole_or_absent(tmp_path):
    """Issue 61: a worker killed with SIGKILL while it writes a task's end record (40 kills
    at random moments) leaves no temporary file in ends/, and every end there is whole."""
    from hpcml.farm import claim
    from hpcml.farm.model import ENDS
    from tests.killloop import kill_loop, left

    (tmp_path / ENDS).mkdir()
    pad = "x" * 4_000_000                              # a long record: the kill lands mid-write

    def work(i):
        claim.finish(tmp_path, os.getpid(), i + 1, {"outcome": "ok", "note": pad})
    def after():
        assert not [n for n in left(tmp_path / ENDS) if n.startswith(".")]
    k = kill_loop(work, after=after)
    assert k.killed == 40 and k.done > 0, k
    names = left(tmp_path / ENDS)
    assert names and all(not n.startswith(".") for n in names), names
    for n in names:
        assert json.loads((tmp_path / ENDS / n).read_text())["note"] == pad
