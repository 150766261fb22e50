"""The arrivals' reduction refuses a dump of more entries than a Flight Recorder keeps, before
reading any (a pickle's memo makes millions of entries of a few bytes each)."""

from __future__ import annotations

import pickle

import pytest

from hpcml.observe import hang
from hpcml.observe.arrivals import LIVE_DUMP_MAX, reduce
from hpcml.observe.hang import load_dump


def _entry(seq: int) -> dict:
    return {"collective_seq_id": seq, "process_group": ["0", "default"], "profiling_name": "nccl:all_reduce",
            "time_created_ns": 1, "duration_ms": 1.0, "state": "completed"}


def test_a_dump_of_too_many_entries_is_refused_before_reduced(tmp_path):
    e = _entry(1)
    with pytest.raises(ValueError, match="entries, more than"):
        reduce({"entries": [e] * (hang.MAX_ENTRIES + 1), "pg_config": {}})
    f = tmp_path / "rank-00000"
    f.write_bytes(pickle.dumps({"entries": [e] * (hang.MAX_ENTRIES + 1), "pg_config": {}}))
    assert f.stat().st_size < LIVE_DUMP_MAX
    with pytest.raises(ValueError, match="entries, more than"):
        load_dump(f, LIVE_DUMP_MAX)
    ok = reduce({"entries": [_entry(s) for s in range(2000)], "pg_config": {}})     # torch's default ring
    assert len(ok["times"]["0"]) == 2000
