"""The report's GPU throttling, as the GPU saw it: whose GPU each recorded row is
(``hpcml.observe.gpuowners``) and a GPU lost mid-job, on synthetic jobs reshaped as a node
where GPUs are not bound to ranks records them (one task claims and samples every GPU of its
node: ``hpcml.samplers.claim``)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from hpcml.observe.report import Limits, build
from hpcml.observe.series import read_series
from hpcml.observe.store import RankWriter, read_job, read_rank
from hpcml.testing.synthetic_job import make_job

JUDGE = Limits(min_straggler_s=10)        # 30 s of synthetic steps, judged as a long job would be


def _table(path: Path) -> pa.Table:
    return pa.Table.from_batches(read_rank(path).batches)


def _rewrite(path: Path, rank: int, table: pa.Table) -> None:
    path.unlink()
    w = RankWriter(path, rank)
    for b in table.combine_chunks().to_batches():
        w.write_batch(b)
    w.close()


def _meta(d: Path, rank: int, **changes) -> None:
    f = d / f"rank-{rank:05d}.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **changes}))


def _unbound_node(d: Path, ranks: range, used: dict[int, int] | None) -> None:
    """The node of ``ranks``: none bound to a GPU (each sees them all), the first rank's
    recorder claimed and recorded every GPU's rows (GPU index = the rank that ran on it);
    ``used``: rank -> the GPU NVML saw its processes on (its recorder's ``gpus_used``)."""
    first = ranks[0]
    gpu_rows = []
    for r in ranks:
        t = _table(d / f"rank-{r:05d}.arrows")
        is_gpu = pc.equal(t["kind"], "gpu")
        mine = t.filter(is_gpu)
        gpu_rows.append(mine.set_column(1, t.schema.field(1), pa.array([first] * mine.num_rows, pa.int32())))
        if r != first:
            _rewrite(d / f"rank-{r:05d}.arrows", r, t.filter(pc.invert(is_gpu)))
    t = _table(d / f"rank-{first:05d}.arrows")
    _rewrite(d / f"rank-{first:05d}.arrows", first, pa.concat_tables([t.filter(pc.invert(pc.equal(t["kind"], "gpu"))),
                                                                       *gpu_rows]))
    for r in ranks:
        label = {"kind": "nvml", "gpus": [str(i) for i in range(len(ranks))]} if r == first else \
            {"kind": "none", "reason": "claimed_by_another_task"}
        extra = {"gpus_used": [{"index": used[r], "uuid": f"GPU-{used[r]}"}]} if used and r in used else {}
        _meta(d, r, gpus=[], gpu_binding="all visible GPUs", gpu_sampler=label,
              **({"gpu_uuids": {str(i): f"GPU-{i}" for i in range(len(ranks))}} if r == first else {}), **extra)


def test_a_gpu_held_back_on_a_node_one_rank_records_is_credited_to_the_rank_that_used_it(tmp_path):
    """Two nodes of four ranks; on n1 no rank is bound to a GPU and rank 0's recorder recorded
    all four GPUs. Rank 2 is 1.5x slow and its GPU (NVML saw its processes on GPU 2) held back
    for heat on every sample: contention naming rank 2 and the reason, no chronic straggler,
    and rank 2 is named with GPU 2 (was: a chronic straggler, the heat credited to rank 0)."""
    d = make_job(tmp_path / "obs", 8, 300, ranks_per_node=4, slow_ranks={2: 1.5}, clock_reasons={2: 0x40}, seed=4)
    _unbound_node(d, range(4), {r: r for r in range(4)})
    for job in (read_job(d), read_series(d)):
        rep = build(job, limits=JUDGE)
        c = [f for f in rep.findings if f.kind == "contention"]
        assert len(c) == 1 and "rank 2" in c[0].message and "hw_thermal_slowdown" in c[0].message, rep.findings
        assert not any(f.kind == "chronic_straggler" for f in rep.findings), rep.findings
        s2 = next(s for s in rep.stragglers if s["rank"] == 2)
        assert s2["gpus"] == ["2"] and s2["gpu_throttled"] == 1.0 and s2["gpu_throttle"] == ["hw_thermal_slowdown"]
        assert not any("GPU throttling" in u for u in rep.unjudged), rep.unjudged


def test_the_rank_that_recorded_a_node_s_gpus_is_not_credited_with_their_throttling(tmp_path):
    """The same node, rank 0 (the one that recorded the GPUs) 1.5x slow and GPU 2 held back
    for heat. NVML did not show whose processes ran where: rank 0's GPU is unknown, so is its
    throttling (None), said as not judged, and it stays a chronic straggler (was: contention,
    "its GPU's clocks were held back in 25% more of its samples", GPU 2's heat credited to the
    recorder). Where NVML saw rank 0 on GPU 0, unthrottled: 0, and named with GPU 0."""
    d = make_job(tmp_path / "obs", 8, 300, ranks_per_node=4, slow_ranks={0: 1.5}, clock_reasons={2: 0x40}, seed=4)
    _unbound_node(d, range(4), None)
    rep = build(read_job(d), limits=JUDGE)
    assert not any(f.kind == "contention" for f in rep.findings), rep.findings
    assert any(f.kind == "chronic_straggler" and "rank 0" in f.message for f in rep.findings), rep.findings
    s0 = next(s for s in rep.stragglers if s["rank"] == 0)
    assert s0["gpu_throttled"] is None and s0["gpu_throttle"] is None
    assert any(u.startswith("GPU throttling of rank 0 (no recorded GPU is proven its") for u in rep.unjudged), \
        rep.unjudged
    _unbound_node(d, range(4), {r: r for r in range(4)})
    seen = build(read_job(d), limits=JUDGE)
    s0 = next(s for s in seen.stragglers if s["rank"] == 0)
    assert s0["gpu_throttled"] == 0.0 and s0["gpus"] == ["0"] and s0["gpu_throttle"] is None
    assert any(f.kind == "chronic_straggler" and "rank 0 on n1 GPU 0 " in f.message for f in seen.findings)
    assert not any("GPU throttling" in u for u in seen.unjudged)


def test_a_straggler_whose_gpu_fell_off_the_bus_has_an_unknown_throttling(tmp_path):
    """Rank 5 (1.5x slow) ran unthrottled until its GPU fell off the bus a tenth of the way
    in; its sampler recorded ``gpu_lost`` from then on. Its throttling is unknown (None, and
    said as not judged in the JSON, the terminal and the HTML), not the 0 of the samples before
    the loss (was: 0.0, "not throttled")."""
    import subprocess
    import sys
    d = make_job(tmp_path / "obs", 8, 300, ranks_per_node=4, slow_ranks={5: 1.5}, clock_reasons={0: 0}, seed=4)
    f = d / "rank-00005.arrows"
    t = _table(f)
    ts = pc.cast(t["ts"], pa.int64())
    cut = pc.add(pc.min(ts), pc.multiply(pc.subtract(pc.max(ts), pc.min(ts)), 0.1)).as_py()
    reasons = pc.and_(pc.equal(t["kind"], "gpu"), pc.equal(t["name"], "clocks_event_reasons"))
    after = pc.and_(pc.equal(t["kind"], "gpu"), pc.greater(ts, cut))
    lost = t.filter(pc.and_(reasons, pc.greater(ts, cut)))
    lost = lost.set_column(3, t.schema.field(3), pa.array(["gpu_lost"] * lost.num_rows)).set_column(
        4, t.schema.field(4), pa.array([1.0] * lost.num_rows))
    _rewrite(f, 5, pa.concat_tables([t.filter(pc.invert(after)), lost]))
    rep = build(read_job(d), limits=JUDGE)
    s5 = next(s for s in rep.stragglers if s["rank"] == 5)
    assert s5["gpu_throttled"] is None, s5
    note = "GPU throttling of rank 5 (a GPU it used was lost: NVML said GPU_IS_LOST)"
    assert note in rep.unjudged and note in rep.to_dict()["unjudged"]
    assert any(f.kind == "chronic_straggler" and "rank 5" in f.message for f in rep.findings)
    others = [s for s in rep.stragglers if s["rank"] != 5]
    assert all(s.get("gpu_throttled") is not None for s in others)
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", "--min-straggler-s", "10", str(d)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "GPU throttling of rank 5 (a GPU it used was lost" in " ".join(out.stdout.split()), out.stdout
    assert "GPU throttling of rank 5 (a GPU it used was lost" in (d / "report.html").read_text()


def test_a_rank_alone_on_its_node_owns_the_gpus_its_recorder_sampled(tmp_path):
    """One rank per node, bound to the node's 2 GPUs (SLURM_STEP_GPUS) or seeing both, in a
    recording without ``gpus_used`` (NVML showed no pids, or an older hpcml): no other rank
    was there to use them, so its GPUs' throttling is its own, as before the GPU proof."""
    for name, change in (("bound", {"gpus": ["0", "1"], "gpu_binding": "SLURM_STEP_GPUS"}),
                         ("visible", {"gpus": [], "gpu_binding": "all visible GPUs"})):
        d = make_job(tmp_path / name, 4, 300, ranks_per_node=1, slow_ranks={2: 1.5}, clock_reasons={2: 0x40}, seed=4)
        for r in range(4):
            _meta(d, r, gpu_sampler={"kind": "nvml", "gpus": ["0", "1"]}, **change)
        rep = build(read_job(d), limits=JUDGE)
        s = next(s for s in rep.stragglers if s["rank"] == 2)
        assert s["gpu_throttled"] == 1.0 and s.get("contended") is True, (name, s)
        assert not [u for u in rep.unjudged if "GPU" in u], rep.unjudged
        # the same with a rank's metadata missing: where the others ran is not known, so unknown
        (d / "rank-00001.json").unlink()
        (d / "rank-00001.arrows").unlink()
        s = next(s for s in build(read_job(d), limits=JUDGE).stragglers if s["rank"] == 2)
        assert s["gpu_throttled"] is None, (name, s)


def test_a_row_naming_a_gpu_index_out_of_range_is_credited_to_no_other_rank(tmp_path):
    """GPU index -2 in rank 3's rows (a file the job could write) decoded as rank 2's GPU and
    made rank 2, whose own GPU was never held back, "contention"."""
    d = make_job(tmp_path / "job", 8, 300, ranks_per_node=4, slow_ranks={2: 1.5}, clock_reasons={3: 0x40}, seed=4)
    f = d / "rank-00003.arrows"
    t = _table(f)
    gpu = pc.if_else(pc.equal(t["kind"], "gpu"), pa.scalar(-2, pa.int16()), t["gpu"])
    _rewrite(f, 3, t.set_column(6, t.schema.field(6), gpu))
    s = next(s for s in build(read_series(d), limits=JUDGE).stragglers if s["rank"] == 2)
    assert not s.get("contended") and not s.get("gpu_throttle"), s


def test_a_store_without_a_gpu_column_is_read(tmp_path):
    """Another producer's store of the same rows, without the ``gpu`` column: read as before
    (a KeyError traceback once the report read that column)."""
    d = make_job(tmp_path / "job", 4, 300, ranks_per_node=1, slow_ranks={2: 1.5}, seed=4)
    for r in range(4):
        f = d / f"rank-{r:05d}.arrows"
        t = _table(f).drop_columns(["gpu"])
        f.unlink()
        with pa.OSFile(str(f), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
    rep = build(read_series(d), limits=JUDGE)
    assert [s["rank"] for s in rep.stragglers] == [2]
