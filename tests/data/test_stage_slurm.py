"""`hpcml data stage` on the real 2-node local cluster (n1, n2 share this host's /tmp, so the
target is per node through %n): once per node from the batch script and from a step."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from hpcml.data import ShardDataset
from hpcml.data.manifest import load_manifest
from hpcml.data.pack import pack
from hpcml.data.stage import STAMP
from tests.slurmjobs import run_job

ROOT = Path(__file__).parents[2]
STAGE = f"{sys.executable} -m hpcml data stage"
pytestmark = pytest.mark.slurm


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("stage-ds")
    rng = random.Random(7)
    for i in range(240):
        (base / "raw").mkdir(exist_ok=True)
        (base / "raw" / f"s{i:04d}.bin").write_bytes(rng.randbytes(rng.randint(100, 4000)))
        (base / "raw" / f"s{i:04d}.cls").write_text(str(i % 3))
    pack(base / "raw", base / "shards", target_bytes=100 * 1024, jobs=2)
    return base / "shards"


def _all_files(src: Path) -> int:
    return 2 * len(load_manifest(src).shards) + 1


def _check_copy(staged: Path, src: Path) -> None:
    """Every shard is there and matches the manifest's sha256; indexes and manifest identical."""
    m = load_manifest(src)
    for s in m.shards:
        assert hashlib.sha256((staged / s.name).read_bytes()).hexdigest() == s.sha256, s.name
        assert (staged / s.index).read_bytes() == (src / s.index).read_bytes()
    assert (staged / "manifest.json").read_bytes() == (src / "manifest.json").read_bytes()


def _runs(staged: Path, job: str) -> list[dict]:
    return [r for r in json.loads((staged / STAMP).read_text())["runs"] if r["job"] == job]


def _job_id(out: str) -> str:
    return re.search(r"job=(\d+)", out).group(1)


def test_batch_script_stages_once_per_node_and_a_second_job_skips(env, tmp_path, packed):
    local = tmp_path / "local"
    ds = load_manifest(packed).dataset
    script = f"""#!/bin/bash
echo job=$SLURM_JOB_ID
{STAGE} {packed} --to {local}/%n --json > report.json; echo rc=$?
"""
    out = run_job(script, tmp_path, env)
    assert "rc=0" in out, out
    job1, rep = _job_id(out), json.loads((tmp_path / "report.json").read_text())
    assert set(rep["nodes"]) == {"n1", "n2"} and rep["staged"]
    for node in ("n1", "n2"):
        r, staged = rep["nodes"][node], local / node / ds
        assert r["path"] == str(staged) and r["node"] == node
        assert r["files_copied"] == _all_files(packed) and r["files_skipped"] == 0
        assert r["step"] is not None                      # copied by the step the command started
        _check_copy(staged, packed)
        assert [(x["node"], x["copied"]) for x in _runs(staged, job1)] == [(node, _all_files(packed) - 1)]

    (tmp_path / "job.out").unlink()
    script = f"""#!/bin/bash
echo job=$SLURM_JOB_ID
{STAGE} {packed} --to {local}/%n --json > report2.json
DATA=$({STAGE} {packed} --to {local}/%n 2>stage.err); echo "rc=$? data=$DATA"
"""
    out = run_job(script, tmp_path, env)
    job2, rep = _job_id(out), json.loads((tmp_path / "report2.json").read_text())
    assert f"rc=0 data={local}/n1/{ds}" in out, out
    for node in ("n1", "n2"):
        r = rep["nodes"][node]
        assert r["files_copied"] == 0 and r["files_skipped"] == _all_files(packed), r
        assert [x["copied"] for x in _runs(local / node / ds, job2)] == [0, 0]
    err = (tmp_path / "stage.err").read_text()
    assert "n1: up to date" in err and "n2: up to date" in err and "different path on each node" in err


