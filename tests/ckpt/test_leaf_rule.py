"""One rule for a pickled leaf (``hpcml.ckpt.leafcheck``): ``verify`` (and so prune), ``hpcml
scan`` and the load refuse the same leaves. Judged apart, a leaf of 0 bytes, one with a
second pickle or junk after its STOP, or one over the load's size limit verified clean and
never loaded, so prune removed the older checkpoint that did load; and a dangerous pickle
inside a leaf's bytes value was refused by verify and loaded by the load. Each forged leaf
below is sealed into the manifest, as whoever can write the files could."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, flatten, layout, load, offline, scanformat
from hpcml.ckpt.prune import prune
from hpcml.errors import HpcmlError, UsageError
from hpcml.scan import loader, scanner
from hpcml.scan.loader import safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests.ckpt.forge import reseal_shard


class _Evil:
    def __reduce__(self) -> tuple:
        return os.system, ("echo PWNED",)


EVIL = pickle.dumps(_Evil(), protocol=2)


def _save(root: Path, state: dict, *steps: int) -> None:
    with Checkpointer(root, keep=5, max_write_rate=None) as ck:
        for step in steps:
            ck.save(state, step)
            ck.wait()


def _replace_leaf(step: Path, data: bytes) -> None:
    """The ``extra`` leaf of rank 0's shard pointed at ``data``, appended to the shard; sealed."""
    shard, index = step / "rank-00000.bin", step / "rank-00000.json"
    doc = json.loads(index.read_text())
    at = shard.stat().st_size
    with open(shard, "ab") as fh:
        fh.write(data)
    doc["size"] = at + len(data)
    i = doc["skeleton"]["__d"]["extra"]["__t"]
    doc["entries"][i] = {"kind": "pickle", "dtype": "u1", "shape": [len(data)], "offset": at, "nbytes": len(data)}
    index.write_text(json.dumps(doc))
    reseal_shard(step)


LEAVES = {
    "empty": b"",
    "second-pickle": pickle.dumps(Fraction(1, 3), protocol=4) + pickle.dumps(2, protocol=4),
    "junk-after": pickle.dumps(Fraction(1, 3), protocol=4) + b"\x00\x01junk",
    "nested-dangerous": pickle.dumps({EVIL}, protocol=4),
}


@pytest.mark.parametrize("data", LEAVES.values(), ids=LEAVES.keys())
def test_a_leaf_the_load_refuses_is_refused_by_verify_and_scan_and_prune_keeps_the_one_that_loads(tmp_path, data):
    root = tmp_path / "ck"
    _save(root, {"w": 1.0, "extra": Fraction(1, 3)}, 1, 2)
    step2 = root / "step-00000002"
    _replace_leaf(step2, data)
    problems = layout.verify(offline.find(root, 2))
    assert problems and "leaf extra" in problems[0], problems
    assert scan_file(step2 / "rank-00000.bin").verdict is not Verdict.SAFE
    with pytest.raises(flatten.CorruptShard, match="leaf extra"):
        load(root, 2)
    with pytest.raises(HpcmlError):
        safe_load(step2)
    # nothing lost: prune keeps the older checkpoint, and the resume loads it
    assert prune(root, 1).removed == []
    ck = Checkpointer(root, read_only=True)
    state, step = ck.load_latest()
    assert step == 1 and state["extra"] == Fraction(1, 3) and len(ck.skipped) == 1, ck.skipped


def test_a_leaf_over_the_loads_size_limit_is_refused_at_save_and_by_verify_and_load(tmp_path, monkeypatch):
    """hpcml wrote a 1 GiB+ pickled leaf that verified and scanned clean and never loaded
    (the restricted unpickler's limit); the limit is lowered here to keep the test small."""
    root = tmp_path / "ck"
    blob = {b"\x01" * (1 << 17)}                         # a set: one pickled leaf of 128 KiB
    _save(root, {"w": 1.0, "extra": Fraction(1, 3)}, 1)
    _save(root, {"w": 2.0, "extra": blob}, 2)            # under the real limit: written
    monkeypatch.setattr(loader, "MAX_PICKLE_BYTES", 1 << 16)
    with Checkpointer(tmp_path / "other", max_write_rate=None) as ck, \
            pytest.raises(UsageError, match="extra.*over the 65536 .* a pickled leaf may be"):
        ck.save({"extra": blob}, 1)
    assert not list((tmp_path / "other").glob("*step-*"))
    problems = layout.verify(offline.find(root, 2))
    assert problems and "larger than" in problems[0], problems
    with pytest.raises(flatten.CorruptShard, match="larger than"):
        load(root, 2)
    assert prune(root, 1).removed == []
    state, step = Checkpointer(root, read_only=True).load_latest()
    assert step == 1 and state["extra"] == Fraction(1, 3)


