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
