"""Two tasks of one farm allocation pointed at one checkpoint directory, through a real
``hpcml farm run`` (real workers, real task processes): they share the Slurm job id and its
restart count, so only the farm's task identity tells them apart."""

from __future__ import annotations

import sys
from pathlib import Path

from hpcml.ckpt import Checkpointer
from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from tests.farm.farmtools import ends, hpcml

USER = '''
import os, sys, time
from pathlib import Path
import numpy as np
from hpcml.ckpt import Checkpointer
from hpcml.errors import UsageError

ck, sync, tid = Path(sys.argv[1]), Path(sys.argv[2]), os.environ["HPCML_FARM_TASK_ID"]

def until(name):
    end = time.monotonic() + 120
    while not (sync / name).exists() and time.monotonic() < end:
        time.sleep(0.05)

if tid == "1":
    until("0-saved")
try:
    c = Checkpointer(ck, keep=1)
except UsageError as exc:
    print("refused:", exc, flush=True)
    (sync / "1-done").touch()
    sys.exit(2)
print("resumed at", c.load_latest()[1], flush=True)
c.save({"w": np.zeros(4)}, 11 if tid == "0" else 1)
c.wait()
(sync / f"{tid}-saved").touch()
if tid == "0":
    until("1-done")
c.close()
(sync / f"{tid}-done").touch()
'''


def test_a_second_task_of_the_same_allocation_is_refused_not_resumed(tmp_path):
    """Was: task 1 (same SLURM_JOB_ID) counted as the owner, resumed from task 0's step 11
    and pruned it with its own step 1."""
    user, ck, sync = tmp_path / "user.py", tmp_path / "ck", tmp_path / "sync"
    user.write_text(USER)
    sync.mkdir()
    # one allocation (job 99) as the worker would see it; no Slurm client on PATH: the pid tells
    cmd = (f"SLURM_JOB_ID=99 HPCML_FARM_JOB_ID=99 PATH={Path(sys.executable).parent} "
           f"{sys.executable} {user} {ck} {sync}")
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(cmd), TaskSpec(cmd)], {"retries": 0})
    p = hpcml("farm", "run", farm, "--slots", "2", "--node-failures", "0")
    out = {t: (farm / "logs" / f"{t}.1.out").read_text() for t in (0, 1)}
    assert out[0] == "resumed at None\n", out[0] + (farm / "logs" / "0.1.err").read_text()
    assert out[1].startswith("refused: ") and "in use by another job" in out[1], out[1]
    assert out[1].count("\n") == 1
    rec = ends(farm)
    assert rec[(0, 1)]["outcome"] == "ok" and rec[(1, 1)]["exit_code"] == 2 and p.returncode == 1
    assert Checkpointer(ck, read_only=True).load_latest()[1] == 11        # task 0's, not pruned
