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

ck, sync = Path(sys.argv[1]), Path(sys.argv[2])
tid = sys.argv[3] if len(sys.argv) > 3 else os.environ["HPCML_FARM_TASK_ID"]

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
    assert out[1].startswith("refused: ") and "belongs to task 0 of the farm" in out[1], out[1]
    assert out[1].count("\n") == 1
    rec = ends(farm)
    assert rec[(0, 1)]["outcome"] == "ok" and rec[(1, 1)]["exit_code"] == 2 and p.returncode == 1
    assert Checkpointer(ck, read_only=True).load_latest()[1] == 11        # task 0's, not pruned


RANK = '''
import os, sys
import numpy as np
from hpcml.ckpt import Checkpointer
c = Checkpointer(sys.argv[1])
print("resumed at", c.load_latest()[1], flush=True)
if os.environ["HPCML_FARM_ATTEMPT"] == "1":
    c.save({"w": np.zeros(2)}, 3)
    c.wait()
    os._exit(9)                              # the attempt fails, its owner record stays
c.close()
'''
ELSEWHERE = ("import json, sys; p = sys.argv[1] + '/.owner'; r = json.load(open(p)); r['host'] = 'another-node'; "
             "json.dump(r, open(p, 'w'))")


def test_the_retry_of_a_task_whose_hpcml_run_failed_resumes_on_another_node(tmp_path):
    """The rank of an ``hpcml run`` in a farm task (no SLURM_* in a local run's ranks) is still
    that task: attempt 2, on another node (the record's host rewritten), takes over from
    attempt 1 that the farm ended (was: 'may still run (it cannot be checked from here)')."""
    rank, ck = tmp_path / "rank.py", tmp_path / "ck"
    rank.write_text(RANK)
    py = sys.executable
    cmd = (f"export SLURM_JOB_ID=99 HPCML_FARM_JOB_ID=99 PATH={Path(py).parent}; "
           f"if [ $HPCML_FARM_ATTEMPT = 2 ]; then {py} -c \"{ELSEWHERE}\" {ck}; fi; "
           f"{py} -m hpcml run --no-report --dir {tmp_path}/run$HPCML_FARM_ATTEMPT -- {py} {rank} {ck}")
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(cmd)], {"retries": 1, "backoff": 0.1})
    p = hpcml("farm", "run", farm, "--slots", "1")
    logs = [(tmp_path / f"run{a}" / "logs" / f"rank-00000.{s}").read_text() for a in (1, 2) for s in ("out", "err")]
    assert p.returncode == 0, p.stderr + str(logs)
    assert logs[0] == "resumed at None\n" and logs[2] == "resumed at 3\n", logs


def test_two_hpcml_runs_at_once_in_one_task_are_two_owners(tmp_path):
    """One attempt, two ``hpcml run`` at once on one directory: the second is refused (was:
    the same attempt token, so it counted as the first and wrote beside it)."""
    user, ck, sync = tmp_path / "user.py", tmp_path / "ck", tmp_path / "sync"
    user.write_text(USER)
    sync.mkdir()
    py = sys.executable
    run = f"{py} -m hpcml run --no-report --dir {tmp_path}/run"
    cmd = (f"export SLURM_JOB_ID=99 HPCML_FARM_JOB_ID=99 PATH={Path(py).parent}; "
           f"{run}0 -- {py} {user} {ck} {sync} 0 & {run}1 -- {py} {user} {ck} {sync} 1; wait")
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(cmd)], {"retries": 0})
    hpcml("farm", "run", farm, "--slots", "1")
    out = [(tmp_path / f"run{r}" / "logs" / "rank-00000.out").read_text() for r in (0, 1)]
    assert out[0] == "resumed at None\n" and out[1].startswith("refused: "), out
    assert Checkpointer(ck, read_only=True).load_latest()[1] == 11
