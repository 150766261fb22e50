"""Archives beyond what the corpus covers: WebDataset-style tar shards, nested zips."""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
import zipfile

import pytest

from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests.hostile_tars import B_SIZE, HUGE, gnu_size_tar, huge_extended_header, pax_size_tar

EVIL = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."


def _tar(path, members):
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_webdataset_shard_with_a_pickled_sample(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    _tar(shard, [("000.jpg", b"\xff\xd8" + b"x" * 100), ("000.cls", b"3"),
                 ("000.pyd", pickle.dumps({"label": 3})), ("001.pyd", EVIL)])
    res = scan_file(shard)
    assert res.format == "tar" and res.verdict is Verdict.DANGEROUS
    assert [(f.name, f.location.member) for f in res.findings] == [("os.system", "001.pyd")]


def test_clean_shard_is_safe(tmp_path):
    shard = tmp_path / "clean.tar"
    _tar(shard, [("000.txt", b"hello"), ("000.pyd", pickle.dumps([1, 2, 3]))])
    assert scan_file(shard).verdict is Verdict.SAFE


def test_zip_inside_tar_inside_zip(tmp_path):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as zf:
        zf.writestr("weights/odd.name", EVIL)
    mid = tmp_path / "mid.tar"
    _tar(mid, [("inner.zip", inner.getvalue())])
    outer = tmp_path / "outer.zip"
    with zipfile.ZipFile(outer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(mid, "mid.tar")
    res = scan_file(outer)
    assert res.verdict is Verdict.DANGEROUS
    assert res.findings[0].location.member == "mid.tar!inner.zip!weights/odd.name"


def test_corrupt_zip_is_an_error(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    res = scan_file(bad)
    assert res.verdict is Verdict.ERROR and "zip" in res.errors[0]


def test_fifo_is_listed_not_read(tmp_path):
    """A named pipe would block a reader forever: it is an error, not a hang."""
    import os
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    res = scan_file(fifo)
    assert res.verdict is Verdict.ERROR and "regular file" in res.errors[0]


def test_a_scanner_bug_fails_closed(tmp_path, monkeypatch):
    from hpcml.scan import scanner

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(scanner.pickles, "scan_stream", broken)
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps([1], protocol=4))
    res = scan_file(path)
    assert res.verdict is Verdict.ERROR and "internal error" in res.errors[0]


def test_archives_nested_too_deep_are_an_error(tmp_path):
    data = EVIL
    for level in range(6):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(f"level{level}", data)
        data = buf.getvalue()
    path = tmp_path / "deep.zip"
    path.write_bytes(data)
    res = scan_file(path)
    assert res.verdict is not Verdict.SAFE
    assert any("nested more than" in e for e in res.errors)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped"])
@pytest.mark.parametrize("build", [pax_size_tar, gnu_size_tar], ids=["pax size", "gnu base-256 size"])
def test_a_member_claiming_10_20_bytes_is_an_error_naming_it(tmp_path, build, gz):
    """Plain: tarfile would raise a ValueError past 2**63 (an internal error); gzipped, its
    stream skip would spin for ever. Both are an error naming the member, at once."""
    raw = build(HUGE)
    shard = tmp_path / ("s.tar.gz" if gz else "s.tar")
    shard.write_bytes(gzip.compress(raw) if gz else raw)
    res = scan_file(shard)
    assert res.verdict is Verdict.ERROR
    assert "member 'b.txt' claims 100,000,000,000,000,000,000 bytes" in res.errors[0], res.errors


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax x", "gnu L"])
def test_an_extended_header_claiming_10_20_bytes_is_an_error(tmp_path, fmt):
    shard = tmp_path / "s.tar"
    shard.write_bytes(huge_extended_header(fmt))
    res = scan_file(shard)
    assert res.verdict is Verdict.ERROR and "extended header" in res.errors[0], res.errors


@pytest.mark.parametrize("build", [pax_size_tar, gnu_size_tar], ids=["pax size", "gnu base-256 size"])
def test_honest_pax_and_base256_sizes_scan_clean(tmp_path, build):
    shard = tmp_path / "s.tar"
    shard.write_bytes(build(B_SIZE))
    assert scan_file(shard).verdict is Verdict.SAFE
