"""The job store and the metrics API, with real files and real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest

from hpcml.errors import UsageError  # noqa: E402
from hpcml.observe.store import RankWriter, rank_path, read_job, read_rank  # noqa: E402


def _run(code: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                            env={**os.environ, **env}, **kw)


def test_api_without_recorder_writes_its_rank_file(tmp_path):
    code = """
        from hpcml import observe
        for i in range(100):
            with observe.section("step"):
                pass
            observe.log(step=i, loss=1.0 / (i + 1))
        observe.log(step=100, bad="not a number")     # counted, never raised
    """
    p = _run(code, {"HPCML_OBSERVE_DIR": str(tmp_path), "SLURM_PROCID": "3", "SLURM_NTASKS": "4"})
    assert p.wait(timeout=60) == 0
    job = read_job(tmp_path)
    assert list(job.ranks) == [3]
    t = job.table.to_pydict()
    losses = [v for k, n, v in zip(t["kind"], t["name"], t["value"]) if n == "loss"]
    assert len(losses) == 100 and losses[0] == 1.0
    assert sum(1 for n in t["name"] if n == "step") == 100
    problems = {n: v for k, n, v in zip(t["kind"], t["name"], t["value"]) if k == "problem"}
    assert problems["api_errors"] == 1.0
    assert set(t["rank"]) == {3}


def test_a_rank_that_logs_pays_nothing_for_pandas(tmp_path):
    """The user's rank logs through the API, which builds Arrow batches; ``pa.array`` asked
    pandas whether each list was a pandas object and so imported it in every rank that
    logged (0.3-0.4 s of CPU, ~50 MB), where pyarrow's probe must not be answered for the
    user's code (``hpcml.arrowprobe``). The rows still arrive: NaN as a null, as before."""
    code = """
        import sys
        from hpcml import observe
        for i in range(5):
            with observe.section("step", step=i):
                pass
            observe.log(step=i, loss=1.0 / (i + 1), nan=float("nan"))
        observe.flush()
        assert "pandas" not in sys.modules, "pandas imported"
    """
    p = _run(code, {"HPCML_OBSERVE_DIR": str(tmp_path), "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
             stderr=subprocess.PIPE, text=True)
    assert p.wait(timeout=60) == 0, p.stderr.read()
    t = read_job(tmp_path).table.to_pydict()
    assert [v for n, v in zip(t["name"], t["value"]) if n == "loss"] == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert [v for n, v in zip(t["name"], t["value"]) if n == "nan"] == [None] * 5
    assert [s for n, s in zip(t["name"], t["step"]) if n == "step"] == [0, 1, 2, 3, 4]


def test_rows_of_a_short_program_survive_pandas_imported_at_exit(tmp_path):
    """A program that ends within a flush interval has its rows converted by the exit
    handler, and pyarrow's first conversion imports pandas where it is installed; pandas 3
    and pyarrow.pandas_compat import concurrent.futures.thread, whose import raises at
    interpreter shutdown (a threading exit hook). Here a stand-in pandas does that import,
    then is missing: every row must still reach the store."""
    fake = tmp_path / "site"
    (fake / "pandas").mkdir(parents=True)
    (fake / "pandas" / "__init__.py").write_text(
        "import concurrent.futures.thread  # noqa: F401\nraise ImportError('a stand-in')\n")
    code = """
        from hpcml import observe
        for i in range(3):
            observe.log(step=i, loss=1.0)
    """
    path = os.pathsep.join(d for d in (str(fake), os.environ.get("PYTHONPATH")) if d)
    p = _run(code, {"HPCML_OBSERVE_DIR": str(tmp_path / "job"), "PYTHONPATH": path}, stderr=subprocess.PIPE)
    assert p.wait(timeout=60) == 0, p.stderr.read()
    t = read_job(tmp_path / "job").table.to_pydict()
    assert [s for n, s in zip(t["name"], t["step"]) if n == "loss"] == [0, 1, 2]
    assert "problem" not in t["kind"]


def test_kill_9_leaves_everything_up_to_the_last_flush(tmp_path):
    code = """
        import time
        from hpcml import observe
        i = 0
        while True:
            observe.log(step=i, x=float(i))
            i += 1
            time.sleep(0.001)
    """
    p = _run(code, {"HPCML_OBSERVE_DIR": str(tmp_path), "HPCML_OBSERVE_FLUSH": "0.2"})
    deadline = time.time() + 30
    while time.time() < deadline:           # wait until a few flushes landed
        files = list(tmp_path.glob("rank-*.arrows"))
        if files and len(read_rank(files[0]).batches) >= 4:
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    data = read_rank(next(tmp_path.glob("rank-*.arrows")))
    assert len(data.batches) >= 4
    steps = pa.Table.from_batches(data.batches).column("step").to_pylist()
    assert steps == list(range(len(steps)))       # contiguous from 0: nothing lost inside


def test_truncated_file_keeps_complete_batches(tmp_path):
    path = rank_path(tmp_path, 0)
    w = RankWriter(path, 0)
    for b in range(5):
        w.write_rows([(time.time_ns(), "metric", "x", float(b * 10 + i), b * 10 + i, None)
                      for i in range(10)])
    w.close()
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 40)                  # cut into the last batch
    data = read_rank(path)
    assert len(data.batches) == 4 and data.problem and "truncated" in data.problem


