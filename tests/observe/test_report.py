"""The job report on synthetic job directories with known ground truth (hpcml.testing.synthetic_job).

The HTML test renders the report in headless Chromium (Debian's ``chromium``; installed
here when missing and root) and checks the screenshot is not blank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcml.observe.report import Limits, build
from hpcml.observe.store import read_job
from hpcml.testing.synthetic_job import make_job, synthetic_uuid
from tests.observe.browser import assert_not_blank, render

SLOW, STALL_STEP, STALL_S, HICCUP, MISSING, CUT = 5, 250, 5.0, (9, 100), 7, 12
# the synthetic jobs here are 20-55 s of steps: judged for stragglers as a long job would be
# (by default a verdict needs 60 s, see test_stragglers.py's short and long jobs)
JUDGE = Limits(min_straggler_s=10)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory) -> Path:
    return make_job(tmp_path_factory.mktemp("job") / "obs", 64, 500, slow_ranks={SLOW: 1.4},
                    stalls=[(STALL_STEP, STALL_S)], hiccups={HICCUP: 8.0}, missing=[MISSING],
                    truncated=[CUT])


@pytest.fixture(scope="module")
def rep(job_dir):
    return build(read_job(job_dir), limits=JUDGE)


@pytest.fixture(scope="module")
def clean_rep(tmp_path_factory):
    return build(read_job(make_job(tmp_path_factory.mktemp("clean") / "obs", 32, 300, seed=3)), limits=JUDGE)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", "--min-straggler-s", "10", *args],
                          check=False, capture_output=True, text=True, timeout=120)


def test_slow_rank_is_a_chronic_straggler_with_its_node(rep, clean_rep):
    assert [s["rank"] for s in rep.stragglers] == [SLOW]
    s = rep.stragglers[0]
    assert s["node"] == "n2" and s["gpus"] == ["1"] and s["confidence"] > 0.9
    f = next(f for f in rep.findings if f.kind == "chronic_straggler")
    assert "rank 5" in f.message and "n2" in f.message and "--exclude=n2" in f.advice
    assert clean_rep.stragglers == [] and not any(f.kind == "chronic_straggler" for f in clean_rep.findings)


def test_job_wide_stall_is_found_where_it_was_injected(rep, job_dir, clean_rep):
    job = read_job(job_dir)
    tab = job.table
    ts = tab["ts"].cast("int64").to_numpy() / 1e6
    t0 = ts.min()
    is_step = (tab["name"].to_numpy(zero_copy_only=False) == "step") & (tab["rank"].to_numpy() == 0)
    steps = tab["step"].to_numpy(zero_copy_only=False)
    before = ts[is_step & (steps == STALL_STEP - 1)][0] - t0      # the stall is the next step
    after = ts[is_step & (steps == STALL_STEP)][0] - t0
    hits = [s for s in rep.stalls if s["start_s"] < after and s["end_s"] > before]
    assert len(hits) == 1 and hits[0]["ratio"] < 0.5
    assert abs(hits[0]["duration_s"] - STALL_S) < 2.5
    assert any(f.kind == "job_stall" for f in rep.findings)
    assert clean_rep.stalls == []


def test_one_off_hiccup_is_not_chronic(rep):
    rank, step = HICCUP
    assert any(o["rank"] == rank and o["step"] == step and o["ratio"] > 5 for o in rep.one_off_stalls)
    assert rank not in [s["rank"] for s in rep.stragglers]


def test_missing_and_damaged_ranks_are_reported_and_skipped(rep):
    assert rep.missing_ranks == [MISSING]
    assert list(rep.damaged_ranks) == [CUT] and "truncated" in rep.damaged_ranks[CUT]
    assert rep.ranks_with_data == 63 and rep.ranks_expected == 64
    f = next(f for f in rep.findings if f.kind == "missing_rank")
    assert f"rank {MISSING} " in f.message and "killed" in f.advice
    assert len(rep.findings) <= 5 and all(f.advice for f in rep.findings)


def test_a_store_whose_rank_0_never_recorded_has_rank_0_missing_not_none(tmp_path):
    """Rank 0's recorder writes job.json; where it never started, ranks 1-7 have data and
    there is no job.json. Rank 0 is missing (a ``missing_rank`` finding, the store not whole),
    not "nothing stands out"."""
    d = make_job(tmp_path / "obs", 8, 100, missing={0}, seed=2)
    (d / "job.json").unlink()
    job = read_job(d)
    assert job.missing == [0]
    rep = build(job)
    assert rep.missing_ranks == [0] and rep.ranks_expected == 8
    assert any(f.kind == "missing_rank" and "rank 0 " in f.message for f in rep.findings), rep.findings
    for f in d.glob("rank-*.json"):              # observe.log alone, no recorder: which ranks log is the script's
        f.unlink()
    assert read_job(d).missing == []


def test_throughput_uses_the_logged_metric_else_step_rate(rep, tmp_path):
    assert rep.throughput["name"] == "tokens_per_s"
    assert 40_000 < rep.throughput["median"] < 60_000           # 8192 tokens / ~0.16 s
    plain = build(read_job(make_job(tmp_path / "plain", 8, 200, throughput_metric=None)))
    assert plain.throughput["source"] == "section" and plain.throughput["unit"] == "steps/s per rank"
    assert 4 < plain.throughput["median"] < 12                  # ~0.12 s per step


def test_dataload_bound_job_gets_its_advice(tmp_path):
    r = build(read_job(make_job(tmp_path / "dl", 8, 200, dataload_share=0.6)))
    f = next(f for f in r.findings if f.kind == "data_bound")
    assert "60%" in f.message and "hpcml data" in f.advice
    r = build(read_job(make_job(tmp_path / "ok", 8, 200, dataload_share=0.1)))
    assert not any(f.kind == "data_bound" for f in r.findings)


def test_a_section_only_some_ranks_time_is_a_share_of_their_steps_not_of_every_rank_s(tmp_path):
    """Rank 0 alone times its data loading (60% of each step): the section is 60% of the step
    time of the ranks that timed it, and data-bound, not 15% over four ranks whose loading was
    never measured (was: 0.15 and no finding; an unmeasured section counted as 0 s)."""
    r = build(read_job(make_job(tmp_path / "dl", 4, 200, dataload_share=0.6, dataload_ranks={0})))
    dl = r.sections["dataload"]
    assert dl["ranks"] == 1 and dl["share_of_step"] == pytest.approx(0.6, abs=0.02), dl
    assert any(f.kind == "data_bound" and "60%" in f.message for f in r.findings), r.findings
    assert r.sections["step"]["ranks"] == 4 and r.sections["step"]["share_of_step"] is None


def test_the_workers_cpu_use_is_their_mean_while_they_ran_idle_samples_included(tmp_path):
    """The host sampler's loader rows as it writes them: no workers for the first 5 samples,
    then 4 workers on 1 core, idle (0%) in 9 samples of 10 and 80% of a core in the tenth, the
    first reading of the new workers not written (unknown). Their mean while they ran is 8.2%
    (4 x 80% over the 39 samples written),
    and idle workers are not short of cores (was: 80%, the mean of the samples above 0, and a
    false ``loader_cores`` finding)."""
    import pyarrow as pa

    from hpcml.observe.store import RankWriter, rank_path
    from hpcml.testing.synthetic_job import T0_US, _batch
    d = make_job(tmp_path / "loader", 2, 300, gpu=False)
    m = 45
    ts = T0_US + np.arange(m, dtype=np.int64) * 1_000_000
    workers = np.where(np.arange(m) < 5, 0.0, 4.0)
    busy = np.where(np.arange(m) % 10 == 5 + 1, 80.0, 0.0)
    for r in range(2):
        w = RankWriter(rank_path(d, r), r)
        for name, t, v in (("proc_workers", ts, workers), ("proc_cores", ts, np.full(m, 1.0)),
                           ("proc_workers_cpu_percent", np.delete(ts, 5), np.delete(busy, 5))):
            w.write_batch(_batch(pa, t, r, "host", name, v))
        w.close()
    rep = build(read_job(d))
    assert [row["workers_cpu_percent"] for row in rep.loader] == [pytest.approx(4 * 80 / 39, abs=0.06)] * 2, rep.loader
    assert not any(f.kind == "loader_cores" for f in rep.findings), rep.findings


def test_a_loss_that_ended_nan_is_said_as_nan_with_a_finding(tmp_path):
    """Rank 0's train_loss is NaN for its last 50 steps: the report's "did" says "train_loss nan (last
    finite ...)", its JSON has the value null with what it was, and a ``non_finite_metric``
    finding names it (was: "train_loss 1.51", the value before, and no finding)."""
    import pyarrow as pa

    from hpcml.observe.progress import line
    from hpcml.observe.store import RankWriter, rank_path
    from hpcml.testing.synthetic_job import T0_US, _batch
    d = make_job(tmp_path / "nan", 2, 100, gpu=False)
    ts = T0_US + np.arange(100, dtype=np.int64) * 100_000
    loss = np.where(np.arange(100) < 50, 2.0 - np.arange(100) / 100, np.nan)
    w = RankWriter(rank_path(d, 0), 0)
    w.write_batch(_batch(pa, ts, 0, "metric", "train_loss", loss, np.arange(100)))
    w.close()
    rep = build(read_job(d))
    assert rep.progress["metrics"]["train_loss"] == {"value": None, "rank": 0, "non_finite": "nan", "last_finite": 1.51}
    assert "train_loss nan (last finite 1.51)" in line(rep.progress), line(rep.progress)
    f = next(f for f in rep.findings if f.kind == "non_finite_metric")
    assert "the last train_loss rank 0 logged was nan (its last finite value: 1.51)" in f.message, f.message


def test_plots_are_downsampled(job_dir):
    r = build(read_job(job_dir), max_buckets=40, max_rows=16)
    hm = r.plots["heatmap"]
    assert hm["values"].shape == (16, 40) and hm["group"] == 4 and hm["labels"][0] == "0-3"
    assert np.nanmax(hm["values"][SLOW // 4]) > 1.2 * np.nanmedian(hm["values"])   # the slow group shows
    assert all(len(s["median"]) == 40 for s in r.plots["series"])
    assert {g["name"] for g in r.plots["gpu"]} >= {"util_gpu_percent", "power_w"}
    assert {g["name"] for g in r.plots["host"]} >= {"cpu_percent", "mem_used_bytes"}
    full = build(read_job(job_dir))
    assert full.plots["heatmap"]["values"].shape == (63, 100)    # 500 steps / 5, 63 ranks with data


def test_json_output_has_stable_keys_and_html_is_written(job_dir, tmp_path):
    out = tmp_path / "r.html"
    p = _cli(str(job_dir), "--json", "--html", str(out))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert list(d) == ["schema", "job_id", "path", "ranks_expected", "ranks_with_data", "nodes", "start", "end",
                       "duration_s", "rows", "throughput", "stalls", "stragglers", "bimodal", "one_off_stalls",
                       "transient_stragglers", "sections", "missing_ranks", "damaged_ranks",
                       "failed_ranks", "recorder_problems", "findings", "restarts", "straggler_check", "arrivals", "progress",
                       "loader", "io", "unjudged"]
    assert d["job_id"] == "synthetic" and d["missing_ranks"] == [MISSING] and str(CUT) in d["damaged_ranks"]
    assert all(set(f) == {"kind", "message", "advice"} for f in d["findings"])
    assert {"rank", "node", "gpus", "score", "confidence"} <= set(d["stragglers"][0])
    assert {"start_s", "end_s", "duration_s", "ratio"} <= set(d["stalls"][0])
    assert out.stat().st_size > 10_000


def test_terminal_summary_and_default_html_path(job_dir):
    p = _cli(str(job_dir))
    assert p.returncode == 0, p.stderr
    assert "Job synthetic" in p.stdout and "rank 5 on n2" in p.stdout and "stall" in p.stdout
    assert f"missing ranks: [{MISSING}]" in p.stdout
    assert (job_dir / "report.html").exists()


def test_not_a_job_directory_is_a_one_line_error(tmp_path):
    p = _cli(str(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "not a job directory" in p.stderr


def test_html_is_self_contained(rep):
    from hpcml.observe.html import render
    page = render(rep)
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert "https://" not in page and "src=" not in page
    assert page.replace("http://www.w3.org/2000/svg", "").count("http://") == 0
    assert page.count("<svg") >= 6 and "data:image/png;base64," in page


# ------------------------------------------------------------------ headless Chromium

def test_html_renders_in_headless_chromium(job_dir, tmp_path):
    page = tmp_path / "report.html"
    assert _cli(str(job_dir), "--html", str(page)).returncode == 0
    pixels, dom = render(page, tmp_path)
    assert pixels.shape[:2] == (2000, 1200)
    assert_not_blank(pixels)
    # the DOM dump shows the findings were laid out (no JS: the page is static)
    assert 'id="hpcml-report"' in dom and "rank 5 on n2" in dom


# -- issue 17: no phantom stalls, bimodal jobs, options ----------------------------------------------

def test_healthy_job_has_no_findings(clean_rep):
    assert clean_rep.findings == [] and clean_rep.stalls == [] and clean_rep.transient_stragglers == []


def test_fast_healthy_single_rank_run_has_no_phantom_stall(tmp_path):
    """As measured on an H100: 6,946 steps in ~25 s at a steady ~280 steps/s."""
    d = make_job(tmp_path / "obs", 1, 6946, step_s=0.0035, comm_s=0.0, dataload_share=None, seed=4)
    r = build(read_job(d))
    assert r.stalls == [] and r.findings == []


def test_a_short_real_stall_in_a_fast_job_is_still_found(tmp_path):
    d = make_job(tmp_path / "obs", 2, 6000, step_s=0.0035, comm_s=0.0, dataload_share=None, stalls=[(3000, 4.0)])
    r = build(read_job(d))
    assert len(r.stalls) == 1 and 3.0 <= r.stalls[0]["duration_s"] <= 6.0
    assert any(f.kind == "job_stall" for f in r.findings)


def test_bimodal_job_is_named_with_its_cost_and_both_readings(tmp_path):
    """Issue 37: a speed split is not harmless. In synchronous data parallelism it sets the
    job's pace: the report says what it costs, names the slow group's nodes and gives the
    advice for both readings when the job does not say which it is."""
    d = make_job(tmp_path / "obs", 16, 300, slow_ranks={r: 2.0 for r in range(8, 16)} | {3: 1.4}, seed=5)
    r = build(read_job(d), limits=JUDGE)
    b = r.bimodal
    assert (b["fast_ranks"], b["slow_ranks"]) == (list(range(8)), list(range(8, 16)))
    assert 1.8 < b["ratio"] < 2.2 and b["slow_nodes"] == ["n3", "n4"]
    assert 0.4 < b["time_lost_share"] < 0.6 and b["slow_step_s"] > 1.8 * b["fast_step_s"]
    assert b["lost_hours"] > 0 and b["lost_hours_unit"] == "GPU-hours"
    f = r.findings[0]
    assert f.kind == "bimodal" and "n3, n4" in f.message and "% of the job's time" in f.message
    assert "not stragglers to exclude" not in f.advice
    assert "srun --exclude=n3,n4" in f.advice and "rebalance" in f.advice and "--parallelism" in f.advice
    kinds = [f.kind for f in r.findings]
    assert [s["rank"] for s in r.stragglers] == [3]               # within the fast group
    assert "transient_straggler" not in kinds


def test_a_speed_split_counts_each_gpu_once_where_every_rank_lists_its_nodes_gpus(tmp_path):
    """``srun --ntasks-per-node=4 --gpus-per-node=4``: every rank's ``gpus`` is the step's
    four GPUs of its node (SLURM_STEP_GPUS). The split's GPU-hours count 16 GPUs, not 64."""
    import json
    slow = {r: 2.0 for r in range(8, 16)}
    own = build(read_job(make_job(tmp_path / "own", 16, 300, slow_ranks=slow, seed=5)), limits=JUDGE).bimodal
    d = make_job(tmp_path / "shared", 16, 300, slow_ranks=slow, seed=5)
    for f in d.glob("rank-*.json"):
        meta = json.loads(f.read_text())
        f.write_text(json.dumps({**meta, "gpus": ["0", "1", "2", "3"]}))
    shared = build(read_job(d), limits=JUDGE).bimodal
    assert shared["lost_hours_unit"] == own["lost_hours_unit"] == "GPU-hours"
    assert shared["lost_hours"] == pytest.approx(own["lost_hours"], rel=1e-6) and own["lost_hours"] > 0