def test_step_with_two_tasks_per_node_copies_once_per_node(env, tmp_path, packed):
    local = tmp_path / "local"
    ds = load_manifest(packed).dataset
    script = f"""#!/bin/bash
echo job=$SLURM_JOB_ID
srun --ntasks-per-node=2 --output=rep-%t.json {STAGE} {packed} --to {local}/%n --json; echo rc=$?
srun --ntasks-per-node=2 --output=path-%t.txt {STAGE} {packed} --to {local}/%n; echo rc=$?
"""
    out = run_job(script, tmp_path, env, tasks_per_node=2)
    assert out.count("rc=0") == 2, out
    job = _job_id(out)
    reps = [json.loads((tmp_path / f"rep-{t}.json").read_text()) for t in range(4)]
    by_node: dict[str, list[dict]] = {}
    for rep in reps:
        ((node, r),) = rep["nodes"].items()
        by_node.setdefault(node, []).append(r)
    assert sorted(by_node) == ["n1", "n2"]
    for node, rs in by_node.items():
        assert sorted(r["files_copied"] for r in rs) == [0, _all_files(packed)], rs
        staged = local / node / ds
        _check_copy(staged, packed)
        runs = _runs(staged, job)
        assert len(runs) == 4 and {r["node"] for r in runs} == {node}     # 2 tasks x 2 steps
        assert sorted(r["copied"] for r in runs) == [0, 0, 0, _all_files(packed) - 1]
    paths = sorted((tmp_path / f"path-{t}.txt").read_text().splitlines()[-1] for t in range(4))
    assert paths == sorted([str(local / "n1" / ds)] * 2 + [str(local / "n2" / ds)] * 2)


def test_bad_shard_names_node_and_file_and_no_room_streams(env, tmp_path, packed):
    src = Path(shutil.copytree(packed, tmp_path / "bad"))
    shard = src / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[-2000] ^= 0x55
    shard.write_bytes(bytes(data))
    script = f"""#!/bin/bash
{STAGE} {src} --to {tmp_path}/local/%n > bad.out 2> bad.err; echo bad-rc=$?
DATA=$({STAGE} {packed} --to {tmp_path}/room/%n --keep-free '1 PB' 2> room.err); echo "room-rc=$? data=$DATA"
"""
    out = run_job(script, tmp_path, env)
    assert "bad-rc=2" in out and f"room-rc=0 data={packed}" in out, out
    errors = (tmp_path / "bad.err").read_text().strip().splitlines()
    assert len(errors) == 1 and re.search(r"error: n[12]: checksum mismatch.*shard-000001.tar", errors[0]), errors
    assert (tmp_path / "bad.out").read_text() == ""
    for node in ("n1", "n2"):
        assert not list((tmp_path / "local" / node).rglob("*shard-000001.tar*"))
    room = (tmp_path / "room.err").read_text()
    assert "n1: not staged, does not fit" in room and "n2: not staged, does not fit" in room
    assert not list((tmp_path / "room").rglob("shard-*"))


def test_default_placement_is_the_doctor_s_and_cleanup_leaves_nothing_after_the_job(env, tmp_path, packed):
    """Issue 29: without --to the copy went to /tmp/hpcml-data-JOB whatever the doctor said,
    and stayed after the job. Now it goes where the doctor advises (RAM: the RAM directory,
    here a tmp directory through HPCML_DATA_RAM_DIR instead of /dev/shm; local disk when
    there is no RAM directory), the job's ranks read it there, and ``hpcml data stage
    --cleanup`` at the end of the batch script leaves nothing of the job on either."""
    ram, disk = tmp_path / "ram", tmp_path / "disk"
    ram.mkdir()
    disk.mkdir()
    read = ("import os, sys; from hpcml.data import ShardDataset; d = sys.argv[1]; "
            "print('read', os.environ['SLURM_PROCID'], d, sum(1 for _ in ShardDataset(d, shuffle=False)))")
    script = f"""#!/bin/bash
echo job=$SLURM_JOB_ID
DATA=$({STAGE} {packed} 2> stage.err)
DISK=$(HPCML_DATA_RAM_DIR={tmp_path}/none {STAGE} {packed} 2> disk.err)
srun {sys.executable} -c "{read}" "$DATA"
srun {sys.executable} -c "{read}" "$DISK"
{STAGE} --cleanup; echo cleanup=$?
"""
    out = run_job(script, tmp_path, {**env, "HPCML_DATA_RAM_DIR": str(ram), "TMPDIR": str(disk)})
    job, ds = _job_id(out), load_manifest(packed).dataset
    assert "cleanup=0" in out, out
    lines = [line.split() for line in out.splitlines() if line.startswith("read ")]
    assert {p for _, _, p, _ in lines} == {str(ram / f"hpcml-data-{job}" / ds), str(disk / f"hpcml-data-{job}" / ds)}
    per_rank = len(ShardDataset(packed, rank=0, world_size=2))             # each of the 2 ranks reads its half
    assert len(lines) == 4 and all(int(n) == per_rank for *_, n in lines), out
    assert "as hpcml data doctor advises: Stage the shards to RAM" in (tmp_path / "stage.err").read_text()
    assert "stays until 'hpcml data stage --cleanup'" in (tmp_path / "stage.err").read_text()
    assert "node-local disk" in (tmp_path / "disk.err").read_text()
    assert list(ram.iterdir()) == [] and list(disk.iterdir()) == []          # nothing left of the job
