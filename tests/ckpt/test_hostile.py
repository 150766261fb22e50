"""A checkpoint in a shared directory is another user's input: one whose index says what its
bytes are not (a leaf it lacks, a shape larger than its bytes, a dtype that is no tensor's,
a skeleton no load can follow) is refused alike by ``verify`` (so ``prune`` does not keep it
over a good one), ``hpcml scan``, ``export`` (one line, exit 2) and the load itself, which
judges the index and file it reads, not the ones checked a moment before. Each is made by
the real writer, then its index forged with the manifest's checksums rewritten to match
(whoever can write the files can write those too)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, CheckpointError, flatten, layout, load, offline
from hpcml.ckpt.flatten import MAX_DEPTH
from hpcml.ckpt.layout import CorruptIndex
from hpcml.errors import UsageError
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests import needs
from tests.ckpt.forge import forge, reseal, reseal_shard

torch = needs.module("torch")


def _save(root: Path, state: Any, *steps: int) -> None:
    with Checkpointer(root, keep=5, max_write_rate=None) as ck:
        for step in steps:
            ck.save(state, step)


def _model(doc: dict) -> dict:
    return doc["skeleton"]["__d"]["model"]["__d"]


@pytest.mark.parametrize("change, key, says", [
    (lambda d: _model(d).update(w={"__t": 99}), "skeleton", "at model.w: leaf 99 does not exist (the index lists 2)"),
    (lambda d: _model(d).update(w={"__t": "b"}), "skeleton", "at model.w: leaf 'b' is not a leaf number"),
    (lambda d: d["entries"][0].update(shape="4"), "entries.0.shape", "'4' is not a list of at most 64 sizes"),
    (lambda d: d["entries"][0].update(dtype="int64"), "entries.0", "shape [4] of int64 is 32 bytes, the entry's are 16"),
], ids=["missing-leaf", "leaf-not-a-number", "shape-not-a-list", "dtype-not-its-bytes"])
def test_export_of_an_index_with_a_missing_or_wrong_leaf_is_one_line_naming_file_and_key_exit_2(tmp_path, change, key,
                                                                                                 says):
    """A skeleton naming leaf 99 of 2 was an IndexError traceback; one naming leaf 'b' exported
    without the tensor; a shape of the wrong type or size was exit 1 without its key."""
    _save(tmp_path / "ck", {"model": {"w": torch.arange(4, dtype=torch.float32), "b": torch.ones(2)}, "step": 3}, 1)
    index = forge(tmp_path / "ck" / "step-00000001", change)
    out = tmp_path / "m.safetensors"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_CKPT"))}
    p = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "export", str(tmp_path / "ck"), "--to", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr == f"hpcml ckpt export: error: {index}: key '{key}': {says}\n", p.stderr
    assert not out.exists()


def _nest(doc: dict, depth: int) -> None:
    node: Any = {"__t": 0}
    for _ in range(depth):
        node = [node]
    _model(doc)["w"] = node


@pytest.mark.parametrize("change, key, says", [
    # 1 byte of the file filled a 64 MiB tensor (copy_ broadcasts it): any size, from a 12 KiB checkpoint
    (lambda d: d["entries"][0].update(dtype="uint8", shape=[1 << 26], nbytes=1), "entries.0",
     "shape [67108864] of uint8 is 67108864 bytes, the entry's are 1"),
    (lambda d: d["entries"][1].update(shape=[3]), "entries.1", "shape [3] of <f4 is 12 bytes, the entry's are 16"),
    (lambda d: d["entries"][1].update(shape=[-1, -1, 4]), "entries.1.shape", "[-1, -1, 4] is not a list"),
    (lambda d: d["entries"][0].update(dtype="nn"), "entries.0.dtype", "'nn' is not a plain tensor dtype"),
    (lambda d: _nest(d, 700), "skeleton", f"nested more than {MAX_DEPTH} levels deep"),  # a RecursionError at load
    (lambda d: _model(d).update(w={"__own": 0}), "skeleton", "per-rank value 0 outside a replicated state"),
], ids=["shape-larger-than-its-bytes", "shape-smaller", "negative-dims", "torch-dtype", "nested-700", "own-in-sharded"])
def test_an_index_a_load_cannot_follow_is_refused_alike_by_verify_scan_and_load(tmp_path, change, key, says):
    """Each of these verified, passed ``hpcml scan`` and then failed to load (or, the first,
    loaded a tensor of the size it claimed): ``prune`` kept it over the good one before it and
    ``load_latest`` raised instead of loading that one."""
    root = tmp_path / "ck"
    _save(root, {"model": {"w": torch.arange(4, dtype=torch.float32)}, "a": np.arange(4, dtype=np.float32)}, 1, 2)
    index = forge(root / "step-00000002", change)
    found = layout.scan(root)[-1]
    assert found.step == 2
    problems = layout.verify(found)
    assert len(problems) == 1 and problems[0].startswith(f"{index}: key '{key}': ") and says in problems[0], problems
    result = scan_file(root / "step-00000002" / "rank-00000.bin")
    assert result.verdict is not Verdict.SAFE and "does not describe this shard" in result.errors[0], result
    with pytest.raises(CorruptIndex, match=f"key '{key}'") as err:
        load(root, 2)
    assert says in str(err.value) and err.value.exit_code == 2
    ck = Checkpointer(root, read_only=True)
    state, step = ck.load_latest()
    assert step == 1 and torch.equal(state["model"]["w"], torch.arange(4, dtype=torch.float32))
    assert len(ck.skipped) == 1 and says in ck.skipped[0]


@pytest.mark.parametrize("swap", ["index", "link"])
def test_the_load_judges_the_index_and_file_it_reads_not_the_ones_checked_before(tmp_path, monkeypatch, swap):
    """Whoever owns the files can change them between the check and the read: the load
    follows no symbolic link out of the checkpoint (it read another file through one) and
    makes the index check itself (a forged shape filled 64 MiB from one byte)."""
    root = tmp_path / "ck"
    _save(root, {"w": torch.arange(4, dtype=torch.float32)}, 1)
    step = root / "step-00000001"
    checked = offline.check

    def check_then_swap(found: layout.Found, shard: int, own: int | None = None) -> None:
        checked(found, shard, own)
        if swap == "index":       # the manifest forged too, as if read after the swap: the load's own check
            forge(step, lambda d: d["entries"][0].update(dtype="uint8", shape=[1 << 26], nbytes=1))
            assert found.manifest is not None
            found.manifest["ranks"]["0"] = layout.read_json(step / "manifest.json", layout.TAG)["ranks"]["0"]
        else:
            (step / "rank-00000.bin").rename(tmp_path / "elsewhere.bin")
            (step / "rank-00000.bin").symlink_to(tmp_path / "elsewhere.bin")
    monkeypatch.setattr(offline, "check", check_then_swap)
    says = r"key 'entries\.0'" if swap == "index" else "not a regular file"
    with pytest.raises(CheckpointError, match=says):
        load(root)


def _flip(path: Path, at: int) -> None:
    """One byte of ``path`` changed in place: the same size, another checksum."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("what", ["shard", "index"])