@pytest.mark.parametrize("parallelism,says,not_says", [("data", "exclude them", "rebalance"),
                                                        ("roles", "rebalance", "exclude")])
def test_bimodal_advice_follows_the_jobs_parallelism(tmp_path, parallelism, says, not_says):
    d = make_job(tmp_path / "obs", 8, 200, slow_ranks={r: 3.0 for r in range(4, 8)}, seed=7)
    f = build(read_job(d), limits=JUDGE, parallelism=parallelism).findings[0]
    assert f.kind == "bimodal" and says in f.advice and not_says not in f.advice


@pytest.mark.parametrize("n,slow,ratio", [(10, 5, 3.9), (12, 3, 1.6), (16, 12, 2.5), (20, 6, 5.0)])
@pytest.mark.parametrize("transient", [False, True])
def test_splits_of_any_size_and_ratio_are_named_and_a_transient_straggler_still_found(tmp_path, n, slow, ratio,
                                                                                        transient):
    """The production trace's shape (10 workers, 5 at 3.9x) and others; a rank slow for 40
    steps inside each group is still found as transient."""
    slow_ranks = {r: ratio for r in range(n - slow, n)}
    hiccups = {}
    if transient:
        for rank in (0, n - 1):                          # one in the fast group, one in the slow
            hiccups |= {(rank, s): 3.0 for s in range(120, 160)}
    d = make_job(tmp_path / "obs", n, 300, ranks_per_node=2, slow_ranks=slow_ranks, hiccups=hiccups, seed=n)
    r = build(read_job(d), limits=JUDGE)
    assert r.bimodal is not None and r.bimodal["slow_ranks"] == list(range(n - slow, n))
    expect_share = 1 - 1 / ratio
    assert abs(r.bimodal["time_lost_share"] - expect_share) < 0.08, r.bimodal
    assert r.findings[0].kind == "bimodal"
    found = {t["rank"] for t in r.transient_stragglers}
    assert found >= ({0, n - 1} if transient else set()), r.transient_stragglers
    if not transient:
        assert not found & {0, n - 1}


