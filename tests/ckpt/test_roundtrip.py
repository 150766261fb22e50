"""Save and load through the real files: byte-identical state, corrupt and partial
checkpoints skipped by name, bad input in one line."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, layout, load
from hpcml.errors import HpcmlError, UsageError
from tests import needs

torch = needs.module("torch")


def _state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(), "np_rng": np.random.get_state(), "step_in_epoch": 17,
            "half": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "flags": torch.tensor([True, False]),
            "scalar": torch.tensor(3.5), "blob": b"\x00\x01raw", "by_int": {1: ("a", 2.5)},
            "nan": float("nan"), "empty": torch.empty(0, 3)}


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.view(-1).view(torch.uint8).tolist() == b.view(-1).view(torch.uint8).tolist()
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def test_round_trip_is_byte_identical(tmp_path):
    state = _state()
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(state, 10)
    loaded, step = Checkpointer(tmp_path / "ck").load_latest()
    assert step == 10
    _same(state, loaded)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.load_state_dict(loaded["model"])             # usable as it comes back
    random.setstate(loaded["py_rng"])
    np.random.set_state(loaded["np_rng"])
    torch.set_rng_state(loaded["torch_rng"])


def test_tensors_are_never_pickled(tmp_path):
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(_state(), 1)
    shard = json.loads((tmp_path / "ck" / "step-00000001" / "rank-00000.json").read_text())
    kinds = [e["kind"] for e in shard["entries"]]
    assert kinds.count("pickle") == 0 and kinds.count("torch") > 5 and "numpy" in kinds


def test_save_returns_before_the_write_and_the_buffer_is_reused(tmp_path):
    ck = Checkpointer(tmp_path / "ck", max_write_rate="20 MB/s")
    big = {"w": torch.ones(5_000_000)}                    # 20 MB: about a second at the cap
    ck.save(big, 1)
    assert not (tmp_path / "ck" / "step-00000001").exists()   # still being written
    first = ck._host
    big["w"] += 1                                          # the snapshot is not affected
    ck.wait()
    ck.save(big, 2)
    assert ck._host is first
    ck.wait()
    loaded, step = ck.load_latest()
    assert step == 2 and float(loaded["w"][0]) == 2.0
    assert Checkpointer(tmp_path / "ck").load_latest()[0] is not None


def test_keep_prunes_only_after_a_newer_commit(tmp_path):
    ck = Checkpointer(tmp_path / "ck", keep=2)
    for step in (1, 2, 3, 4):
        ck.save({"s": torch.tensor(step)}, step)
        ck.wait()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name != ".owner") == ["step-00000003", "step-00000004"]


def test_a_corrupt_newest_checkpoint_is_named_and_the_previous_one_loaded(tmp_path, capsys):
    ck = Checkpointer(tmp_path / "ck")
    for step in (1, 2):
        ck.save({"w": torch.full((1000,), float(step))}, step)
        ck.wait()
    victim = tmp_path / "ck" / "step-00000002" / "rank-00000.bin"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    fresh = Checkpointer(tmp_path / "ck")
    state, step = fresh.load_latest()
    assert step == 1 and float(state["w"][0]) == 1.0
    assert "step-00000002" in fresh.skipped[0] and "checksum" in fresh.skipped[0]
    assert "skipped" in capsys.readouterr().err
    out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "verify", str(tmp_path / "ck"), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 1
    states = {c["step"]: c["state"] for c in json.loads(out.stdout)["checkpoints"]}
    assert states == {1: "committed", 2: "corrupt"}


def test_partial_and_truncated_checkpoints_are_skipped(tmp_path):
    ck = Checkpointer(tmp_path / "ck")
    ck.save({"w": torch.ones(10)}, 1)
    ck.wait()
    (tmp_path / "ck" / layout.partial_name(5)).mkdir()          # a save that never finished
    ck.save({"w": torch.ones(10) * 3}, 3)
    ck.wait()
    with open(tmp_path / "ck" / "step-00000003" / "rank-00000.bin", "r+b") as fh:
        fh.truncate(100)
    state, step = Checkpointer(tmp_path / "ck").load_latest()
    assert step == 1


def test_a_malicious_pickle_inside_is_refused_not_run(tmp_path):
    """A non-tensor leaf is pickled; one that names os.system is refused by the scan's
    restricted loader in one error, and nothing runs."""
    marker = tmp_path / "pwned"
    ck = Checkpointer(tmp_path / "ck")
    ck.save({"cfg": {"a": 1}, "obj": _Plain()}, 1)
    ck.wait()
    d = tmp_path / "ck" / "step-00000001"
    shard = json.loads((d / "rank-00000.json").read_text())
    entry = next(e for e in shard["entries"] if e["kind"] == "pickle")
    evil = pickle.dumps(_Evil(str(marker)), protocol=4)
    assert len(evil) <= -(-entry["nbytes"] // 4096) * 4096
    raw = bytearray((d / "rank-00000.bin").read_bytes())
    raw[entry["offset"]:entry["offset"] + len(evil)] = evil
    entry["nbytes"] = len(evil)
    (d / "rank-00000.bin").write_bytes(bytes(raw))
    (d / "rank-00000.json").write_text(json.dumps(shard))
    man = json.loads((d / "manifest.json").read_text())          # an attacker can rewrite checksums too
    man["ranks"]["0"].update(crc32=layout.file_crc(d / "rank-00000.bin"),
                             json_size=(d / "rank-00000.json").stat().st_size,
                             json_crc32=layout.file_crc(d / "rank-00000.json"))
    (d / "manifest.json").write_text(json.dumps(man))
    c = Checkpointer(tmp_path / "ck")
    assert c.load_latest() == (None, None)                      # refused like a corrupt one: not loaded
    assert len(c.skipped) == 1 and "obj" in c.skipped[0] and "posix.system" in c.skipped[0], c.skipped
    with pytest.raises(HpcmlError):
        load(tmp_path / "ck")                                    # loading that step itself: refused
    assert not marker.exists()


class _Plain:
    def __eq__(self, other):
        return type(other) is _Plain


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_checkpoint_from_another_world_size_is_one_clear_error(tmp_path, monkeypatch):
    """Two ranks in one process (their own token, as a run id gives): rank 1's shard first,
    then rank 0 commits; a one-rank job must refuse the sharded checkpoint."""
    monkeypatch.setenv("HPCML_CKPT_TOKEN", "t")
    a, b = Checkpointer(tmp_path / "ck", rank=0, world_size=2), Checkpointer(tmp_path / "ck", rank=1, world_size=2)
    b.save({"r": torch.tensor(1)}, 1)
    b.wait()
    a.save({"r": torch.tensor(0)}, 1)
    a.wait()
    assert Checkpointer(tmp_path / "ck", rank=1, world_size=2).load_latest()[0]["r"].item() == 1
    monkeypatch.delenv("HPCML_CKPT_TOKEN")
    with pytest.raises(UsageError, match="world size 2; this job has 1"):
        Checkpointer(tmp_path / "ck").load_latest()


def test_not_a_checkpoint_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="not a checkpoint directory"):
        Checkpointer(tmp_path)
    for args in (["ls", str(tmp_path)], ["verify", str(tmp_path / "missing")], ["prune", str(tmp_path), "--keep", "1"]):
        out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", *args], capture_output=True, text=True)
        assert out.returncode == 2, out
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_ls_shows_steps_sizes_tiers_and_state(tmp_path):
    ck = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "local")
    ck.save({"w": torch.ones(1024)}, 7)
    ck.wait()
    (tmp_path / "ck" / layout.partial_name(9)).mkdir()
    out = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "ls", str(tmp_path / "ck"), "--local",
                          str(tmp_path / "local"), "--json"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    import jsonschema

    from hpcml import schemas
    jsonschema.validate(doc, schemas.load("ckpt.list"))
    rows = {c["step"]: c for c in doc["checkpoints"]}
    assert rows[7]["state"] == "committed" and rows[7]["tiers"] == ["shared", "local"] and rows[7]["size"] == 4096
    assert rows[9]["state"] == "partial"
    man = json.loads((tmp_path / "ck" / "step-00000007" / "manifest.json").read_text())
    jsonschema.validate(man, schemas.load("ckpt"))
    jsonschema.validate(json.loads((tmp_path / "ck" / "step-00000007" / "rank-00000.json").read_text()),
                        schemas.load("ckpt.shard"))


def test_local_tier_is_preferred_and_the_shared_copy_is_the_fallback(tmp_path):
    ck = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "local")
    ck.save({"w": torch.full((100,), 4.0)}, 4)
    ck.wait()
    local_bin = tmp_path / "local" / "step-00000004" / "rank-00000.bin"
    shared_bin = tmp_path / "ck" / "step-00000004" / "rank-00000.bin"
    assert local_bin.read_bytes() == shared_bin.read_bytes()
    shared_bin.write_bytes(b"\x00" * shared_bin.stat().st_size)     # the shared copy is damaged
    state, step = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "local").load_latest()
    assert step == 4 and float(state["w"][0]) == 4.0                 # read from this node's copy
    local_bin.unlink()                                               # a new node: no local copy
    state, step = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "other").load_latest()
    assert step is None                                              # and the shared one damaged
    ck = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "local")     # the job goes on (this node)
    ck.save({"w": torch.arange(100, dtype=torch.float32)}, 8)
    ck.wait()
    import shutil
    shutil.rmtree(tmp_path / "local")                                # this node lost its local disk
    state, step = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "local").load_latest()
    assert step == 8 and torch.equal(state["w"], torch.arange(100, dtype=torch.float32))   # the shared copy


def test_bad_settings_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="keep"):
        Checkpointer(tmp_path / "a", keep=0)
    with pytest.raises(UsageError):
        Checkpointer(tmp_path / "b", max_write_rate="fast")
