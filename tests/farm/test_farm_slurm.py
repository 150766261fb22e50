"""``hpcml farm run`` in batch jobs on the real 2-node local cluster (n1, n2): the agents
start through srun, one per node; "exactly once" is counted from a side file each task
appends to (see farmtools.assert_exactly_once)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.farm import store
from hpcml.farm.lease import Liveness
from hpcml.farm.model import TaskSpec
from tests.farm.farmtools import ROOT, assert_exactly_once, count_ends, ends, side_lines, side_task, wait_for
from tests.slurmjobs import run_job, submit, wait

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
            "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def _farm(tmp_path: Path, commands: list[str], **settings) -> Path:
    farm = tmp_path / "farm"
    store.create(farm, [TaskSpec(c) for c in commands], settings)
    return farm


def test_200_task_sweep_on_two_nodes_runs_every_task_once(env, tmp_path):
    """Every task exactly once, counted by what the tasks appended, by at most the
    allocation's four slots (2 nodes x 2). Which worker got how many tasks is the machine's
    timing (a slot whose srun started late may find none left): not asserted."""
    side = tmp_path / "side"
    (tmp_path / "s.yaml").write_text(f'command: "sleep 0.1; echo {{i}} $HPCML_FARM_ATTEMPT >> {side}"\n'
                                     "product: {i: [%s]}\n" % ", ".join(map(str, range(200))))
    out = run_job("#!/bin/bash\nhpcml farm create farm s.yaml && hpcml farm run farm; echo rc=$?\n", tmp_path, env,
                  timeout=180, tasks_per_node=2)
    assert "rc=0" in out, out
    farm = tmp_path / "farm"
    assert_exactly_once(farm, side, 200)
    assert len(side_lines(side)) == 200
    assert {e["node"] for e in ends(farm).values()} <= {"n1", "n2"}
    assert len({e["worker"] for e in ends(farm).values()}) <= 4                # 2 nodes x 2 slots at most


def test_kill_9_of_the_coordinator_then_a_new_allocation_finishes_exactly_once(env, tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before="sleep 0.3; ")] * 60)
    job = submit(f"#!/bin/bash\nhpcml farm run {farm} & echo $! > coord.pid; wait\n", tmp_path, env,
                 tasks_per_node=2)
    wait_for(lambda: count_ends(farm) >= 8, 120, "tasks done in the first allocation")
    os.kill(int((tmp_path / "coord.pid").read_text()), signal.SIGKILL)
    wait(job, env, timeout=60)                     # the batch script ends, and with it the allocation
    first = side_lines(side)
    assert len(first) < 60
    out = run_job(f"#!/bin/bash\nhpcml farm run {farm}; echo rc=$?\n", tmp_path, env, timeout=180, tasks_per_node=2)
    assert "rc=0" in out, out
    assert_exactly_once(farm, side, 60)
    assert any(e["outcome"] == "lost" for e in ends(farm).values())
    assert len({e["job"] for e in ends(farm).values() if e["outcome"] == "ok"}) == 2


def test_two_allocations_work_on_one_farm_at_once(env, tmp_path):
    side = tmp_path / "side"
    farm = _farm(tmp_path, [side_task(side, before="sleep 0.1; ")] * 120)
    jobs = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        jobs.append((submit(f"#!/bin/bash\nhpcml farm run {farm} --slots 2; echo rc=$?\n", d, env, nodes=1), d))
    for job, d in jobs:
        wait(job, env, timeout=180)
        assert "rc=0" in (d / "job.out").read_text(), (d / "job.out").read_text()
    assert_exactly_once(farm, side, 120)
    by_job = {e["job"] for e in ends(farm).values() if e["outcome"] == "ok"}
    assert by_job == {jobs[0][0], jobs[1][0]}      # both allocations took tasks


def test_retries_and_a_dependency_chain(env, tmp_path):
    order = tmp_path / "order"
    (tmp_path / "s.yaml").write_text(f"""
