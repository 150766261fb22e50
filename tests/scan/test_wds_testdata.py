"""``hpcml scan`` on shards webdataset's own tests use and on MosaicML MDS sets
(../shared/testdata/webdataset): members read as their WebDataset field says, clean."""

from __future__ import annotations

import pytest

from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests.needs import shared_testdata

ROOT = shared_testdata("webdataset")
SHARDS = {"compressed.tar": 3, "mpdata.tar": 100, "sample.tgz": 180, "tendata.tar": 100, "testgz.tar": 1000}


@pytest.mark.parametrize("name", sorted(SHARDS))
def test_plain_shards_are_safe(name):
    res = scan_file(ROOT / "webdataset-testdata" / name)
    assert res.verdict is Verdict.SAFE and not res.errors and not res.findings, (res.errors, res.findings)
    assert res.format.startswith("tar")
    assert any(f"{SHARDS[name]} members read as the data" in n for n in res.notes)


@pytest.mark.parametrize("shard", sorted((ROOT / "mosaicml-streaming").rglob("*.mds")), ids=str)
def test_mds_shards_are_judged_by_their_encodings(shard):
    res = scan_file(shard)
    assert res.format == "mds" and res.verdict is Verdict.SAFE and not res.errors
    assert any("none unpickles" in n for n in res.notes)