def test_report_parallelism_flag_is_checked(tmp_path):
    d = make_job(tmp_path / "obs", 4, 50, seed=1)
    bad = _cli(str(d), "--parallelism", "pipeline-ish")
    assert bad.returncode == 2 and "--parallelism" in bad.stderr and bad.stderr.count("\n") == 1


def test_report_options_reach_the_analysis(tmp_path):
    d = make_job(tmp_path / "obs", 8, 200, slow_ranks={2: 1.07}, seed=6)
    p = _cli(str(d), "--json")
    default = json.loads(p.stdout)
    assert default["stragglers"] == []
    p = _cli(str(d), "--json", "--chronic", "0.04")
    assert [s["rank"] for s in json.loads(p.stdout)["stragglers"]] == [2]
    bad = _cli(str(d), "--chronic", "-1")
    assert bad.returncode == 2 and "--chronic" in bad.stderr and bad.stderr.count("\n") == 1


# -- issue 19: host charts draw lines; the duration is the slowest rank's -------------------------

def _host_paths(dom: str) -> list[str]:
    """The line paths of the "Host per node" section of a rendered page."""
    import re
    section = dom.split("Host per node", 1)[1]
    section = section.split("<h2", 1)[0]
    return re.findall(r"<path[^>]*\sd=[\"']([^\"']+)[\"']", section)