def test_bytes_changed_after_the_check_never_load(tmp_path, monkeypatch, what):
    """The load checked the crc32 on one read and loaded on a second: a shard changed in
    between (a rewrite, a copy still arriving, a rotting disk) loaded unchecked, a weight
    of 0.0 read as NaN without a word. The checksum is now taken on the read that loads."""
    root = tmp_path / "ck"
    _save(root, {"w": torch.zeros(1024)}, 1)
    step = root / "step-00000001"
    checked = offline.check

    def check_then_change(found: layout.Found, shard: int, own: int | None = None) -> None:
        checked(found, shard, own)
        if what == "shard":
            _flip(step / "rank-00000.bin", 3)
        else:                                   # the same size, one number changed
            index = step / "rank-00000.json"
            raw = index.read_bytes()
            assert b'"step":1,' in raw
            index.write_bytes(raw.replace(b'"step":1,', b'"step":7,', 1))
    monkeypatch.setattr(offline, "check", check_then_change)
    with pytest.raises(CheckpointError, match=f"rank-00000.{'bin' if what == 'shard' else 'json'}: checksum mismatch"):
        load(root)


def test_resume_falls_back_past_a_shard_changed_after_its_check(tmp_path, monkeypatch):
    """The resume path (``load_latest``) likewise: the step whose bytes changed after the
    check is skipped, naming why, and the one before it loads."""
    root = tmp_path / "ck"
    _save(root, {"w": torch.zeros(1024)}, 1)
    _save(root, {"w": torch.ones(1024)}, 2)
    usable = Checkpointer._usable

    def usable_then_change(self: Checkpointer, found: layout.Found) -> Any:
        out = usable(self, found)
        if found.step == 2:
            _flip(found.path / "rank-00000.bin", 5)
        return out
    monkeypatch.setattr(Checkpointer, "_usable", usable_then_change)
    ck = Checkpointer(root, read_only=True)
    state, step = ck.load_latest()
    assert step == 1 and torch.equal(state["w"], torch.zeros(1024))
    assert len(ck.skipped) == 1 and "step-00000002/rank-00000.bin: checksum mismatch" in ck.skipped[0], ck.skipped


