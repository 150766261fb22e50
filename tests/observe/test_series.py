"""The series reader (what ``hpcml observe report`` reads) against the whole-table reader:
the same rows per (kind, name), the same problems, the same report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hpcml.observe.report import Limits, build
from hpcml.observe.series import RANKS_PER_SPLIT, from_table, read_series
from hpcml.observe.store import RankWriter, files_by_rank, read_job, read_meta, read_rank
from hpcml.testing.synthetic_job import make_job


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    """More ranks than one split takes, a slow rank, a stall, a missing and a cut rank, and a
    restarted rank whose second segment logs a user metric and sections without steps."""
    d = make_job(tmp_path_factory.mktemp("job") / "obs", RANKS_PER_SPLIT * 2 + 3, 200, slow_ranks={4: 1.5},
                 stalls=[(120, 4.0)], missing=[9], truncated=[20])
    first = read_rank(d / "rank-00003.arrows").batches
    now = max(int(b["ts"].cast("int64").to_numpy().max()) for b in first) * 1000 - 5 * 10**9
    w = RankWriter.create(d, 3)
    assert (d / "rank-00003.1.arrows").exists()
    w.write_rows([(now + i * 10**9, "metric", "tokens_per_s", 1000.0 + i, None, None) for i in range(5)]
                 + [(now + i * 10**9, "section", "dataload", 0.01, None, None) for i in range(5)]
                 + [(now, "section", "step", 0.5, 200, None)])
    w.close()
    return d


def _sorted(rank, ts, value, step):
    order = np.lexsort((value, ts, rank))
    return rank[order], ts[order], value[order], None if step is None else step[order]


def test_series_hold_the_rows_of_the_whole_table(job_dir):
    job, js = read_job(job_dir), read_series(job_dir)
    table_series = from_table(job.table)
    assert js.rows == job.table.num_rows and set(js.series) == set(table_series)
    assert ("metric", "tokens_per_s") in js.series and ("section", "dataload") in js.series
    for key, s in js.series.items():
        t = table_series[key]
        a, b = _sorted(s.rank, s.ts_us, s.value, s.step), _sorted(t.rank, t.ts_us, t.value, t.step)
        for x, y in zip(a, b):
            assert (x is None) == (y is None), key
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=str(key))
    dl = js.series[("section", "dataload")]
    assert dl.step is not None and (dl.step[dl.rank == 3] == -1).any()      # a null step reads as -1
    assert js.series[("host", next(n for k, n in js.series if k == "host"))].step is None
    assert js.missing == job.missing == [9]
    assert js.problems == job.problems and 20 in js.problems
    assert js.ranks == sorted(job.ranks)


def test_the_report_is_the_same_from_either_reader(job_dir):
    judge = Limits(min_straggler_s=10)           # 22 s of synthetic steps, judged as a long job
    a = build(read_series(job_dir), limits=judge).to_dict()
    b = build(read_job(job_dir), limits=judge).to_dict()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert [s["rank"] for s in a["stragglers"]] == [4] and a["stalls"] and a["missing_ranks"] == [9]
    assert a["throughput"]["name"] == "tokens_per_s"


def test_segments_are_joined_in_restart_order(tmp_path):
    """A name sort puts rank-3.1 before rank-3 and rank-3.10 before rank-3.2."""
    for name in ("rank-00003.arrows", "rank-00003.1.arrows", "rank-00003.2.arrows", "rank-00003.10.arrows",
                 "rank-00001.arrows"):
        (tmp_path / name).write_bytes(b"")
    _, _, files = read_meta(tmp_path)
    by_rank = files_by_rank(files)
    assert [f.name for f in by_rank[3]] == ["rank-00003.arrows", "rank-00003.1.arrows", "rank-00003.2.arrows",
                                             "rank-00003.10.arrows"]
    assert sorted(by_rank) == [1, 3]


def test_an_empty_job_directory_reads_as_no_series(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "1", "ntasks": 2}))
    js = read_series(tmp_path)
    assert js.rows == 0 and js.series == {} and js.missing == [0, 1]
    rep = build(js)
    assert rep.ranks_with_data == 0 and any(f.kind == "missing_rank" for f in rep.findings)