def test_host_charts_draw_lines_in_chromium(tmp_path):
    """Issue 19: host samples every 1 s on a grid of 0.2 s buckets gave paths of moves only."""
    d = make_job(tmp_path / "obs", 8, 150, step_s=0.05, sample_s=1.0, seed=8)       # ~8 s, 1 s samples
    page = tmp_path / "report.html"
    assert _cli(str(d), "--html", str(page)).returncode == 0
    pixels, dom = render(page, tmp_path)
    assert_not_blank(pixels)
    paths = _host_paths(dom)
    assert paths and all("L" in p for p in paths), paths[:3]


def test_duration_is_the_slowest_ranks(tmp_path):
    d = make_job(tmp_path / "obs", 4, 100, seed=9)
    meta = json.loads((d / "rank-00002.json").read_text())
    meta["end"] += 10.0                                     # rank 2 ended 10 s after rank 0
    (d / "rank-00002.json").write_text(json.dumps(meta))
    job = json.loads((d / "job.json").read_text())
    r = build(read_job(d))
    assert r.duration_s == pytest.approx(meta["end"] - job["start"], abs=0.01)


def test_a_file_given_for_the_job_directory_says_so(job_dir):
    p = _cli(str(job_dir / "job.json"))
    assert p.returncode == 2 and "a file, not a job directory" in p.stderr and str(job_dir) in p.stderr
    assert "does not exist" not in p.stderr and p.stderr.count("\n") == 1


