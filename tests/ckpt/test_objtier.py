"""The Checkpointer's object-storage tier against a real S3 server (moto_server, with a
fault proxy in front: tests/s3server.py): a round trip when the shared tier lost its
checkpoints, multipart uploads under the bytes/s cap, the manifest last so that a push cut
short (a failing endpoint, kill -9 at random moments) is never a whole checkpoint in the
store, retries through a throttled endpoint, and one line for a missing bucket or refused
credentials."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, layout
from hpcml.ckpt.objtier import ObjectTier
from hpcml.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
TASK = Path(__file__).with_name("task.py")


def _state(step: int, mb: float = 1) -> dict:
    return {"w": np.full(int(mb * (1 << 20) / 8), float(step)), "step": step}


def _keys(s3v, prefix: str) -> list[str]:
    out = s3v.client().list_objects_v2(Bucket=s3v.bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in out)


def test_a_lost_shared_tier_is_restored_from_the_store(s3, tmp_path):
    with Checkpointer(tmp_path / "ck", keep=2, object_store=s3.url("run1"), max_write_rate=None) as ck:
        for step in (10, 20, 30):
            ck.save(_state(step, mb=40), step)                    # 40 MB: a multipart upload (16 MiB parts)
            ck.wait()
        assert ck.tier_problem is None
    assert ObjectTier(s3.url("run1")).steps() == [20, 30]          # keep=2 there too
    etag = s3.client().head_object(Bucket=s3.bucket, Key="run1/step-00000030/rank-00000.bin")["ETag"]
    assert etag.strip('"').endswith("-3")                           # three parts
    shutil.rmtree(tmp_path / "ck")                                  # the shared tier lost them
    state, step = Checkpointer(tmp_path / "ck").load_latest()
    assert step is None                                            # without the tier: nothing
    back = Checkpointer(tmp_path / "ck", object_store=s3.url("run1"))
    state, step = back.load_latest()
    assert step == 30 and state["step"] == 30 and np.all(state["w"] == 30.0)
    assert (tmp_path / "ck" / "step-00000030" / layout.MANIFEST).exists()


def test_pushes_keep_to_the_bytes_per_second_cap(s3, tmp_path):
    with Checkpointer(tmp_path / "ck", object_store=s3.url("capped"), max_write_rate="20 MB/s") as ck:
        ck.save(_state(1, mb=30), 1)
        start = time.monotonic()
        ck.wait()
        took = time.monotonic() - start
    # 30 MiB to the shared tier and again to the store, each at 20 MB/s: at least ~3 s in all
    assert took >= 2.5, took


def test_a_push_cut_short_by_a_failing_endpoint_is_never_a_whole_checkpoint(s3, tmp_path):
    with Checkpointer(tmp_path / "ck", object_store=s3.url("flaky"), max_write_rate=None) as ck:
        ck.save(_state(1), 1)
        ck.wait()
        s3.proxy.fail_all = True                                     # 503 SlowDown from now on
        ck.save(_state(2), 2)
        ck.wait()                                                    # the commit stands; the push is said
        assert ck.tier_problem and "SlowDown" in ck.tier_problem and "s3://" in ck.tier_problem
        s3.proxy.fail_all = False
    assert (tmp_path / "ck" / "step-00000002").is_dir()
    assert ObjectTier(s3.url("flaky")).steps() == [1]
    assert "flaky/step-00000002/manifest.json" not in _keys(s3, "flaky/")


def test_a_throttled_endpoint_is_retried_with_backoff(s3, tmp_path):
    s3.proxy.fail_next = 3                                           # three 503s, then answers
    with Checkpointer(tmp_path / "ck", object_store=s3.url("slow"), max_write_rate=None) as ck:
        ck.save(_state(5), 5)
        ck.wait()
        assert ck.tier_problem is None
    assert s3.proxy.failed == 3 and ObjectTier(s3.url("slow")).steps() == [5]


def test_a_missing_bucket_and_refused_credentials_are_one_line(s3, tmp_path, monkeypatch):
    with pytest.raises(UsageError) as err:
        Checkpointer(tmp_path / "a", object_store="s3://hpcml-no-such-bucket/x")
    assert "s3://hpcml-no-such-bucket/x: no such bucket" in str(err.value) and "\n" not in str(err.value)
    s3.proxy.refused_key = "WRONGKEY"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "WRONGKEY")
    with pytest.raises(UsageError) as err:
        Checkpointer(tmp_path / "b", object_store=s3.url("x"))
    assert "credentials were refused" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UsageError, match="not a bucket name"):
        Checkpointer(tmp_path / "c", object_store="s3://A_B/x")


def test_kill_9_at_random_moments_never_leaves_a_half_pushed_checkpoint_whole(s3, tmp_path):
    """A task saving 8 MB every step with the tier, killed with SIGKILL at random moments,
    five times (each run resumes from the shared tier): every step the store holds whole
    loads and holds its own step's values; then the shared tier is lost and the newest
    step in the store is resumed, never one newer than the task was told durable."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT), **s3.env()}
    rng = random.Random(7)
    log = tmp_path / "durable.log"
    for _ in range(5):
        p = subprocess.Popen([sys.executable, str(TASK), str(tmp_path / "ck"), "--size-mb", "8", "--keep", "3",
                              "--log", str(log), "--object-store", s3.url("kill")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(2.0, 4.0))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    tier = ObjectTier(s3.url("kill"))
    whole = tier.steps()
    assert whole, "nothing was pushed"
    for step in whole:
        into = tmp_path / f"check-{step}"
        into.mkdir()
        tier.fetch(step, into)
        state, got = Checkpointer(into, read_only=True).load_latest()
        assert got == step and state["step"] == step and np.all(state["w"] == float(step))
    durable = [int(x) for x in log.read_text().split()]
    shutil.rmtree(tmp_path / "ck")
    state, step = Checkpointer(tmp_path / "ck", object_store=s3.url("kill")).load_latest()
    assert step == whole[-1] and step <= max(durable) + 1 and np.all(state["w"] == float(step))


def test_a_corrupt_local_copy_or_an_older_one_gives_way_to_the_stores_and_a_dead_fetch_is_no_obstacle(s3, tmp_path):
    """The directory kept its checkpoints but their shards are damaged, or it kept only an
    older one: load_latest takes the store's newest whole step; a fetch killed before its
    rename (its temporary directory left behind) neither blocks opening the directory nor
    the next fetch."""
    with Checkpointer(tmp_path / "ck", keep=2, object_store=s3.url("heal"), max_write_rate=None) as ck:
        for step in (10, 20):
            ck.save(_state(step), step)
            ck.wait()
    for bin_file in (tmp_path / "ck").glob("step-*/rank-*.bin"):
        bin_file.write_bytes(b"\0" * bin_file.stat().st_size)          # damaged in place, same size
    (tmp_path / "ck" / ".fetch-step-00000020-deadbeef").mkdir()           # a fetch killed by kill -9
    state, step = Checkpointer(tmp_path / "ck", object_store=s3.url("heal")).load_latest()
    assert step == 20 and np.all(state["w"] == 20.0)
    shutil.rmtree(tmp_path / "ck" / "step-00000020")                      # only the older one left here
    state, step = Checkpointer(tmp_path / "ck", object_store=s3.url("heal")).load_latest()
    assert step == 20 and np.all(state["w"] == 20.0)


def test_a_store_that_cannot_give_a_step_is_said_and_the_one_before_is_taken(s3, tmp_path):
    with Checkpointer(tmp_path / "ck", keep=3, object_store=s3.url("gaps"), max_write_rate=None) as ck:
        for step in (1, 2):
            ck.save(_state(step), step)
            ck.wait()
    s3.client().delete_object(Bucket=s3.bucket, Key="gaps/step-00000002/rank-00000.bin")   # lost in the store
    shutil.rmtree(tmp_path / "ck")
    state, step = Checkpointer(tmp_path / "ck", object_store=s3.url("gaps")).load_latest()
    assert step == 1 and np.all(state["w"] == 1.0)