def test_a_benign_bytes_value_that_is_a_pickle_still_loads(tmp_path):
    """The rule refuses what a nested pickle does, not that one is there."""
    inner = pickle.dumps({"a": [1, 2]}, protocol=4)
    _save(tmp_path / "ck", {"obj": {inner}}, 1)
    assert layout.verify(offline.find(tmp_path / "ck", 1)) == []
    state, step = load(tmp_path / "ck")
    assert state["obj"] == {inner} and step == 1
    assert safe_load(tmp_path / "ck")["obj"] == {inner}


def _swap_after_scan(monkeypatch, swap) -> None:
    """The files swapped once the scan of a shard returns (by path: the old code's
    ``scan_file``; by descriptor: the checkpoint format's ``scan``)."""
    real_file, real_scan = scanner.scan_file, scanformat.scan
    swapped: list[bool] = []

    def once() -> None:
        if not swapped:
            swapped.append(True)
            swap()

    def scan_file_then_swap(path, policy=None):
        res = real_file(path, policy)
        once()
        return res

    def scan_then_swap(*args, **kwargs):
        real_scan(*args, **kwargs)
        once()
    monkeypatch.setattr(scanner, "scan_file", scan_file_then_swap)
    monkeypatch.setattr(scanformat, "scan", scan_then_swap)


def test_safe_load_of_a_checkpoint_never_loads_files_swapped_in_after_the_scan(tmp_path, monkeypatch):
    """The scan read the shard by path and the load opened it again by path: benign files
    in place while the scan read them, the manifest's own (a dangerous nested pickle) put
    back after it, loaded."""
    _save(tmp_path / "a", {"obj": {b"benign bytes, benign bytes!!"}}, 1)
    _save(tmp_path / "b", {"obj": {EVIL}}, 1)
    a, b = tmp_path / "a" / "step-00000001", tmp_path / "b" / "step-00000001"
    orig = tmp_path / "b-orig"
    shutil.copytree(b, orig)
    for name in ("rank-00000.bin", "rank-00000.json"):
        shutil.copy(a / name, b / name)

    def swap() -> None:
        for name in ("rank-00000.bin", "rank-00000.json"):
            shutil.copy(orig / name, b / name)
    _swap_after_scan(monkeypatch, swap)
    with pytest.raises(HpcmlError):
        safe_load(b.parent)


def test_safe_load_of_a_checkpoint_loads_the_files_it_scanned(tmp_path, monkeypatch):
    """Files renamed over the scanned ones after the scan are not what loads: the state
    is the scanned one, read from the descriptor and index the scan judged."""
    _save(tmp_path / "a", {"obj": {b"scanned"}, "n": 1}, 1)
    _save(tmp_path / "b", {"obj": {b"other"}, "n": 2}, 1)
    a, b = tmp_path / "a" / "step-00000001", tmp_path / "b" / "step-00000001"

    def swap() -> None:
        for name in ("rank-00000.bin", "rank-00000.json", "manifest.json"):
            os.rename(b / name, a / name)                # new files under the scanned names
    _swap_after_scan(monkeypatch, swap)
    state = safe_load(a)
    assert state["obj"] == {b"scanned"} and state["n"] == 1


def test_export_over_a_directory_in_the_way_of_its_temporary_file_is_one_line_exit_2(tmp_path):
    """``<out>.tmp`` a directory: IsADirectoryError, a 64-line traceback."""
    import subprocess
    import sys
    _save(tmp_path / "ck", {"w": np.arange(4, dtype=np.float32)}, 1)
    out = tmp_path / "m.safetensors"
    (tmp_path / "m.safetensors.tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_CKPT"))}
    p = subprocess.run([sys.executable, "-m", "hpcml", "ckpt", "export", str(tmp_path / "ck"), "--to", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"hpcml ckpt export: error: {out}.tmp: ") and "Is a directory" in p.stderr, p.stderr
    assert not out.exists()