STEPS = """
import sys, time
from hpcml import observe
for s in range(int(sys.argv[1]), int(sys.argv[2])):
    with observe.section("step", step=s):
        time.sleep(0.02)
sys.exit(int(sys.argv[3]))
"""


def test_recording_twice_into_one_store_keeps_the_first_runs_exit(tmp_path):
    """A requeued job whose ``hpcml observe record`` writes the same store again (issue 29):
    the first run's exit and times are kept beside the second's, which is what the report
    tells a restart by (next test); its 143 (the requeue's SIGTERM) is no failure."""
    (tmp_path / "steps.py").write_text(STEPS)
    store = tmp_path / "obs"
    for first, last, code in ((0, 60, 143), (60, 120, 0)):
        p = subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(store), "--interval",
                            "0.1", "--", sys.executable, str(tmp_path / "steps.py"), str(first), str(last), str(code)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == code, p.stderr
    meta = json.loads((store / "rank-00000.json").read_text())
    assert meta["exit_code"] == 0 and [e["exit_code"] for e in meta["earlier"]] == [143], meta
    assert meta["earlier"][0]["start"] < meta["earlier"][0]["end"] <= meta["start"], meta
    r = build(read_job(store))
    assert r.throughput["median"] > 0 and not [f for f in r.findings if f.kind == "earlier_failure"]


@pytest.mark.parametrize("requeued", [True, False], ids=["recorded-twice", "one-run"])
def test_a_job_recorded_twice_into_one_store_was_not_running_between_not_stalled(tmp_path, requeued):
    """The time between two runs recorded into one store is a restart, not a stall. Tested on
    a synthetic store whose gap is known (5 s between steps 299 and 300), not on two real runs
    a second apart: their gap holds the second run's start-up too, and a loaded machine
    stretched a run's own steps past the stall threshold (a real stall, in the wrong test).
    The same gap in a store recorded once is a stall: the report tells them apart by the
    ranks' ``earlier`` runs alone."""
    store = make_job(tmp_path / "obs", n_ranks=2, n_steps=600, ranks_per_node=1, step_s=0.05, stalls=[(300, 5.0)],
                     gpu=False, host=False, dataload_share=None, throughput_metric=None)
    ends: dict[int, list[float]] = {}
    t = read_job(store).table.to_pydict()
    for ts, name, step in zip(t["ts"], t["name"], t["step"]):
        if name == "step" and step in (299, 300):
            ends.setdefault(step, []).append(ts.timestamp())
    stopped, resumed = max(ends[299]), min(ends[300]) - 0.05      # the second run's recorder starts
    if requeued:
        for rank in (0, 1):
            path = store / f"rank-{rank:05d}.json"
            meta = json.loads(path.read_text())
            meta["earlier"] = [{"start": meta["start"], "end": stopped + 0.01, "exit_code": 143}]
            meta["start"] = resumed
            path.write_text(json.dumps(meta))
    r = build(read_job(store))
    if requeued:
        assert len(r.restarts) == 1 and r.stalls == [], (r.restarts, r.stalls)
        assert r.restarts[0]["duration_s"] == pytest.approx(resumed - stopped, abs=0.05), r.restarts
        assert [f.kind for f in r.findings][0] == "restart_gap" and r.throughput["median"] > 0
    else:
        assert r.restarts == [] and len(r.stalls) == 1, (r.restarts, r.stalls)
        assert r.stalls[0]["duration_s"] > 4, r.stalls


def test_a_rank_that_failed_before_the_job_was_restarted_is_still_reported(tmp_path):
    """Recorded twice into one store (a requeued job): rank 1 exited 1 in the first run, the
    second run ended 0. The failure stays a finding; the requeue's 143 does not make one."""
    store = make_job(tmp_path / "obs", n_ranks=2, n_steps=40, ranks_per_node=1, gpu=False)
    for rank, code in ((0, 143), (1, 1)):
        meta = json.loads((store / f"rank-{rank:05d}.json").read_text())
        meta["earlier"] = [{"start": meta["start"] - 100, "end": meta["start"] - 50, "exit_code": code}]
        (store / f"rank-{rank:05d}.json").write_text(json.dumps(meta))
    r = build(read_job(store))
    assert r.failed_ranks == {}
    found = [f for f in r.findings if f.kind == "earlier_failure"]
    assert len(found) == 1 and "run 1, rank 1: 1" in found[0].message, r.findings


def test_charts_shade_the_start_up_before_the_first_step(tmp_path):
    """Issue 37: the seconds before the first step read as start-up, not as an empty chart."""
    from hpcml.observe import html as report_html
    d = make_job(tmp_path / "obs", 4, 100, seed=3)              # the recorder starts 1 s before step 0
    r = build(read_job(d))
    assert 0.5 < r.plots["startup_s"] < 1.5
    page = report_html.render(r)
    assert "class='startup'" in page and "before the first step" in page


def _hung_at_the_end(path: Path, steps: int, hang_s: float) -> Path:
    """A job whose last step never completes: ``steps`` steps, then ``hang_s`` seconds of its
    recorders' samples and no step (the step rows of the step that took them removed), every
    rank stopped by TERM (143) as hpcml run stops a hang."""
    import pyarrow as pa
    import pyarrow.ipc
    d = make_job(path, 4, steps + 1, stalls=[(steps, hang_s)], seed=3)
    for f in sorted(d.glob("rank-*.arrows")):
        with pa.ipc.open_stream(f.read_bytes()) as r:
            t = r.read_all()
        keep = pa.compute.or_kleene(pa.compute.is_null(t["step"]), pa.compute.less(t["step"], steps))
        t = t.filter(pa.compute.fill_null(keep, True))
        with pa.ipc.new_stream(str(f), t.schema) as w:
            w.write_table(t)
        meta = f.with_suffix(".json")
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "exit_code": 143}))
    return d