def test_a_local_copy_whose_bytes_rotted_is_read_from_the_shared_tier(tmp_path):
    """This node's copy is read first when its sizes are right; when its bytes prove wrong on
    that read, the shared copy is read instead: the step is not lost to a bad local disk."""
    ck = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "local")
    ck.save({"w": torch.arange(1024, dtype=torch.float32), "b": np.arange(8)}, 4)
    ck.wait()
    _flip(tmp_path / "local" / "step-00000004" / "rank-00000.bin", 9)
    state, step = Checkpointer(tmp_path / "ck", local_dir=tmp_path / "local", read_only=True).load_latest()
    assert step == 4 and torch.equal(state["w"], torch.arange(1024, dtype=torch.float32))
    assert np.array_equal(state["b"], np.arange(8))


def test_an_export_writes_only_the_bytes_the_manifest_names(tmp_path, monkeypatch):
    """``hpcml ckpt export`` checked the crc32, then copied the tensors on a second read: a
    shard changed in between became a safetensors file of other weights. The export's own
    read is checksummed, and nothing is published when it fails."""
    from hpcml.ckpt import export
    root = tmp_path / "ck"
    _save(root, {"model": {"w": torch.zeros(1024)}}, 1)
    checked = offline.check

    def check_then_change(found: layout.Found, shard: int, own: int | None = None) -> None:
        checked(found, shard, own)
        _flip(found.path / "rank-00000.bin", 7)
    monkeypatch.setattr(offline, "check", check_then_change)
    out = tmp_path / "m.safetensors"
    with pytest.raises(CheckpointError, match="rank-00000.bin: checksum mismatch"):
        export.export(root, out)
    assert not out.exists() and not list(tmp_path.glob("m.safetensors*"))


def _append_pickled(step: Path, doc: dict, data: bytes) -> dict:
    """``data`` appended to rank 0's shard as a pickled leaf's bytes; its entry (not yet placed)."""
    shard = step / "rank-00000.bin"
    at = shard.stat().st_size
    with open(shard, "ab") as fh:
        fh.write(data)
    doc["size"] = at + len(data)
    return {"kind": "pickle", "dtype": "u1", "shape": [len(data)], "offset": at, "nbytes": len(data)}


def _unplaced(step: Path, doc: dict) -> None:
    doc["entries"].append(_append_pickled(step, doc, pickle.dumps(os.system)))


def _trailing(step: Path, doc: dict) -> None:
    i = doc["skeleton"]["__d"]["obj"]["__t"]
    doc["entries"][i] = _append_pickled(step, doc, pickle.dumps({7, 8}) + pickle.dumps(os.system))


@pytest.mark.parametrize("change", [_unplaced, _trailing], ids=["a-leaf-in-no-place", "bytes-after-a-pickle"])
def test_bytes_the_load_would_not_read_are_refused_by_load_verify_and_scan_alike(tmp_path, change):
    """``verify`` and ``hpcml scan`` judge every pickled byte of a shard; the load unpickles
    the leaves the state places, each up to its STOP. A refused global in a leaf no place
    names, or after a leaf's pickle, was refused by verify and loaded by the load once it
    no longer ran verify's pass first. Both are refused by all three now (hpcml writes
    neither), and the resume takes the checkpoint before."""
    import json
    root = tmp_path / "ck"
    for step in (1, 2):
        _save(root, {"w": torch.arange(8.0) + step, "obj": {1, step}}, step)
    step_dir = root / "step-00000002"
    index = step_dir / "rank-00000.json"
    doc = json.loads(index.read_text())
    change(step_dir, doc)
    index.write_text(json.dumps(doc))
    reseal_shard(step_dir)
    assert layout.verify(offline.find(root, 2))
    assert scan_file(step_dir / "rank-00000.bin").verdict is not Verdict.SAFE
    with pytest.raises((flatten.CorruptShard, CorruptIndex)):
        load(root, 2)
    ck = Checkpointer(root, read_only=True)
    state, step = ck.load_latest()
    assert step == 1 and state["obj"] == {1} and len(ck.skipped) == 1, ck.skipped


