"""``hpcml scan`` of what ``hpcml.ckpt`` writes: a clean checkpoint passes (exit 0), a pickled
leaf replaced by a reduce gadget is named and refused, and a ``.bin`` that only claims to be
a shard is scanned as hard as before."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, layout
from hpcml.scan import UnsafeFileError, safe_load
from tests.scan import payloads


def _scan(*paths: Path) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", *map(str, paths), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 2 and "Traceback" not in out.stderr, out.stderr
    return out.returncode, {Path(f["path"]).name: f for f in json.loads(out.stdout)["files"]}


def _rewrite(d: Path, shard: dict, raw: bytes) -> None:
    """Write a shard's bytes and index, and the manifest's checksums to match (an attacker
    who can write the files can write those too)."""
    (d / "rank-00000.bin").write_bytes(raw)
    (d / "rank-00000.json").write_text(json.dumps(shard))
    man = json.loads((d / "manifest.json").read_text())
    man["ranks"]["0"].update(size=len(raw), crc32=layout.file_crc(d / "rank-00000.bin"),
                             json_size=(d / "rank-00000.json").stat().st_size,
                             json_crc32=layout.file_crc(d / "rank-00000.json"))
    (d / "manifest.json").write_text(json.dumps(man))


def test_a_checkpoint_passes_the_scan_and_a_hostile_pickled_leaf_is_named(tmp_path):
    ck = tmp_path / "checkpoints"
    with Checkpointer(ck) as c:
        c.save({"model": {"w": np.arange(1000, dtype=np.float32)}, "extra": {"ratio": Fraction(1, 3)},
                "step": 20}, 20)
    d = ck / "step-00000020"
    code, files = _scan(ck)
    assert code == 0, files
    assert files["rank-00000.bin"]["verdict"] == "safe" and files["rank-00000.bin"]["format"] == "hpcml-ckpt"
    assert safe_load(d)["extra"]["ratio"] == Fraction(1, 3)          # a step directory, through the safe path

    marker = tmp_path / "pwned"
    shard = json.loads((d / "rank-00000.json").read_text())
    i, entry = next((i, e) for i, e in enumerate(shard["entries"]) if e["kind"] == "pickle")
    evil = payloads.assemble(4, payloads.os_system_call(marker))
    raw = bytearray((d / "rank-00000.bin").read_bytes())
    raw[entry["offset"]:entry["offset"] + len(evil)] = evil
    entry["nbytes"] = len(evil)
    _rewrite(d, shard, bytes(raw))
    code, files = _scan(ck)
    bad = files["rank-00000.bin"]
    assert code == 6 and bad["verdict"] == "dangerous", bad
    assert any(f["name"] == "os.system" and f["member"] == "leaf extra.ratio" for f in bad["findings"]), bad
    with pytest.raises(UnsafeFileError, match="os.system"):
        safe_load(d)
    with pytest.raises(UnsafeFileError):
        safe_load(d / "rank-00000.bin")
    assert not marker.exists()


def test_a_bin_that_only_claims_to_be_a_shard_is_still_scanned(tmp_path):
    """No index: a pickle as before. An index that lists the bytes as a tensor: the bytes a
    plain pickle.load would run are walked too. An index that does not fit the file: error."""
    marker = tmp_path / "pwned"
    evil = payloads.assemble(2, payloads.os_system_call(marker))
    d = tmp_path / "step-00000001"
    d.mkdir()
    (d / "rank-00000.bin").write_bytes(evil)
    assert _scan(d)[0] == 6
    index = {"schema": layout.SHARD_TAG, "step": 1, "rank": 0, "size": len(evil), "skeleton": {"__t": 0},
             "entries": [{"kind": "numpy", "dtype": "|u1", "shape": [len(evil)], "offset": 0, "nbytes": len(evil)}]}
    (d / "rank-00000.json").write_text(json.dumps(index))
    code, files = _scan(d)
    assert code == 6 and files["rank-00000.bin"]["format"] == "hpcml-ckpt", files
    assert files["rank-00000.bin"]["findings"][0]["member"] == "@0 read as a plain pickle"
    (d / "rank-00000.json").write_text(json.dumps({**index, "size": len(evil) + 1}))
    code, files = _scan(d)
    assert code == 7 and "does not describe this shard" in files["rank-00000.bin"]["errors"][0], files
    assert not marker.exists()


def test_an_index_beside_a_torch_zip_a_protocol_0_or_a_legacy_stream_does_not_make_it_pass(tmp_path):
    """What torch.load or pickle.load of the .bin would run, ignoring the index: a torch zip,
    a protocol 0 pickle (no header), a benign leaf at offset 0 followed by the pickles legacy
    torch.load reads next. Each passed as raw bytes with a forged index beside it."""
    import io
    import pickle
    import zipfile
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", payloads.assemble(2, payloads.os_system_call(marker)))
    zipped = buf.getvalue()
    proto0 = payloads.assemble(0, payloads.os_system_call(marker, protocol=0))
    magic = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
    legacy = magic + pickle.dumps(1001, protocol=2) + pickle.dumps({}, protocol=2) \
        + payloads.assemble(2, payloads.os_system_call(marker))
    for n, raw, entries in (
            (1, zipped, [{"kind": "bytes", "dtype": "u1", "shape": [len(zipped)], "offset": 0, "nbytes": len(zipped)}]),
            (2, proto0, [{"kind": "bytes", "dtype": "u1", "shape": [len(proto0)], "offset": 0, "nbytes": len(proto0)}]),
            (3, legacy, [{"kind": "pickle", "dtype": "u1", "shape": [len(magic)], "offset": 0, "nbytes": len(magic)},
                         {"kind": "bytes", "dtype": "u1", "shape": [len(legacy) - len(magic)], "offset": len(magic),
                          "nbytes": len(legacy) - len(magic)}])):
        d = tmp_path / f"step-0000000{n}"
        d.mkdir()
        (d / "rank-00000.bin").write_bytes(raw)
        (d / "rank-00000.json").write_text(json.dumps({
            "schema": layout.SHARD_TAG, "step": n, "rank": 0, "size": len(raw), "entries": entries,
            "skeleton": [{"__t": i} for i in range(len(entries))]}))
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=120)
    files = {Path(f["path"]).parent.name: f for f in json.loads(out.stdout)["files"] if f["path"].endswith(".bin")}
    assert out.returncode == 6 and len(files) == 3, out.stdout
    for f in files.values():
        assert f["verdict"] == "dangerous" and f["format"] == "hpcml-ckpt", f
    assert not marker.exists()
    # tensor bytes that start like an unregistered copyreg extension (1 in 80 random ones) stay data
    with Checkpointer(tmp_path / "ck") as c:
        c.save({"w": np.frombuffer(bytes([0x82, 0x0C, 0x0B]) * 100, dtype=np.uint8)}, 1)
    assert _scan(tmp_path / "ck")[0] == 0