def test_a_job_that_trained_20_s_then_hung_60_s_has_a_hang_finding(tmp_path):
    """Most of the job's time hung: the step rate's median over the job is 0, and the stall is
    judged against the rate while steps came. The hang is the job_hang finding, first of the
    stalls and not counted as one."""
    rep = build(read_job(_hung_at_the_end(tmp_path / "obs", 200, 60.0)), limits=JUDGE)
    hang = [s for s in rep.stalls if s["kind"] == "hang"]
    assert len(hang) == 1 and 18 <= hang[0]["start_s"] <= 26 and hang[0]["duration_s"] >= 50, rep.stalls
    kinds = [f.kind for f in rep.findings]
    assert "job_hang" in kinds and "job_stall" not in kinds, rep.findings


def test_a_90_s_evaluation_pause_is_a_pause_and_a_clean_end_is_no_hang(tmp_path):
    """90 s without a step in a job of 25 s of steps that then goes on and exits 0: a pause,
    not a hang, and its teardown after the last step no stall at all."""
    d = make_job(tmp_path / "obs", 4, 250, stalls=[(120, 90.0)], seed=4)
    rep = build(read_job(d), limits=JUDGE)
    assert [s["kind"] for s in rep.stalls] == ["pause"] and rep.stalls[0]["duration_s"] >= 80, rep.stalls
    f = next(f for f in rep.findings if f.kind == "job_stall")
    assert "a pause" in f.message and "job_hang" not in [x.kind for x in rep.findings]


def test_a_straggler_whose_gpu_is_held_back_for_heat_is_contention_and_a_power_cap_for_all_excuses_none(tmp_path):
    """Every GPU at its power cap half the time; rank 5 (1.5x slow) also reports hardware
    thermal slowdown on every sample: a ``contention`` finding naming its GPU and the reasons,
    no chronic straggler. The same job without the heat names rank 5 a straggler."""
    hot = build(read_job(make_job(tmp_path / "hot", 16, 300, slow_ranks={5: 1.5}, power_capped=True,
                                  clock_reasons={5: 0x40}, seed=4)), limits=JUDGE)
    c = [f for f in hot.findings if f.kind == "contention"]
    assert len(c) == 1 and "rank 5" in c[0].message and "hw_thermal_slowdown" in c[0].message, hot.findings
    assert "GPU" in c[0].message and "cooling" in c[0].advice
    assert not any(f.kind == "chronic_straggler" for f in hot.findings)
    s5 = next(s for s in hot.stragglers if s["rank"] == 5)
    assert s5["gpu_throttled"] >= 0.9 and s5["gpu_throttle"] == ["hw_thermal_slowdown"]
    capped = build(read_job(make_job(tmp_path / "capped", 16, 300, slow_ranks={5: 1.5}, power_capped=True, seed=4)),
                   limits=JUDGE)
    assert not any(f.kind == "contention" for f in capped.findings)
    assert any(f.kind == "chronic_straggler" and "rank 5" in f.message for f in capped.findings), capped.findings
    # named as the GPU names itself: the UUID of the GPU whose samples are rank 5's
    s5 = next(s for s in capped.stragglers if s["rank"] == 5)
    assert s5["gpu_uuids"] == [synthetic_uuid(5)]
    assert any(synthetic_uuid(5) in f.message for f in capped.findings if f.kind == "chronic_straggler")


def test_a_stragglers_gpu_is_named_in_the_rows_numbering_not_its_bindings(tmp_path):
    """Review finding: rank 5's metadata names its GPU as Slurm bound it (/dev/nvidia13), its
    rows by NVML index (5): the finding named "GPU 13" beside the UUID of NVML's GPU 5."""
    d = make_job(tmp_path / "obs", 16, 300, slow_ranks={5: 1.5}, power_capped=True, seed=4)
    meta = d / "rank-00005.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "gpus": ["13"]}))
    rep = build(read_job(d), limits=JUDGE)
    s5 = next(s for s in rep.stragglers if s["rank"] == 5)
    local = json.loads(meta.read_text())["local_rank"]
    assert s5["gpus"] == [str(local)] and s5["gpu_uuids"] == [synthetic_uuid(5)]
    f = next(f for f in rep.findings if f.kind == "chronic_straggler" and "rank 5" in f.message)
    assert f"GPU {local} ({synthetic_uuid(5)})" in f.message
    plain = build(read_job(make_job(tmp_path / "cpu", 16, 300, slow_ranks={5: 1.5}, gpu=False, seed=4)),
                  limits=JUDGE)
    assert all(s["gpu_uuids"] is None for s in plain.stragglers) and plain.stragglers


