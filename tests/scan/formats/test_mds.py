"""MosaicML MDS shards judged by the encodings in the index.json beside them."""

from __future__ import annotations

import json

from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file


def mds(tmp_path, encodings, sub=""):
    d = tmp_path / sub if sub else tmp_path
    d.mkdir(parents=True, exist_ok=True)
    (d / "shard.00000.mds").write_bytes(b"\x02\x00\x00\x00" + bytes(40))
    shard = {"column_encodings": encodings, "column_names": [f"c{i}" for i in range(len(encodings))],
             "format": "mds", "raw_data": {"basename": f"{sub + '/' if sub else ''}shard.00000.mds"}}
    (tmp_path / "index.json").write_text(json.dumps({"version": 2, "shards": [shard]}))
    return d / "shard.00000.mds"


def test_data_columns_are_safe(tmp_path):
    res = scan_file(mds(tmp_path, ["str", "int32", "ndarray:float64", "jpeg"]))
    assert res.format == "mds" and res.verdict is Verdict.SAFE


def test_a_pickled_column_is_not_scanned(tmp_path):
    res = scan_file(mds(tmp_path, ["str", "pkl"], sub="25"))    # named from the parent's index.json
    assert res.format == "mds" and res.verdict is Verdict.NOT_SCANNED and "c1 (pkl)" in res.findings[0].name


def test_an_unknown_encoding_is_not_scanned(tmp_path):
    assert scan_file(mds(tmp_path, ["mylab_codec"])).verdict is Verdict.NOT_SCANNED


def test_without_an_index_it_is_not_claimed(tmp_path):
    (tmp_path / "shard.00000.mds").write_bytes(bytes(64))
    assert scan_file(tmp_path / "shard.00000.mds").format != "mds"


def _mds_shard(samples: list[dict]) -> bytes:
    """A shard as streaming's MDSWriter lays it out (columns ``text: str``, ``label: int32``):
    a uint32 sample count, uint32 offsets of each sample and of the end, then each sample:
    uint32 sizes of its variable-size columns, then each column's bytes."""
    import struct
    encoded = []
    for s in samples:
        text = s["text"].encode()
        encoded.append(struct.pack("<I", len(text)) + text + struct.pack("<i", s["label"]))
    start = 4 + 4 * (len(samples) + 1)
    offsets = [start]
    for e in encoded:
        offsets.append(offsets[-1] + len(e))
    return struct.pack(f"<I{len(offsets)}I", len(samples), *offsets) + b"".join(encoded)


def test_a_pickle_named_as_a_data_shard_is_judged_as_torch_load_would_read_it(tmp_path):
    """An index.json says the shard holds data columns, but its bytes are a pickle that runs a
    command: torch.load or pickle.load of it would run it, so it is dangerous (was: safe,
    never read). A shard laid out as MDSWriter writes it stays safe."""
    path = mds(tmp_path, ["str", "int32"])
    path.write_bytes(_mds_shard([{"text": "hello", "label": 1}, {"text": "world", "label": 2}]))
    assert scan_file(path).verdict is Verdict.SAFE
    cmd = b"touch /nonexistent/ran"
    path.write_bytes(b"\x80\x02cposix\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R.")
    res = scan_file(path)
    assert res.format == "mds" and res.verdict is Verdict.DANGEROUS, res