retries: 2
backoff: 0.1
tasks:
  - {{group: prep, command: "echo prep >> {order}"}}
  - group: train
    after: [prep]
    command: 'test "$HPCML_FARM_ATTEMPT" -ge 2 || exit 3; echo train{{k}} >> {order}'
    product: {{k: [1, 2, 3, 4]}}
  - {{group: eval, after: [train], command: "echo eval >> {order}"}}
""")
    out = run_job("#!/bin/bash\nhpcml farm create farm s.yaml && hpcml farm run farm --node-failures 0; echo rc=$?\n",
                  tmp_path, env, timeout=180, tasks_per_node=2)
    assert "rc=0" in out, out
    lines = order.read_text().split()
    assert lines[0] == "prep" and sorted(lines[1:5]) == ["train1", "train2", "train3", "train4"]
    assert lines[5:] == ["eval"]
    rec = ends(tmp_path / "farm")
    assert all(rec[(t, 1)]["outcome"] == "failed" and rec[(t, 1)]["exit_code"] == 3 and
               rec[(t, 2)]["outcome"] == "ok" for t in range(1, 5))


def test_one_gpu_per_worker_on_each_node(env, tmp_path):
    side = tmp_path / "gpus"
    farm = _farm(tmp_path, [f"sleep 0.2; echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES >> {side}"] * 40)
    out = run_job(f"#!/bin/bash\nhpcml farm run {farm} --gpus 2; echo rc=$?\n", tmp_path, env, timeout=180)
    assert "rc=0" in out, out
    seen = [tuple(line.split()) for line in side.read_text().splitlines()]
    assert len(seen) == 40 and all(len(s) == 2 for s in seen)            # one GPU visible to each task
    assert set(seen) == {("n1", "0"), ("n1", "1"), ("n2", "0"), ("n2", "1")}


def test_a_claim_of_an_allocation_that_ended_is_free_at_once(env, tmp_path):
    """An owner on another host whose Slurm job is over is dead without waiting for its lease."""
    job = submit("#!/bin/bash\ntrue\n", tmp_path, env, nodes=1)
    wait(job, env)
    farm = _farm(tmp_path, ["true"])
    wid = "far.x.1.abc"
    (farm / "workers" / wid).write_text(json.dumps({"worker": wid, "host": "not-" + socket.gethostname(),
                                                    "pid": 1, "job": job}))
    assert Liveness(farm, lease=3600, job=None).is_dead(wid)
    (farm / "workers" / wid).write_text(json.dumps({"worker": wid, "host": "not-" + socket.gethostname(),
                                                    "pid": 1, "job": None}))
    assert not Liveness(farm, lease=3600, job=None).is_dead(wid)          # no job: only the lease can tell


TRAIN = """\
import json, os, sys
from hpcml import observe
from hpcml.ckpt import Checkpointer
from hpcml.data import ShardDataset
shards, ck, out = sys.argv[1:]
keys = [s["__key__"] for s in ShardDataset(shards, block_bytes=100_000, window=4)]
with Checkpointer(ck, max_write_rate=None, commit_timeout=20) as c:   # rank 0 of 2 would wait 20 s, then fail
    for step in (1, 2):
        c.save({"seen": len(keys)}, step)
        c.wait()
observe.log(2, samples=len(keys))
observe.flush()
names = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "PMI_RANK", "RANK")
with open(out, "w") as f:
    json.dump({"keys": keys, "env": {n: os.environ.get(n) for n in names}}, f)