def test_a_straggler_that_waited_for_a_cpu_is_not_excused_where_no_other_rank_s_wait_was_measured(tmp_path):
    """Rank 0 (1.5x slow) waited for a CPU half its time; no other rank's recorder measured
    its wait (no schedstats on their nodes). Whether rank 0's wait sets it apart is unknown
    (``contended`` None), so it stays a chronic straggler (was: measured against 0, excused
    as contention, "the other ranks' unknown")."""
    import numpy as np
    import pyarrow as pa

    from hpcml.observe.store import RankWriter, read_rank
    from hpcml.testing.synthetic_job import _batch
    d = make_job(tmp_path / "obs", 4, 300, slow_ranks={0: 1.5}, seed=4)
    src = d / "rank-00000.arrows"
    table = pa.Table.from_batches(read_rank(src).batches)
    ts = table["ts"].cast(pa.int64()).to_numpy()
    at = np.linspace(ts.min(), ts.max(), 50).astype(np.int64)
    src.unlink()
    w = RankWriter(src, 0)
    for b in table.to_batches():
        w.write_batch(b)
    w.write_batch(_batch(pa, at, 0, "host", "proc_cpu_wait_s", (at - at[0]) / 2e6))
    w.close()
    rep = build(read_job(d), limits=JUDGE)
    s0 = next(s for s in rep.stragglers if s["rank"] == 0)
    assert s0["cpu_wait"] == pytest.approx(0.5, abs=0.01) and s0["contended"] is None, s0
    assert any(f.kind == "chronic_straggler" and "rank 0" in f.message for f in rep.findings), rep.findings
    assert not any(f.kind == "contention" for f in rep.findings), rep.findings


def test_a_straggler_slow_in_its_own_compute_at_its_power_cap_is_named_not_excused(tmp_path):
    """Rank 5 (1.5x slow in its own compute) keeps its GPU at the power cap on every sample,
    while the others, waiting for it in NCCL's low-power kernels, are capped half the time
    (../shared/recordings/h100: a bf16 GEMM capped at ~700 W, a resident kernel doing nothing
    ~120 W). Under one enforced limit the cap marks load, not a cause: rank 5 is a chronic
    straggler, not contention (was: "held back" in 50% more samples, excused)."""
    rep = build(read_job(make_job(tmp_path / "obs", 16, 300, slow_ranks={5: 1.5}, power_capped=True,
                                  clock_reasons={5: 0x4}, seed=4)), limits=JUDGE)
    assert not any(f.kind == "contention" for f in rep.findings), rep.findings
    assert any(f.kind == "chronic_straggler" and "rank 5" in f.message for f in rep.findings), rep.findings
    s5 = next(s for s in rep.stragglers if s["rank"] == 5)
    assert not s5.get("contended") and s5["gpu_throttle"] is None


def test_nccl_dumps_without_kernel_timing_are_said_unjudged_not_no_straggler(tmp_path):
    """TORCH_NCCL_ENABLE_TIMING=0: the live dumps have no ``duration_ms``; the arrivals judge
    nothing, and the report says so in ``unjudged`` (was: silence, read as "no straggler")."""
    import pickle

    from hpcml.observe.arrivals import LIVE
    from tests.observe.test_arrivals import _dump
    d = make_job(tmp_path / "obs", 4, 300, ranks_per_node=1, seed=6)
    (d / LIVE).mkdir()
    base = 1_800_000_000_000_000_000 + np.arange(200) * 100_000_000
    for r in range(4):
        (d / LIVE / f"rank-{r:05d}").write_bytes(pickle.dumps(_dump(r, 4, [int(b) for b in base], None)))
    rep = build(read_job(d), limits=JUDGE)
    assert rep.arrivals is None and any("no kernel timing" in u for u in rep.unjudged), rep.unjudged


def test_the_rank_the_arrivals_name_whose_gpu_is_held_back_is_contention(tmp_path):
    """An NCCL-like job: step times even, each rank's periodic Flight Recorder dump (with
    timing) shows rank 2 arriving 30 ms late at every all-reduce, and rank 2's GPU reports
    hardware thermal slowdown on every sample: a contention finding naming its GPU, no
    collective_straggler. Without the heat the arrivals name rank 2 a straggler."""
    import pickle

    from hpcml.observe.arrivals import LIVE
    from tests.observe.test_arrivals import _dump

    def job(name: str, reasons: dict[int, int] | None):
        d = make_job(tmp_path / name, 4, 300, ranks_per_node=1, clock_reasons=reasons, seed=6)
        live = d / LIVE
        live.mkdir()
        base = 1_800_000_000_000_000_000 + np.arange(200) * 100_000_000
        for r in range(4):
            took = [1.0 if r == 2 else 31.0] * 200                     # the others wait 30 ms for rank 2
            (live / f"rank-{r:05d}").write_bytes(pickle.dumps(_dump(r, 4, [int(b) for b in base], took)))
        return build(read_job(d), limits=JUDGE)

    hot = job("hot", {2: 0x40})
    kinds = [f.kind for f in hot.findings]
    assert "collective_straggler" not in kinds and "contention" in kinds, hot.findings
    c = next(f for f in hot.findings if f.kind == "contention")
    assert "rank 2" in c.message and "hw_thermal_slowdown" in c.message and hot.arrivals["contended"] is True
    cool = job("cool", None)
    assert any(f.kind == "collective_straggler" and "rank 2" in f.message for f in cool.findings), cool.findings


