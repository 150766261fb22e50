"""Conformance on shards webdataset's own tests use (../shared/testdata/webdataset,
PROVENANCE.md there): each is indexed (to tmp_path: the shards are read-only), read with
the samples and fields webdataset groups, resumed exactly mid-epoch, staged, doctored;
the MosaicML MDS sets are refused in one line and not advised to be packed."""

from __future__ import annotations

import gzip
import shutil

import pytest

from hpcml.data import ShardDataset
from hpcml.data.doctor import detect_resources, diagnose
from hpcml.data.manifest import load_manifest
from hpcml.data.stage import stage
from hpcml.data.wdsindex import index_shards
from hpcml.errors import UsageError
from tests.needs import shared_testdata

ROOT = shared_testdata("webdataset")
WDS = ROOT / "webdataset-testdata"
MDS = [ROOT / "mosaicml-streaming/tests/resources/naive_MDSdataset",
       *sorted((ROOT / "mosaicml-streaming/scripts/joining/sample_dataset").iterdir())]
# file: (samples, fields), as PROVENANCE.md says
SHARDS = {"compressed.tar": (3, {"txt.gz"}), "mpdata.tar": (100, {"mp"}), "sample.tgz": (90, {"cls", "png"}),
          "tendata.tar": (100, {"ten"}), "testgz.tar": (1000, {"txt.gz"})}


def _read(path, **kw):
    return list(ShardDataset(path, rank=0, world_size=1, drop_last=False, **kw))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    out = {}
    for name in SHARDS:
        out[name] = index_shards([str(WDS / name)], tmp_path_factory.mktemp(name.replace(".", "-"))).out
    return out


@pytest.mark.parametrize("name", sorted(SHARDS))
def test_samples_and_fields_as_the_producer_says(indexed, name):
    n, fields = SHARDS[name]
    samples = _read(indexed[name], shuffle=False)
    assert len(samples) == n == load_manifest(indexed[name]).samples
    assert all(set(s) - {"__key__", "__shard__", "__index__"} == fields for s in samples)
    assert len({s["__key__"] for s in samples}) == n
    if name == "compressed.tar":                    # test_compat.py test_gz
        assert samples[0]["__key__"] == "compressed/0001"
        assert gzip.decompress(samples[0]["txt.gz"]) == b"hello\n"
    if name == "tendata.tar":                       # test_pipeline.py test_tenbin_dec: two float64 28x28
        assert all(len(s["ten"]) >= 2 * 28 * 28 * 8 for s in samples)


@pytest.mark.parametrize("name", sorted(SHARDS))
def test_same_samples_as_webdataset(indexed, name):
    wds = pytest.importorskip("webdataset")
    theirs = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
              for s in wds.WebDataset(str(WDS / name), shardshuffle=False, empty_check=False)}
    ours = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in _read(indexed[name])}
    assert ours == theirs


@pytest.mark.parametrize("name", sorted(SHARDS))
def test_resume_mid_epoch_is_exact(indexed, name):
    kw = dict(seed=11, block_bytes=8192, window=2)
    full = [s["__key__"] for s in _read(indexed[name], **kw)]
    first = ShardDataset(indexed[name], rank=0, world_size=1, drop_last=False, **kw)
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(len(full) // 2)]
    again = ShardDataset(indexed[name], rank=0, world_size=1, drop_last=False, **kw)
    again.load_state_dict(first.state_dict())
    assert head + [s["__key__"] for s in again] == full


def test_all_shards_in_one_set_are_staged_and_read_back(tmp_path):
    r = index_shards([str(WDS)], tmp_path / "idx")
    assert [s.name for s in r.manifest.shards] == [str(WDS / n) for n in sorted(SHARDS)]
    res = stage(tmp_path / "idx", str(tmp_path / "local"), env={})
    assert res.staged and res.dataset == r.manifest.dataset
    staged = _read(res.path, shuffle=False)
    assert len(staged) == sum(n for n, _f in SHARDS.values())
    assert [s["__key__"] for s in staged] == [s["__key__"] for s in _read(tmp_path / "idx", shuffle=False)]


def test_read_only_shard_directory_is_not_written(tmp_path):
    if not WDS.stat().st_mode & 0o222:
        with pytest.raises(UsageError, match="read-only"):
            index_shards([str(WDS)])
    assert sorted(p.name for p in WDS.iterdir()) == sorted(SHARDS)


def test_unindexed_shards_say_how_to_index():
    with pytest.raises(UsageError, match="hpcml data index"):
        ShardDataset(WDS)


def test_doctor_reads_them_as_shards_not_loose_files():
    rep = diagnose(WDS, detect_resources(ram_free=1 << 34, local_free=1 << 40))
    assert rep.scan.shards == 5 and rep.scan.compressed_shards == 1
    assert not rep.recommendation.pack and "hpcml data index" in rep.recommendation.pack_reason


@pytest.mark.parametrize("path", MDS, ids=lambda p: p.name)
def test_mds_is_refused_in_one_line_and_not_packed(path, tmp_path):
    with pytest.raises(UsageError, match="MosaicML streaming"):
        ShardDataset(path)
    rep = diagnose(path, detect_resources(ram_free=1 << 34, local_free=1 << 40))
    assert rep.scan.mds_files and not rep.recommendation.pack and "MDS" in rep.recommendation.pack_reason
    with pytest.raises(UsageError, match="MosaicML streaming"):
        stage(path, str(tmp_path / "local"), env={})
    shutil.rmtree(tmp_path / "local", ignore_errors=True)