@pytest.mark.parametrize("body", [b"[1, 2, 3]", b"not json", b"[" * 100_000,
                                  b'{"schema": "hpcml.ckpt.shard/9"}'], ids=["list", "not-json", "deep", "newer"])
def test_an_index_no_load_follows_makes_the_resume_take_the_one_before(tmp_path, body):
    """An index whose checksum is right but which is no index (sealed by whoever can write
    the files): the resume raised a UsageError on that rank (the others waited in the
    collective) once the index was no longer judged before the load. It is a corrupt index
    now: skipped, naming it, on every rank together."""
    root = tmp_path / "ck"
    for step in (1, 2):
        _save(root, {"w": torch.arange(8.0) + step}, step)
    index = root / "step-00000002" / "rank-00000.json"
    index.write_bytes(body)
    reseal(root / "step-00000002", index)
    ck = Checkpointer(root, read_only=True)
    state, step = ck.load_latest()
    assert step == 1 and torch.equal(state["w"], torch.arange(8.0) + 1)
    assert len(ck.skipped) == 1 and "rank-00000.json" in ck.skipped[0], ck.skipped
    with pytest.raises(CorruptIndex) as err:
        load(root, 2)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


@pytest.mark.parametrize("target", ["own-00001.json", "rank-00000.json"])
def test_a_rotted_local_index_of_a_replicated_state_is_read_from_the_shared_tier(tmp_path, monkeypatch, target):
    """A replicated state with per-rank values joins two indexes (the state's places, the
    rank's own values); the join was judged on this node's copies before their checksums
    were, so a local index rotted into non-JSON lost the step on every rank (the only
    step: training from scratch). The join is judged on the read that loads now."""
    from hpcml.ckpt import PerRank
    monkeypatch.setenv("HPCML_CKPT_TOKEN", "t")

    def ck(rank: int, **kw: Any) -> Checkpointer:
        return Checkpointer(tmp_path / "ck", rank=rank, world_size=2, replicated=True, max_write_rate=None,
                            local_dir=tmp_path / f"local{rank}", **kw)
    writers = ck(0), ck(1)
    for r in (1, 0):
        writers[r].save({"w": np.full(100, 5), "mine": PerRank(np.array([r, 5]))}, 5)
        writers[r].wait()
    who = 1 if target.startswith("own") else 0
    path = tmp_path / f"local{who}" / "step-00000005" / target
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] = ord("#")
    path.write_bytes(bytes(raw))
    state, step = ck(who, read_only=True).load_latest()
    assert step == 5 and state["mine"].tolist() == [who, 5] and np.array_equal(state["w"], np.full(100, 5))


def test_a_shard_over_2_gib_loads(tmp_path):
    """One read() returns at most 2 GiB less 4 KiB on Linux, and the shard was read whole in
    one: any shard over that (a model over 2 GiB per rank) never loaded ("2147479552 bytes,
    expected ..."). Built sparse from a real save, a leaf written past 2 GiB, and read by the
    loader itself (the checksum of 2 GiB is not what this is about): each leaf is read on
    its own, so this costs no memory."""
    root = tmp_path / "ck"
    _save(root, {"head": np.arange(4, dtype=np.int32)}, 1)
    step = root / "step-00000001"
    shard, tail_at = step / "rank-00000.bin", 2 << 30
    with open(shard, "r+b") as fh:
        fh.truncate(tail_at + flatten.ALIGN)
        fh.seek(tail_at)
        fh.write(b"tail")

    def grow(doc: dict) -> None:
        doc["entries"].append({"kind": "bytes", "dtype": "u1", "shape": [4], "offset": tail_at, "nbytes": 4})
        doc["skeleton"]["__d"]["tail"] = {"__t": 1}
        doc["size"] = tail_at + flatten.ALIGN
    forge(step, grow)
    state = offline.read_state(step, 0)
    assert state["tail"] == b"tail" and state["head"].tolist() == [0, 1, 2, 3]


def test_a_leaf_read_in_short_reads_is_whole(tmp_path, monkeypatch):
    """A tensor over 2 GiB comes in several reads: each leaf is read until it is whole."""
    root = tmp_path / "ck"
    state = {"t": torch.randn(1 << 18), "a": np.random.default_rng(0).random(1 << 15)}
    _save(root, state, 1)
    preadv, calls = os.preadv, []

    def short(fd: int, bufs: list, offset: int) -> int:    # at most 4096 bytes, of the first buffer only
        calls.append(offset)
        return preadv(fd, [memoryview(bufs[0])[:4096]], offset)
    monkeypatch.setattr(os, "preadv", short)
    got, _ = load(root)
    assert torch.equal(got["t"], state["t"]) and np.array_equal(got["a"], state["a"])
    assert len(calls) >= (4 * (1 << 18) + 8 * (1 << 15)) // 4096       # every leaf came in many reads


