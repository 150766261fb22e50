"""Tar members read as their WebDataset field says (as webdataset's decoders read them),
and by content where the bytes do not fit the field; compressed shards read as streams."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import tarfile

import pytest

from hpcml.scan.formats import tarred
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file

EVIL = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."
MSGPACK = bytes([0x82, 0xA1, 0x61, 0x01, 0xA1, 0x62, 0x93, 0x01, 0x02, 0x03])   # {"a": 1, "b": [1, 2, 3]}


def shard(path, members, mode="w"):
    with tarfile.open(path, mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_data_fields_are_not_walked_as_pickles(tmp_path):
    """The text and msgpack that a pickle walk misread (an 0x80 fixmap, a newline opcode)."""
    res = scan_file(shard(tmp_path / "s.tar", [
        ("d/000.mp", MSGPACK), ("d/000.txt", b"\n(line one)\n"), ("d/000.json", json.dumps({"x": 1}).encode()),
        ("d/000.cls", b"7"), ("d/000.png", b"\x89PNG\r\n\x1a\n" + bytes(40)), ("d/000.ten", b"~TenBin~" + bytes(64)),
        ("d/000.txt.gz", gzip.compress(b"hello\n"))]))
    assert res.verdict is Verdict.SAFE and not res.errors and not res.findings
    assert "7 members read as the data" in res.notes[0]


@pytest.mark.parametrize("name", ["000.jpg", "000.txt", "000.bin", "000.unknownfield"])
def test_a_pickle_under_a_data_field_is_still_found(tmp_path, name):
    """A .jpg that is no image, or an unknown field: recognised by content."""
    res = scan_file(shard(tmp_path / "s.tar", [(name, EVIL)]))
    assert res.verdict is Verdict.DANGEROUS and res.findings[0].location.member == name


@pytest.mark.parametrize("name", ["000.pyd", "000.pickle", "000.pth", "a/b.c/000.seg.pkl"])
def test_pickle_fields_are_walked(tmp_path, name):
    res = scan_file(shard(tmp_path / "s.tar", [(name, EVIL), ("000.txt", b"fine")]))
    assert res.verdict is Verdict.DANGEROUS and res.findings[0].name == "os.system"


def test_a_pyd_that_is_no_pickle_is_an_error(tmp_path):
    res = scan_file(shard(tmp_path / "s.tar", [("000.pyd", b"\x00garbage")]))
    assert res.verdict is Verdict.ERROR


def test_gzip_compressed_shard_is_read_as_a_tar_stream(tmp_path):
    big = pickle.dumps(list(range(200_000)))             # members past a small spool go to disk
    members = [(f"{i:03d}.png", b"\x89PNG\r\n\x1a\n" + bytes(100)) for i in range(20)]
    clean = scan_file(shard(tmp_path / "ok.tgz", members + [("020.pyd", big)], "w:gz"))
    assert clean.verdict is Verdict.SAFE and clean.format == "tar (gzip-compressed)", clean.errors
    bad = scan_file(shard(tmp_path / "bad.tar.gz", members + [("x/021.pyd", EVIL)], "w:gz"))
    assert bad.verdict is Verdict.DANGEROUS and bad.findings[0].location.member == "x/021.pyd"


def test_spooled_members_past_the_memory_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(tarred, "SPOOL_BYTES", 1024)
    res = scan_file(shard(tmp_path / "s.tar.xz", [("0.pyd", EVIL + bytes(4096))], "w:xz"))
    assert res.verdict is Verdict.DANGEROUS


def test_field_of_is_webdatasets():
    assert tarred.field_of("a/b.c/000.Seg.PNG") == "seg.png" and tarred.field_of("README") == ""


@pytest.mark.parametrize("mode,name", [("w", "shard-000000.tar"), ("w:gz", "shard-000000.tar.gz")])
def test_a_shard_whose_index_relabels_a_field_is_not_safe(tmp_path, mode, name):
    """``hpcml data index`` indexes a shard whose ``.mp`` holds a pickle that runs a command
    (judged as msgpack data, as webdataset decodes it); the index is then edited to call that
    member ``pyd``, which the shard reader hands out under that name for the program to
    unpickle. The scan compares the index with the tar and does not call the shard safe;
    the index as made is safe (was: safe either way, and the reader gave the pickle as pyd)."""
    import subprocess
    import sys
    d = tmp_path / "set"
    d.mkdir()
    shard(d / name, [("000000.mp", EVIL), ("000000.cls", b"1"), ("000001.mp", MSGPACK), ("000001.cls", b"2")], mode)
    p = subprocess.run([sys.executable, "-m", "hpcml", "data", "index", str(d)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    index = next(d.glob("*.idx.json"))
    assert scan_file(d / name).verdict is Verdict.SAFE
    doc = json.loads(index.read_text())
    assert doc["samples"][0][3][0][0] == "mp"
    doc["samples"][0][3][0][0] = "pyd"
    index.write_text(json.dumps(doc))
    res = scan_file(d / name)
    assert res.verdict is Verdict.ERROR, res
    assert "the 'pyd' of sample '000000'" in res.errors[0] and "is member '000000.mp'" in res.errors[0], res.errors
    doc["samples"][1][3][0][1] += 512                    # an offset into another member's data
    doc["samples"][0][3][0][0] = "mp"
    index.write_text(json.dumps(doc))
    assert scan_file(d / name).verdict is Verdict.ERROR


def test_an_honest_shard_with_capital_extensions_and_its_index_is_safe(tmp_path):
    """ImageNet's ``n01440764_10026.JPEG``, GNU tar's ``./a0.CLS``: the index keeps webdataset's
    lower-cased field, as webdataset does; the comparison reads the name by the same rule."""
    import subprocess
    import sys
    d = tmp_path / "set"
    d.mkdir()
    shard(d / "s.tar", [("n01440764_10026.JPEG", b"\xff\xd8\xff" + bytes(40)), ("n01440764_10026.CLS", b"7"),
                        ("./a0.Cls", b"1"), ("./a0.TXT", b"fine")])
    p = subprocess.run([sys.executable, "-m", "hpcml", "data", "index", str(d)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    res = scan_file(d / "s.tar")
    assert res.verdict is Verdict.SAFE and not res.errors, res


def test_an_index_a_manifest_names_under_another_name_is_compared_too(tmp_path):
    """The reader takes each shard's index by the name its manifest gives (any plain name):
    an edited index renamed and named there is compared like one under the default name."""
    import subprocess
    import sys
    d = tmp_path / "set"
    d.mkdir()
    shard(d / "s.tar", [("000000.mp", EVIL), ("000000.cls", b"1")])
    assert subprocess.run([sys.executable, "-m", "hpcml", "data", "index", str(d)], capture_output=True,
                          timeout=120).returncode == 0
    doc = json.loads((d / "s.idx.json").read_text())
    doc["samples"][0][3][0][0] = "pyd"
    (d / "s.idx.json").unlink()
    (d / "other.json").write_text(json.dumps(doc))
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["shards"][0]["index"] = "other.json"
    (d / "manifest.json").write_text(json.dumps(manifest))
    res = scan_file(d / "s.tar")
    assert res.verdict is Verdict.ERROR and "its index other.json does not match the tar" in res.errors[0], res
