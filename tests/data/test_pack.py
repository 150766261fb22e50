"""Packing: the WebDataset convention, the index, the manifest, resume and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile

import pytest
from typer.testing import CliRunner

from hpcml.data.index import header_problem, index_name, load_index
from hpcml.data.manifest import load_manifest
from hpcml.data.pack import pack
from hpcml.data.reader import ShardDataset
from hpcml.errors import UsageError
from tests import needs
from tests.data.gen import make_files, make_shards


def _files(src):
    return {str(p.relative_to(src)): p.read_bytes() for p in src.rglob("*") if p.is_file()}


def test_round_trip_every_sample_byte_identical(tmp_path):
    src, dst = make_shards(tmp_path, samples=400, target=500_000)
    m = load_manifest(dst)
    assert len(m.shards) > 3 and m.samples == 400 and m.fields == ["cls", "jpg"]
    seen = {}
    for s in ShardDataset(dst, shuffle=False, rank=0, world_size=1):
        for ext in ("jpg", "cls"):
            seen[f"{s['__key__']}.{ext}"] = s[ext]
    assert seen == _files(src)


def test_webdataset_reads_the_shards_unchanged(tmp_path):
    import webdataset as wds
    src, dst = make_shards(tmp_path, samples=250, target=400_000)
    urls = [str(dst / s.name) for s in load_manifest(dst).shards]
    got = {s["__key__"]: (s["jpg"], s["cls"]) for s in wds.WebDataset(urls, shardshuffle=False)}
    assert len(got) == 250
    for key, (jpg, cls) in got.items():
        assert jpg == (src / f"{key}.jpg").read_bytes() and cls == (src / f"{key}.cls").read_bytes()


def test_index_points_at_the_members_and_checksums_match(tmp_path):
    _src, dst = make_shards(tmp_path, samples=120, target=300_000)
    m = load_manifest(dst)
    for entry in m.shards:
        data = (dst / entry.name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256 and len(data) == entry.bytes
        idx = load_index(dst / entry.index)
        with tarfile.open(dst / entry.name) as tf:
            members = {mem.name: (mem.offset_data, mem.size) for mem in tf.getmembers()}
        for key, fields in zip(idx.keys, idx.members):
            for ext, off, size in fields:
                assert members[f"{key}.{ext}"] == (off, size)
                assert header_problem(data, off - 512, size) is None
        assert list(idx.starts[1:]) == list(idx.ends[:-1])     # samples tile the shard


def test_long_and_unicode_names_round_trip(tmp_path):
    src = tmp_path / "src"
    deep = src / ("d" * 80) / "sous-dossier-é"
    deep.mkdir(parents=True)
    (deep / ("x" * 120 + ".txt")).write_bytes(b"long")
    (src / "ça.va.json").write_bytes(b"{}")
    pack(src, tmp_path / "out", target_bytes=10_000)
    got = {s["__key__"]: s for s in ShardDataset(tmp_path / "out", shuffle=False, rank=0, world_size=1)}
    assert got[f"{'d' * 80}/sous-dossier-é/{'x' * 120}"]["txt"] == b"long"
    assert got["ça"]["va.json"] == b"{}"


def test_rerun_keeps_finished_shards_and_rewrites_changed_ones(tmp_path):
    src, dst = make_shards(tmp_path, samples=200, target=300_000)
    first = load_manifest(dst)
    again = pack(src, dst, target_bytes=300_000)
    assert again.written == 0 and again.reused == len(first.shards)
    assert again.manifest.dataset == first.dataset
    (dst / first.shards[1].name).unlink()                               # a shard lost mid-way
    victim = next(iter(sorted(src.rglob("*.jpg"))))
    victim.write_bytes(victim.read_bytes()[:-1] + b"!")                 # a source edited
    os.utime(victim, ns=(1, 1))
    third = pack(src, dst, target_bytes=300_000)
    assert third.written == 2 and third.reused == len(first.shards) - 2
    assert third.manifest.dataset != first.dataset


def test_repack_with_fewer_shards_removes_stale_ones(tmp_path):
    src, dst = make_shards(tmp_path, samples=200, target=200_000)
    many = len(load_manifest(dst).shards)
    pack(src, dst, target_bytes=10**9)
    assert len(load_manifest(dst).shards) == 1 < many
    assert sorted(p.name for p in dst.glob("shard-*")) == ["shard-000000.idx.json", "shard-000000.tar"]


def test_unreadable_files_are_listed_and_stop_the_pack(tmp_path):
    src = make_files(tmp_path / "src", 20)
    (src / "class0" / "gone.jpg").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError) as err:
        pack(src, tmp_path / "out")
    assert "gone.jpg" in str(err.value) and "1 unreadable" in str(err.value)
    assert "gone.jpg" in (tmp_path / "out" / "unreadable.txt").read_text()
    r = pack(src, tmp_path / "out", skip_unreadable=True)
    assert r.manifest.samples == 20
    assert any(s["path"].endswith("gone.jpg") for s in r.manifest.skipped)


def test_files_webdataset_cannot_group_are_listed_not_dropped(tmp_path):
    src = make_files(tmp_path / "src", 5)
    (src / "README").write_text("x")
    (src / ".hidden").write_text("x")
    r = pack(src, tmp_path / "out")
    assert sorted(s["path"] for s in r.manifest.skipped) == [".hidden", "README"]


@pytest.mark.parametrize("case", ["missing", "inside"])
def test_bad_paths_are_refused(tmp_path, case):
    src = make_files(tmp_path / "src", 3)
    with pytest.raises(UsageError):
        pack(tmp_path / "nope" if case == "missing" else src, src / "out")


def _cli():
    from hpcml.cli import app
    return CliRunner(), app


def test_cli_pack_json_and_bad_size(tmp_path):
    runner, app = _cli()
    src = make_files(tmp_path / "src", 30)
    r = runner.invoke(app, ["data", "pack", str(src), str(tmp_path / "out"), "--shard-size", "100 kB", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["samples"] == 30 and doc["shards"] == len(load_manifest(tmp_path / "out").shards) > 1
    r = runner.invoke(app, ["data", "pack", str(src), str(tmp_path / "o2"), "--shard-size", "lots"])
    assert r.exit_code == 2 and "shard-size" in r.output and "Traceback" not in r.output


def test_squashfs_image_holds_every_file(tmp_path):
    needs.tool("mksquashfs", what="squashfs-tools")
    runner, app = _cli()
    src = make_files(tmp_path / "src", 40)
    image = tmp_path / "ds.sqsh"
    r = runner.invoke(app, ["data", "pack", str(src), str(image), "--format", "squashfs", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["files"] == 80
    out = tmp_path / "unpacked"
    subprocess.run(["unsquashfs", "-q", "-d", str(out), str(image)], check=True, capture_output=True)
    assert _files(out) == _files(src)


def test_packing_another_source_into_a_dataset_is_refused_unless_overwrite(tmp_path):
    """Issue 19: a second source packed into DST silently replaced the first dataset."""
    runner, app = _cli()
    a, dst = make_shards(tmp_path / "a", samples=60, target=100_000)
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    b = make_files(tmp_path / "b" / "src", 20)
    r = runner.invoke(app, ["data", "pack", str(b), str(dst)])
    assert r.exit_code == 2 and "holds a dataset packed from" in r.output and str(a.resolve()) in r.output
    assert "--overwrite" in r.output and "Traceback" not in r.output
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before          # nothing lost
    assert pack(a, dst, target_bytes=100_000).reused == len(load_manifest(dst).shards)   # the same source resumes
    r = runner.invoke(app, ["data", "pack", str(b), str(dst), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert load_manifest(dst).samples == 20


def test_a_pack_killed_at_random_leaves_no_partial_shard(tmp_path):
    """Issue 61: 40 packs killed with SIGKILL at random moments, each into a directory of
    its own, then packed there again: no ``.part`` shard anywhere, and every shard under its own name is whole (its
    size is the one its index records)."""
    from tests.killloop import kill_loop

    src = tmp_path / "raw"
    for i in range(120):
        (src / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 3}" / f"s{i:04d}.bin").write_bytes(os.urandom(20_000))
    out = tmp_path / "out"

    def work(i):
        pack(src, out / f"{os.getpid()}-{i}", target_bytes=300_000, jobs=1)
    k = kill_loop(work)
    assert k.killed == 40 and k.done > 0, k
    for part in out.rglob(".*.part"):                 # only ever a whole shard, killed between its
        doc = json.loads((part.parent / index_name(part.name[1:-5])).read_text())    # link and rename
        assert part.stat().st_size == doc["bytes"], part
    for to in out.iterdir():                          # the next pack there
        pack(src, to, target_bytes=300_000, jobs=1)
    whole = 0
    for p in out.rglob("*"):
        assert not p.name.endswith(".part"), p
    for idx in out.rglob("*.json"):
        doc = json.loads(idx.read_text())
        if idx.name == "manifest.json" or not isinstance(doc, dict) or "shard" not in doc:
            continue
        tar = idx.parent / doc["shard"]
        if tar.is_file():
            assert tar.stat().st_size == doc["bytes"], tar
            whole += 1
    assert whole > 0