def test_a_state_nested_deeper_than_a_load_follows_is_refused_at_save(tmp_path):
    """What saves, loads: the depth a load refuses is refused at save, naming the place."""
    node: Any = 1
    for _ in range(MAX_DEPTH - 1):
        node = [node]
    _save(tmp_path / "ok", {"x": node}, 1)
    assert load(tmp_path / "ok")[0] == {"x": node}
    with pytest.raises(UsageError, match=f"nested more than {MAX_DEPTH} levels deep") as err:
        _save(tmp_path / "deep", {"x": [[node]]}, 1)
    assert err.value.key is not None and err.value.key.startswith("x.0.0")


def test_leaves_that_share_bytes_are_refused_before_one_is_read(tmp_path):
    """400 entries over the same 1 MiB of a shard: each read into its own memory, 400 MiB
    from a 1 MiB file; verify passed it."""
    _save(tmp_path / "ck", {"w": np.zeros(1 << 18, dtype=np.float32)}, 1)

    def share(d: dict) -> None:
        d["entries"] = [dict(d["entries"][0]) for _ in range(400)]
        d["skeleton"]["__d"]["w"] = [{"__t": i} for i in range(400)]
    index = forge(tmp_path / "ck" / "step-00000001", share)
    found = layout.scan(tmp_path / "ck")[-1]
    problems = layout.verify(found)
    assert [str(p) for p in problems] == [f"{index}: key 'entries.1': bytes 0+ overlap another leaf's (0+1048576): "
                                          "each leaf's bytes are its own"]
    with pytest.raises(CorruptIndex, match="overlap another leaf's"):
        load(tmp_path / "ck")


def test_a_typed_mapping_chained_without_items_is_refused_by_verify_and_load(tmp_path):
    """``{"__m": "Counter", "__v": {"__m": ...}}`` 900 deep: no level counted, verify passed,
    and a load from a deeper stack failed on the interpreter's recursion limit."""
    _save(tmp_path / "ck", {"m": {"a": 1}}, 1)
    index = forge(tmp_path / "ck" / "step-00000001", lambda d: d["skeleton"]["__d"].update(m="@@"))
    index.write_text(index.read_text().replace('"@@"', '{"__m": "Counter", "__v": ' * 900 + '{"__d": {"a": 1}}' + "}" * 900))
    reseal(tmp_path / "ck" / "step-00000001", index)
    problems = layout.verify(layout.scan(tmp_path / "ck")[-1])
    assert [str(p) for p in problems] == [f"{index}: key 'skeleton': at m: a typed mapping node without a dict node "
                                          "of items"]
    with pytest.raises(CorruptIndex, match="a typed mapping node without a dict node of items"):
        load(tmp_path / "ck")


@pytest.mark.parametrize("case", ["unhashable-key", "per-rank-place-in-a-plain-checkpoint"])
def test_a_checkpoint_whose_bytes_do_not_rebuild_is_skipped_by_load_latest_for_the_one_before(tmp_path, case):
    """What verify cannot judge without loading (a pickled leaf made a dict's key: a set; a
    per-rank place in a checkpoint that has no per-rank values) failed the load, and
    ``load_latest`` raised instead of resuming from the good checkpoint before it."""
    if case == "unhashable-key":
        _save(tmp_path / "ck", {"m": {"a": 1}}, 1)
        _save(tmp_path / "ck", {"s": {1, 2}, "m": {"a": 1}}, 2)
        forge(tmp_path / "ck" / "step-00000002", lambda d: d["skeleton"]["__d"].update(m={"__kv": [[{"__t": 0}, 1]]}))
        want: Any = {"m": {"a": 1}}
    else:
        _save(tmp_path / "ck", {"step": 1}, 1)
        _save(tmp_path / "ck", {"step": 2}, 2)
        forge(tmp_path / "ck" / "step-00000002",
               lambda d: (d.update(replicated=True), d["skeleton"]["__d"].update(step={"__own": 0})))
        want = {"step": 1}
    with Checkpointer(tmp_path / "ck", keep=5, max_write_rate=None) as ck:
        state, step = ck.load_latest()
        assert (state, step) == (want, 1)
        assert len(ck.skipped) == 1 and "step-00000002" in ck.skipped[0]