def test_restarted_rank_gets_a_new_segment_and_reads_as_one(tmp_path):
    for start in (0, 10):
        w = RankWriter(rank_path(tmp_path, 1), 1)
        w.write_rows([(time.time_ns(), "metric", "x", 1.0, start + i, None) for i in range(10)])
        w.close()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["rank-00001.1.arrows", "rank-00001.arrows"]
    job = read_job(tmp_path)
    assert sorted(job.table.column("step").to_pylist()) == list(range(20))


def test_missing_ranks_are_named(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"ntasks": 3}))
    w = RankWriter(rank_path(tmp_path, 1), 1)
    w.write_rows([(time.time_ns(), "metric", "x", 1.0, 0, None)])
    w.close()
    (tmp_path / "rank-00002.arrows").write_bytes(b"garbage")
    job = read_job(tmp_path)
    assert job.missing == [0, 2]
    assert "unreadable" in job.problems[2]


def test_not_a_job_directory(tmp_path):
    with pytest.raises(UsageError, match="not a job directory"):
        read_job(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "summary", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_duckdb_queries_the_job(tmp_path):
    import duckdb
    for rank in range(3):
        w = RankWriter(rank_path(tmp_path, rank), rank)
        w.write_rows([(time.time_ns(), "section", "step", 0.1 * (rank + 1), i, None) for i in range(50)])
        w.close()
    job_rows = read_job(tmp_path).table  # noqa: F841 - DuckDB finds it by name
    rows = duckdb.sql("select rank, median(value) from job_rows where name = 'step' "
                      "group by rank order by rank").fetchall()
    assert [r for r, _ in rows] == [0, 1, 2]
    assert rows[2][1] == pytest.approx(0.3)


def test_two_writers_of_one_rank_never_collide(tmp_path, monkeypatch):
    """The recorder and the API inside a container may start a segment of rank 0 at the same
    moment: the name one of them looked up can be taken before it opens it."""
    from hpcml.observe import store
    (tmp_path / "rank-00000.arrows").write_bytes(b"")
    real = store.rank_path
    calls = []

    def stale(job_dir, rank):                 # the first look says a name that is already taken
        calls.append(1)
        return tmp_path / "rank-00000.arrows" if len(calls) == 1 else real(job_dir, rank)
    monkeypatch.setattr(store, "rank_path", stale)
    w = store.RankWriter.create(tmp_path, 0)
    w.write_rows([(1_700_000_000_000_000_000, "metric", "x", 1.0, 0, None)])
    w.close()
    assert (tmp_path / "rank-00000.1.arrows").stat().st_size > 0 and len(calls) == 2
    assert (tmp_path / "rank-00000.arrows").read_bytes() == b""          # the other's file untouched