"""


def test_a_sweep_task_is_its_own_job_and_an_hpcml_run_in_one_reaches_farm_results(env, tmp_path):
    """Farm tasks under a 2-node farm (each worker is one task of an srun step) read the whole
    dataset, commit their checkpoints and are observe's rank 0 of 1; a task that is an
    ``hpcml run`` records under the farm (its Slurm job id kept) and shows in farm results."""
    from hpcml.ckpt import Checkpointer
    from hpcml.observe.store import read_job
    from hpcml.run.farmresults import collect
    from tests.data.gen import make_shards
    shards = make_shards(tmp_path / "data", samples=79, target=200_000)[1]
    (tmp_path / "train.py").write_text(TRAIN)
    runs = " && ".join(f"hpcml run --ntasks 1 --no-report -- python -c "
                       f"'from hpcml import observe; observe.log(3, {m}); observe.flush()'"
                       for m in ("val_loss=0.25", "val_acc=0.75"))                # two runs in one task
    farm = _farm(tmp_path, [f"python {tmp_path}/train.py {shards} {tmp_path}/ck{i} {tmp_path}/out{i}"
                            for i in range(4)] + [runs])
    job = submit(f"#!/bin/bash\nexport PMI_RANK=7 RANK=1 WORLD_SIZE=2\nhpcml farm run {farm} --time-limit 120; "
                 "echo rc=$?\n", tmp_path, env, tasks_per_node=1)
    wait(job, env, timeout=300)
    out = (tmp_path / "job.out").read_text()
    assert "rc=0" in out, out + "".join(p.read_text() for p in (farm / "logs").glob("*.err"))
    rows = {r["id"]: r for r in collect(farm)["rows"]}
    for i in range(4):
        seen = json.loads((tmp_path / f"out{i}").read_text())
        assert len(seen["keys"]) == len(set(seen["keys"])) == 79             # the whole dataset, once
        state, step = Checkpointer(tmp_path / f"ck{i}", read_only=True).load_latest()
        assert (step, state) == (2, {"seen": 79})                              # committed
        assert not list((tmp_path / f"ck{i}").glob(".partial*"))
        assert set(read_job(farm / "observe" / f"{i}.1").ranks) == {0}        # rank 0 of 1
        assert rows[i]["metrics"] == {"samples": 79.0}
        assert seen["env"]["SLURM_JOB_ID"] == job and seen["env"]["SLURMD_NODENAME"] in ("n1", "n2")
        assert seen["env"]["SLURM_STEP_ID"] is not None                        # inside the farm's step
        assert [seen["env"][n] for n in ("SLURM_PROCID", "SLURM_NTASKS", "PMI_RANK", "RANK")] == [None] * 4
    assert {e["node"] for e in ends(farm).values()} == {"n1", "n2"}
    assert rows[4]["state"] == "ok" and rows[4]["metrics"] == {"val_acc": 0.75, "val_loss": 0.25}
    for name in ("4.1", "4.1-1"):
        run = json.loads((farm / "runs" / name / "run.json").read_text())
        assert run["job_id"] == job and run["mode"] == "local"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("hpcml-")]   # the task's cwd stays clean


def test_status_after_scancel_shows_the_ended_allocations_tasks_lost_without_eta(env, tmp_path, monkeypatch):
    """Seen from a login node (another host: no pid to check), an attempt whose allocation
    ended is lost at once, as ``hpcml run`` judges its owner, not running until a lease."""
    from hpcml.farm.status import summarize
    farm = _farm(tmp_path, ["true", "true", "sleep 600", "sleep 600"])
    job = submit(f"#!/bin/bash\nhpcml farm run {farm}\n", tmp_path, env, tasks_per_node=1)
    wait_for(lambda: summarize(farm)["counts"]["running"] == 2 and summarize(farm)["counts"]["ok"] == 2,
             120, "two tasks done, two running")
    subprocess.run(["scancel", job], env=env, timeout=30, check=True)
    wait(job, env, timeout=120)
    monkeypatch.setattr(socket, "gethostname", lambda: "login1")
    doc = summarize(farm)
    # lost (claimed, its allocation over); or, where the agent's respawned worker got to
    # record the attempt lost before the job's end killed it too, waiting to be rerun
    n = doc["counts"]
    assert n["running"] == 0 and n["lost"] + n["retrying"] + n["pending"] == 2 and n["ok"] == 2, n
    assert doc["running"] == [] and doc["eta_s"] is None and doc["workers"] == 0, doc
