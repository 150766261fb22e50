"""What the hang analysis reads of a directory of Flight Recorder dumps, and how much: torch's
names (``<prefix><rank>``, one prefix, one dump per rank, below the job's world), regular
files (no symlink followed), each bounded in bytes and entries, reduced as read."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import pytest

from hpcml.observe import hang
from hpcml.observe.hang import analyse, load_dump
from tests.observe.test_hang import _dump, _entry

NVRX = Path("/work/shared/testdata/fr_nvrx")


def _sparse_dump(path: Path, pad: int) -> None:
    """A valid dump of no entries carrying ``pad`` bytes (a sparse file: no disk used)."""
    body = b"\x80\x04}(\x8c\x07entries]\x8c\x03pad\x8e" + struct.pack("<Q", pad)
    with open(path, "wb") as f:
        f.write(body)
        f.seek(pad, 1)
        f.write(b"u.")


def test_a_dump_past_the_bound_is_refused_not_read(tmp_path):
    _dump(tmp_path / "nccl_trace_rank_0", [_entry(s) for s in range(3)], world=2)
    _sparse_dump(tmp_path / "nccl_trace_rank_1", hang.MAX_DUMP_BYTES + 1)
    rep = analyse(tmp_path)
    assert sorted(rep.dumps) == [0]
    assert "larger than" in rep.refused["nccl_trace_rank_1"]
    assert hang.MAX_DUMP_BYTES <= 64 << 20


def test_a_symlink_is_not_followed(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    for r in range(2):
        _dump(d / f"nccl_trace_rank_{r}", [_entry(s) for s in range(3)], world=3)
    _dump(tmp_path / "elsewhere", [_entry(s) for s in range(3)], world=3)
    (d / "nccl_trace_rank_2").symlink_to(tmp_path / "elsewhere")
    rep = analyse(d)
    assert sorted(rep.dumps) == [0, 1] and rep.missing == [2]


def test_only_the_dumps_prefix_is_read_one_dump_a_rank(tmp_path):
    for r in range(3):
        _dump(tmp_path / f"nccl_trace_rank_{r}", [_entry(s) for s in range(3)], world=3)
    _dump(tmp_path / "checkpoint_7", [_entry(s) for s in range(9)], world=8)     # not one of the dumps
    _dump(tmp_path / "nccl_trace_rank_002", [_entry(1)], world=3)                # not a name torch writes
    (tmp_path / "notes.txt").write_text("x")
    rep = analyse(tmp_path)
    assert sorted(rep.dumps) == [0, 1, 2] and rep.dumps[2].name == "nccl_trace_rank_2"
    assert "not read" in rep.refused["checkpoint_<rank>"] and 7 not in rep.missing
    # hpcml run's padded names and torch's plain ones: one dump per rank
    d = tmp_path / "padded"
    d.mkdir()
    for r in range(2):
        _dump(d / f"rank-{r:05d}", [_entry(s) for s in range(3)], world=2)
    _dump(d / "rank-1", [_entry(s) for s in range(3)], world=2)
    rep = analyse(d)
    assert sorted(rep.dumps) == [0, 1] and "second dump for rank 1" in rep.refused[
        ({"rank-00001", "rank-1"} - {rep.dumps[1].name}).pop()]


def test_no_rank_past_the_world_is_read_and_the_prefix_can_be_given(tmp_path):
    for r in range(4):
        _dump(tmp_path / f"rank-{r:05d}", [_entry(s) for s in range(3)], world=4)
    for r in range(6):
        _dump(tmp_path / f"x{r}", [_entry(1)], world=6)          # more files than the real dumps
    rep = analyse(tmp_path, world=2, prefix="rank-")
    assert sorted(rep.dumps) == [0, 1] and rep.missing == []
    assert "not read: the job has 2" in rep.refused["rank-<rank>"]
    assert "x<rank>" in rep.refused


def test_a_dump_is_kept_reduced_as_read(tmp_path):
    entries = [{**_entry(s), "frames": [{"name": "f" * 100, "filename": "a.py", "line": 1}] * 50}
               for s in range(3)]
    _dump(tmp_path / "nccl_trace_rank_0", entries, world=1)
    dumps, paths, refused = hang._read(tmp_path)
    assert not refused and "frames" not in dumps[0]["entries"][0]
    assert dumps[0]["entries"][0]["collective_seq_id"] == 0


def test_a_dump_of_more_entries_than_a_ring_is_refused_in_one_line(tmp_path):
    e = _entry(1)
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [e] * (hang.MAX_ENTRIES + 1)}))
    with pytest.raises(ValueError, match="entries, more than"):
        load_dump(tmp_path / "nccl_trace_rank_0")
    _dump(tmp_path / "nccl_trace_rank_1", [_entry(s) for s in range(3)], world=2)
    rep = analyse(tmp_path)
    assert sorted(rep.dumps) == [1] and "entries, more than" in rep.refused["nccl_trace_rank_0"]
    config = {str(i): {"name": str(i), "desc": "", "ranks": "[0]"} for i in range(hang.MAX_GROUPS + 1)}
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [], "pg_config": config}))
    with pytest.raises(ValueError, match="groups in its pg_config"):
        load_dump(tmp_path / "nccl_trace_rank_0")


@pytest.mark.skipif(not NVRX.is_dir(), reason="the NVRx dumps are not here")
def test_the_real_nvrx_dumps_are_all_read(tmp_path):
    for d in sorted(p for p in NVRX.iterdir() if p.is_dir()):
        rep = analyse(d)
        assert sorted(rep.dumps) == list(range(16)) and not rep.refused, d.name
