"""Shard sets in object storage (``s3://bucket/prefix``) against a real S3 server
(moto_server behind a fault proxy: tests/s3server.py): shards made by ``hpcml data pack`` and
by webdataset's TarWriter, uploaded, indexed in the bucket or into a local directory, read by
``ShardDataset`` with ranged GETs in the same order and per-rank split as from the
filesystem, resumed exactly, staged once per node with their checksums; a missing bucket,
a shard changed under the index and a throttled endpoint, each as a user meets them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.data.pack import pack
from hpcml.data.reader import ShardDataset
from hpcml.data.stage import stage
from tests.data.gen import make_files
from tests.data.test_wdsindex import webdataset_samples, write_tar

ROOT = Path(__file__).resolve().parents[2]


def _upload(s3v, directory: Path, prefix: str, only_tars: bool = True) -> None:
    c = s3v.client()
    for p in sorted(directory.iterdir()):
        if p.is_file() and (p.suffix == ".tar" or not only_tars):
            c.upload_file(str(p), s3v.bucket, f"{prefix}/{p.name}")


def _cli(s3v, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=str(ROOT / "src"), **s3v.env())
    return subprocess.run([sys.executable, "-m", "hpcml", "data", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def _keys_and_bytes(ds: ShardDataset) -> list[tuple[str, tuple]]:
    return [(s["__key__"], tuple(sorted((k, v) for k, v in s.items() if not k.startswith("__")))) for s in ds]


@pytest.fixture
def packed(tmp_path) -> Path:
    make_files(tmp_path / "raw", samples=300, seed=3, lo=100, hi=9000)
    pack(tmp_path / "raw", tmp_path / "shards", target_bytes=128 * 1024, jobs=2)
    return tmp_path / "shards"


def test_a_packed_set_in_a_bucket_reads_as_from_the_filesystem_and_resumes_exactly(s3, packed, tmp_path):
    _upload(s3, packed, "ds")
    p = _cli(s3, "index", s3.url("ds"), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["manifest"] == f"{s3.url('ds')}/manifest.json"
    for rank in (0, 1):
        kw = dict(seed=11, rank=rank, world_size=2, block_bytes=32 * 1024, window=4)
        here = _keys_and_bytes(ShardDataset(packed, **kw))
        there = _keys_and_bytes(ShardDataset(s3.url("ds"), **kw))
        assert there == here and len(there) > 100                  # same order, same split, same bytes
    kw = dict(seed=11, rank=0, world_size=1, block_bytes=32 * 1024, window=4)
    full = [s["__key__"] for s in ShardDataset(s3.url("ds"), **kw)]
    first = ShardDataset(s3.url("ds"), **kw)
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(57)]
    again = ShardDataset(s3.url("ds"), **kw)
    again.load_state_dict(first.state_dict())
    assert head + [s["__key__"] for s in again] == full


def test_webdataset_shards_in_a_bucket_indexed_into_a_directory_read_and_stage_equal(s3, tmp_path):
    src = tmp_path / "wds"
    src.mkdir()
    for n in range(3):
        write_tar(src / f"shard-{n:06d}.tar", [(f"s{n}-{i:03d}.{ext}", os.urandom(500 + 37 * i))
                                               for i in range(40) for ext in ("jpg", "cls")])
    _upload(s3, src, "wds")
    p = _cli(s3, "index", s3.url("wds"), "--out", str(tmp_path / "idx"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = ShardDataset(tmp_path / "idx", shuffle=False, rank=0, world_size=1, drop_last=False)
    mine = sorted((s["__key__"], s["jpg"], s["cls"]) for s in got)
    theirs = sorted((s["__key__"], s["jpg"], s["cls"]) for s in webdataset_samples(sorted(src.glob("*.tar"))))
    assert mine == theirs and len(mine) == 120
    res = stage(tmp_path / "idx", str(tmp_path / "local"), env={})             # shards fetched from the bucket
    assert res.staged and res.files_copied >= 6
    for n in range(3):
        assert (Path(res.path) / f"shard-{n:06d}.tar").read_bytes() == (src / f"shard-{n:06d}.tar").read_bytes()
    staged = sorted((s["__key__"], s["jpg"], s["cls"]) for s in ShardDataset(res.path, shuffle=False, rank=0,
                                                                               world_size=1, drop_last=False))
    assert staged == mine


def test_staging_from_a_bucket_copies_once_with_checksums_and_refuses_a_changed_shard(s3, packed, tmp_path):
    _upload(s3, packed, "st")
    assert _cli(s3, "index", s3.url("st"), cwd=tmp_path).returncode == 0
    p = _cli(s3, "stage", s3.url("st"), "--local", "--to", str(tmp_path / "local"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    copy = Path(p.stdout.strip().splitlines()[-1])
    for tar in packed.glob("*.tar"):
        assert (copy / tar.name).read_bytes() == tar.read_bytes()
    again = stage(s3.url("st"), str(tmp_path / "local"), env={})
    assert again.files_copied == 0 and again.path == str(copy)                # once per node
    first = sorted(packed.glob("*.tar"))[0].name
    s3.client().put_object(Bucket=s3.bucket, Key=f"st/{first}", Body=b"changed" * 1000)   # under the index
    p = _cli(s3, "stage", s3.url("st"), "--local", "--to", str(tmp_path / "other"), cwd=tmp_path)
    assert p.returncode == 2 and "checksum mismatch" in p.stderr and f"st/{first}" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "other").exists() or not list((tmp_path / "other").rglob(first))


def test_a_missing_bucket_is_one_line_and_a_throttled_endpoint_is_retried(s3, packed, tmp_path):
    p = _cli(s3, "index", "s3://hpcml-no-such-bucket/ds", cwd=tmp_path)
    assert p.returncode == 2 and "s3://hpcml-no-such-bucket/ds: no such bucket" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    _upload(s3, packed, "slow")
    assert _cli(s3, "index", s3.url("slow"), cwd=tmp_path).returncode == 0
    kw = dict(seed=2, rank=0, world_size=1, block_bytes=32 * 1024, window=4)
    s3.proxy.fail_next = 4                                                     # 503 SlowDown, then answers
    assert _keys_and_bytes(ShardDataset(s3.url("slow"), **kw)) == _keys_and_bytes(ShardDataset(packed, **kw))
    assert s3.proxy.failed == 4


def test_an_index_elsewhere_in_the_bucket_stages_to_a_copy_read_locally_and_packs_are_not_reindexed(s3, packed, tmp_path):
    """Indexed into another prefix (the shards' names then URLs): the staged copy's manifest
    names the copies beside it, so the copy is read from the node, not from the bucket; a
    shard set that hpcml data pack made (its manifest uploaded too) is not indexed over."""
    _upload(s3, packed, "raw")
    assert _cli(s3, "index", s3.url("raw"), "--out", s3.url("idx"), cwd=tmp_path).returncode == 0
    res = stage(s3.url("idx"), str(tmp_path / "local"), env={})
    staged = json.loads((Path(res.path) / "manifest.json").read_text())
    assert all("/" not in s["name"] for s in staged["shards"])
    kw = dict(seed=4, rank=0, world_size=1, block_bytes=32 * 1024, window=4)
    s3.proxy.fail_all = True                                                   # the bucket gone: the copy still reads
    try:
        assert _keys_and_bytes(ShardDataset(res.path, **kw)) == _keys_and_bytes(ShardDataset(packed, **kw))
    finally:
        s3.proxy.fail_all = False
    _upload(s3, packed, "packed", only_tars=False)
    p = _cli(s3, "index", s3.url("packed"), cwd=tmp_path)
    assert p.returncode == 2 and "made by 'hpcml data pack'" in p.stderr, p.stderr


def test_a_shard_cut_short_in_the_bucket_is_skipped_as_on_the_filesystem(s3, packed, tmp_path):
    _upload(s3, packed, "cut")
    assert _cli(s3, "index", s3.url("cut"), cwd=tmp_path).returncode == 0
    first = sorted(packed.glob("*.tar"))[0]
    s3.client().put_object(Bucket=s3.bucket, Key=f"cut/{first.name}", Body=first.read_bytes()[:1024])
    ds = ShardDataset(s3.url("cut"), seed=1, rank=0, world_size=1, block_bytes=32 * 1024, window=4, on_corrupt="skip")
    with pytest.warns(UserWarning, match=f"s3://{s3.bucket}/cut/{first.name}: offset .*skipping corrupt"):
        got = list(ds)
    assert ds.skipped > 0 and len(got) + ds.skipped == len(ShardDataset(packed, seed=1, rank=0, world_size=1))


def test_the_doctor_reads_a_bucket_as_it_reads_a_directory(s3, packed, tmp_path):
    """The same dataset uploaded (small files in class folders, then the shards of it, then
    nanoGPT's token arrays): the doctor's counts and its advice are the directory's."""
    from tests.data.test_doctor import _nanogpt
    c = s3.client()
    raw = packed.parent / "raw"
    for p in sorted(raw.rglob("*")):
        if p.is_file():
            c.upload_file(str(p), s3.bucket, f"raw/{p.relative_to(raw).as_posix()}")
    _upload(s3, packed, "shards", only_tars=False)                         # the manifest and indexes too
    _nanogpt(tmp_path / "owt")
    for p in (tmp_path / "owt").iterdir():
        c.upload_file(str(p), s3.bucket, f"owt/{p.name}")
    for prefix, local in (("raw", raw), ("shards", packed), ("owt", tmp_path / "owt")):
        p = _cli(s3, "doctor", s3.url(prefix), "--json", "--readers", "4", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        there = json.loads(p.stdout)
        here = json.loads(_cli(s3, "doctor", str(local), "--json", "--readers", "4", cwd=tmp_path).stdout)
        for key in ("files", "bytes", "samples", "shards", "token_arrays", "largest_sample_bytes", "indexed"):
            assert there["scan"][key] == here["scan"][key], (prefix, key)
        assert there["recommendation"]["pack"] == here["recommendation"]["pack"], prefix
    assert "memmapped token array" in there["recommendation"]["pack_reason"]


def test_bench_measures_the_stores_ceiling_and_the_loader_against_it(s3, packed, tmp_path):
    """hpcml data bench on a shard set in the bucket: the ceiling is whole-object GETs, the
    passes read every sample by ranged GETs (sequential and shuffled), the ratio is said."""
    _upload(s3, packed, "bench")
    assert _cli(s3, "index", s3.url("bench"), cwd=tmp_path).returncode == 0
    p = _cli(s3, "bench", s3.url("bench"), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    total = len(ShardDataset(packed, rank=0, world_size=1, drop_last=False))
    assert doc["kind"] == "shards" and doc["mount"]["fstype"] == "s3"
    assert doc["ceiling"]["method"] == "objects" and doc["ceiling"]["bytes"] == sum(t.stat().st_size for t in packed.glob("*.tar"))
    assert {x["order"] for x in doc["passes"]} == {"sequential", "shuffled"}
    assert all(x["samples"] >= total - 1 and x["reads"] > 0 for x in doc["passes"]), doc["passes"]
    assert any("over the network" in n for n in doc["notes"]), doc["notes"]


def test_a_forged_index_in_a_bucket_reads_no_more_than_the_object_holds(s3, packed, tmp_path, monkeypatch):
    """An index whose last sample ends at 10**15, and one whose last sample lies past the
    object's end: the ranged GETs go slice by slice (``OBJECT_SLICE``), so memory follows
    what the object holds (was: a MemoryError asking for a petabyte); a sample past the
    end is corrupt, naming the object and the offset."""
    from hpcml.data import CorruptShardError, reader
    monkeypatch.setattr(reader, "OBJECT_SLICE", 64 << 10)
    _upload(s3, packed, "forged")
    assert _cli(s3, "index", s3.url("forged"), cwd=tmp_path).returncode == 0
    kw = dict(seed=1, rank=0, world_size=1, block_bytes=32 * 1024, window=4)
    expected = _keys_and_bytes(ShardDataset(packed, **kw))
    c = s3.client()
    first = sorted(packed.glob("*.tar"))[0]
    key = f"forged/{first.name[:-len('.tar')]}.idx.json"
    doc = json.loads(c.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    doc["samples"][-1][2] = 10**15
    c.put_object(Bucket=s3.bucket, Key=key, Body=json.dumps(doc).encode())
    assert _keys_and_bytes(ShardDataset(s3.url("forged"), **kw)) == expected
    row = doc["samples"][-1]
    row[1:] = [10**12, 2 * 10**12, [[row[3][0][0], 10**12 + 512, 10]]]
    c.put_object(Bucket=s3.bucket, Key=key, Body=json.dumps(doc).encode())
    with pytest.raises(CorruptShardError) as caught:
        list(ShardDataset(s3.url("forged"), **kw))
    assert caught.value.offset == 10**12 and f"forged/{first.name}" in str(caught.value)