def test_a_node_whose_every_rank_is_slow_is_one_finding_naming_the_node(tmp_path):
    """16 ranks, two a node; both ranks of one node 1.6x slow: one ``slow_node`` finding
    naming that node, no chronic straggler for either rank (each is still in the table). One
    slow rank of two on a node stays a rank's finding."""
    both = build(read_job(make_job(tmp_path / "both", 16, 300, ranks_per_node=2, slow_ranks={4: 1.6, 5: 1.6},
                                   seed=5)), limits=JUDGE)
    node = next(s["node"] for s in both.stragglers if s["rank"] == 4)
    assert {s["rank"] for s in both.stragglers} == {4, 5}
    slow = [f for f in both.findings if f.kind == "slow_node"]
    assert len(slow) == 1 and f"node {node}: all 2 of its ranks" in slow[0].message, both.findings
    assert f"--exclude={node}" in slow[0].advice
    assert not any(f.kind == "chronic_straggler" for f in both.findings), both.findings
    one = build(read_job(make_job(tmp_path / "one", 16, 300, ranks_per_node=2, slow_ranks={4: 1.6}, seed=5)),
                limits=JUDGE)
    assert not any(f.kind == "slow_node" for f in one.findings)
    assert any(f.kind == "chronic_straggler" and "rank 4" in f.message for f in one.findings), one.findings


def _record_ranks(store: Path, *train_args: str, ranks: int = 2) -> None:
    """``ranks`` real recorders around examples/observe/train.py, as srun would start them."""
    import os
    train = Path(__file__).parents[2] / "examples" / "observe" / "train.py"
    procs = [subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(store), "--interval",
                               "0.2", "--no-gpu", "--", sys.executable, str(train), *train_args],
                              env={**os.environ, "SLURM_PROCID": str(r), "SLURM_NTASKS": str(ranks),
                                   "SLURM_JOB_ID": "77"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for r in range(ranks)]
    for p in procs:
        p.wait(timeout=300)


def test_a_job_too_short_to_judge_says_what_it_did_not_judge(tmp_path):
    """120 steps in about 2 s: too few to judge stragglers. The report says so where it would
    say "no stragglers" (was: "no findings: no stragglers, stalls or lost ranks" below a
    "not judged" line); a script that records no step judges neither stragglers nor stalls."""
    store = tmp_path / "obs"
    _record_ranks(store, "--steps", "120")
    out = _cli(str(store))
    assert out.returncode == 0, out.stderr
    assert "no stragglers, stalls" not in out.stdout
    assert "not judged: stragglers (" in out.stdout and "a verdict needs" in out.stdout, out.stdout
    rep = build(read_job(store))
    assert rep.unjudged and rep.unjudged[0].startswith("stragglers (")
    # no verdict on a rank (a one-off stall, a hiccup of a loaded machine, is no straggler verdict)
    assert not [f for f in rep.findings if f.kind != "one_off_stall"], rep.findings
    assert "Not judged: stragglers (" in (store / "report.html").read_text()
    (tmp_path / "plain.py").write_text("print('no steps here')\n")
    plain = tmp_path / "plain"
    p = subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(plain), "--no-gpu", "--",
                        sys.executable, str(tmp_path / "plain.py")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert build(read_job(plain)).unjudged == ["stragglers (no step was recorded)",
                                              "stalls (no step rate: no step was recorded)"]


def test_a_rank_whose_recorder_was_killed_is_not_counted_as_ended_well(tmp_path):
    """Rank 1 kills its own recorder (SIGKILL) at step 20 of 400; rank 0 ends well, seconds
    after rank 1's last heartbeat. Rank 1's end is unknown and a finding says so (was: no
    finding, counted with the healthy ranks)."""
    store = tmp_path / "obs"
    _record_ranks(store, "--steps", "400", "--kill-recorder-rank", "1", "--kill-at", "20")
    meta = json.loads((store / "rank-00001.json").read_text())
    assert meta.get("end") is None and meta.get("exit_code") is None     # the fault really happened
    rep = build(read_job(store))
    (unended,) = [f for f in rep.findings if f.kind == "unended_rank"]
    assert unended.message.startswith("rank 1: the recording stopped before the rank ended"), unended
    assert 1 not in rep.failed_ranks and rep.missing_ranks == []


def test_a_power_cap_no_other_rank_s_gpu_measured_excuses_no_straggler(tmp_path):
    """Every GPU at its power cap half the time, rank 0 1.5x slow; only rank 0 recorded GPU
    rows (4 ranks on one node seeing all its GPUs: the first task claims and records them,
    ``samplers.claim``). The other ranks' throttling is unknown, not 0: rank 0 stays a
    chronic straggler with its throttling beyond theirs unknown (was: named contention,
    "held back in 50% more of its samples than the other ranks' GPUs")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from hpcml.observe.store import RankWriter, read_rank
    d = make_job(tmp_path / "obs", 4, 300, ranks_per_node=4, slow_ranks={0: 1.5}, power_capped=True,
                 clock_reasons={0: 0x40}, seed=4)
    for r in (1, 2, 3):
        src = d / f"rank-{r:05d}.arrows"
        table = pa.Table.from_batches(read_rank(src).batches)
        src.unlink()
        w = RankWriter(src, r)
        for b in table.filter(pc.invert(pc.equal(table["kind"], "gpu"))).to_batches():
            w.write_batch(b)
        w.close()
    rep = build(read_job(d), limits=JUDGE)
    assert not any(f.kind == "contention" for f in rep.findings), rep.findings
    assert any(f.kind == "chronic_straggler" and "rank 0" in f.message for f in rep.findings), rep.findings
    s0 = next(s for s in rep.stragglers if s["rank"] == 0)
    assert s0["gpu_throttled"] is None and s0["gpu_throttle"] == ["hw_thermal_slowdown"]
