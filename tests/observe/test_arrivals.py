"""Who arrives last at each collective (``hpcml.observe.arrivals``): NCCL dumps built in the
Flight Recorder's documented format (``torch/csrc/distributed/c10d/FlightRecorder``: each
entry's ``time_created_ns``, and with ``TORCH_NCCL_ENABLE_TIMING=1`` ``duration_ms`` from the
CUDA events and ``time_discovered_started_ns``, when the watchdog's 100 ms poll noticed it), written as the pickles torch writes and
read back through the same loader; the NVRx hang dumps (no straggler in a hang: the culprit
never enqueued); and a real gloo job under ``hpcml run``, whose ranks dump every 2 s."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcml.observe.arrivals import arrivals, straggler
from hpcml.observe.hang import load_dump

ROOT = Path(__file__).resolve().parents[2]
NVRX = ROOT.parent / "shared" / "testdata" / "fr_nvrx"


POLL_NS = 100_000_000     # ProcessGroupNCCL's watchdog looks at its work every 100 ms


def _discovered(t_ns: int, rank: int) -> int:
    """When the rank's watchdog noticed a kernel that started at ``t_ns``: its next poll (each
    rank's watchdog has its own phase), as torch writes ``time_discovered_started_ns``."""
    phase = (rank * 37_000_000) % POLL_NS
    return t_ns + (phase - t_ns) % POLL_NS


def _dump(rank: int, world: int, starts_ns: list[int], took_ms: list[float] | None, backend: str = "nccl") -> dict:
    entries = []
    for seq, t in enumerate(starts_ns, 1):
        e = {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "pt_main_thread",
             "thread_id": "1", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
             "profiling_name": f"{backend}:all_reduce", "time_created_ns": t - 200_000, "input_sizes": [[1024]],
             "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"], "state": "completed",
             "time_discovered_started_ns": _discovered(t, rank) if took_ms is not None else None,
             "time_discovered_completed_ns": (_discovered(t + int(took_ms[seq - 1] * 1e6), rank)
                                              if took_ms is not None else None),
             "duration_ms": took_ms[seq - 1] if took_ms is not None else None, "retired": True,
             "timeout_ms": 600000, "is_p2p": False}
        entries.append(e)
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                   "ranks": str(list(range(world)))}},
            "pg_status": {"0": {"last_enqueued_collective": len(starts_ns), "last_started_collective": len(starts_ns),
                                "last_completed_collective": len(starts_ns)}},
            "entries": entries}


def _written(tmp_path: Path, dumps: dict[int, dict]) -> dict[int, dict]:
    out = {}
    for r, d in dumps.items():
        f = tmp_path / f"rank-{r:05d}"
        f.write_bytes(pickle.dumps(d))
        out[r] = load_dump(f)
    return out


def test_the_rank_whose_kernels_start_last_and_run_shortest_is_named(tmp_path):
    """4 ranks, 200 timed all-reduces; rank 2's kernel starts 5 ms after the others', which
    wait for it inside theirs (5 ms longer). The watchdogs noticed the starts on polls 100 ms
    apart, each rank's at its own phase: those times name no one and are not used."""
    rng = np.random.default_rng(3)
    base = 1_800_000_000_000_000_000 + np.arange(200) * 50_000_000
    dumps = {}
    for r in range(4):
        jitter = rng.integers(0, 300_000, 200)
        late = 5_000_000 if r == 2 else 0
        took = [1.0 + (0.0 if r == 2 else 5.0) + float(j) / 1e6 for j in jitter]
        dumps[r] = _dump(r, 4, [int(b + late + j) for b, j in zip(base, jitter)], took)
    scores = arrivals(_written(tmp_path, dumps))
    top = straggler(scores)
    assert top is not None and top.rank == 2 and top.measure == "kernel duration"
    assert top.last_share == 1.0 and 0.004 < top.late_s < 0.006 and top.stability == 1.0
    assert top.busy_s is not None and top.busy_s < min(a.busy_s for a in scores if a.rank != 2)


def test_no_straggler_from_jitter_alone_nor_from_a_pair_that_takes_turns(tmp_path):
    rng = np.random.default_rng(5)
    base = 1_800_000_000_000_000_000 + np.arange(300) * 20_000_000
    even = {r: _dump(r, 4, [int(b + j) for b, j in zip(base, rng.integers(0, 2_000_000, 300))], None, "gloo")
            for r in range(4)}
    scores = arrivals(_written(tmp_path, even))
    assert scores[0].measure == "enqueue" and straggler(scores) is None
    pair = {r: _dump(r, 2, [int(b + j) for b, j in zip(base, rng.integers(0, 2_000_000, 300))], None, "gloo")
            for r in range(2)}
    assert straggler(arrivals(_written(tmp_path, pair))) is None        # each last about half the time
    late = {0: pair[0], 1: _dump(1, 2, [int(b + 3_000_000) for b in base], None, "gloo")}
    got = straggler(arrivals(_written(tmp_path, late)))
    assert got is not None and got.rank == 1 and got.measure == "enqueue"


@pytest.mark.parametrize("case", ["gpu_error_1st", "lock_gil_1st", "gpu_error_2nd", "lock_gil_2nd"])
def test_a_hang_s_dumps_name_no_straggler(case):
    """The NVRx faults hang (the culprit never enqueued the collective the others wait in):
    among the collectives every member recorded, none is a straggler's."""
    where = NVRX / case
    if not where.is_dir():
        pytest.skip("../shared/testdata/fr_nvrx is not on this machine")
    dumps = {int(p.name.rsplit("_", 1)[1]): load_dump(p) for p in where.glob("_dump_*")}
    assert straggler(arrivals(dumps)) is None


@pytest.mark.torch
def test_a_gloo_job_s_slow_rank_is_the_one_the_flight_recorder_sees_arrive_last(tmp_path):
    """2 ranks of plain DDP over gloo under ``hpcml run``, rank 1 computing 3x as long; the
    ranks dump their Flight Recorder every 2 s, and the report names rank 1 by its arrivals."""
    script = ROOT / "tests" / "run" / "scripts" / "raw_ddp.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HPCML_RUN_FR_EVERY": "2",
           "STEPS": "120", "ACCUM": "1", "STEP_S": "0.03", "SLOW_RANK": "1", "SLOW": "3"}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--dir", "job", "--no-report", "--",
                        sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert list((tmp_path / "job").glob("**/flight-recorder-live/rank-*")), "no periodic dump"
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", str(tmp_path / "job"), "--json"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    arrived = doc["observe"]["arrivals"]
    assert arrived is not None and arrived["measure"] == "enqueue" and arrived["straggler"] == 1, arrived


@pytest.mark.machine     # a live straggler verdict: other tests' load is rightly named contention instead (scripts/test)
@pytest.mark.torch
def test_a_4_rank_job_whose_ranks_measure_no_waits_is_named_live_by_its_arrivals(tmp_path):
    """4 ranks of plain DDP over gloo under ``hpcml run`` with the collective-wait hooks off
    (``HPCML_RUN_COLLECTIVE_WAIT=0``: as on NCCL, where a CPU-side timer sees no wait, and
    DDP evens the step times), rank 1 computing 3x: the live watch names rank 1 while the job
    runs, from the ranks' periodic Flight Recorder dumps, by that measure (run.json)."""
    script = ROOT / "tests" / "run" / "scripts" / "raw_ddp.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HPCML_RUN_FR_EVERY": "2",
           "HPCML_RUN_COLLECTIVE_WAIT": "0", "STEPS": "260", "ACCUM": "1", "STEP_S": "0.03", "SLOW_RANK": "1",
           "SLOW": "3"}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "4", "--dir", "job", "--no-report",
                        "--straggler-window", "10s", "--", sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    run = json.loads(next((tmp_path / "job").glob("**/run.json")).read_text())
    named = [s for a in [run, *(run.get("attempts") or [])] for s in a.get("stragglers") or []
             if s["measure"] == "arrivals"]
    assert [s["rank"] for s in named] == [1], (run.get("stragglers"), p.stderr[-2000:])
    assert "straggler: rank 1" in p.stderr and "Flight Recorder" in p.stderr and "(confidence " in p.stderr


@pytest.mark.machine                     # measures contention: the CPUs to itself (scripts/test)
@pytest.mark.torch
def test_a_4_rank_gloo_job_whose_rank_reads_its_input_slowly_is_named_by_both_measures(tmp_path):
    """4 ranks of plain DDP over gloo under ``hpcml run``; rank 2's DataLoader worker takes 3x
    the step's compute to produce each step's batches (its main process waits for them, no
    CPU busy). The report names rank 2 by its arrivals at the collectives (gloo: enqueue) and
    by its compute (its steps less its waits in collectives), and calls it no contention."""
    script = ROOT / "tests" / "run" / "scripts" / "raw_ddp.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HPCML_RUN_FR_EVERY": "2",
           "STEPS": "100", "ACCUM": "1", "STEP_S": "0.04", "SLOW_RANK": "2", "SLOW": "3", "SLOW_IN": "input"}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "4", "--dir", "job", "--no-report", "--",
                        sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", str(tmp_path / "job"), "--json"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    arrived = doc["observe"]["arrivals"]
    assert arrived is not None and arrived["measure"] == "enqueue" and arrived["straggler"] == 2, arrived
    assert not any(f["kind"] == "contention" for f in doc["findings"]), doc["findings"]
    # the step model judges 60 s of steps by default; this job is ~10 s
    obs = next((tmp_path / "job").glob("**/observe"))
    rep = subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", str(obs), "--json",
                          "--min-straggler-s", "5"], env=env, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["straggler_check"]["measure"] == "compute", doc["straggler_check"]
    assert [s["rank"] for s in doc["stragglers"]] == [2], doc["straggler_check"]
    assert doc["arrivals"]["straggler"] == 2 and not any(f["kind"] == "contention" for f in doc["findings"]), (
        doc["findings"], doc["stragglers"])


@pytest.mark.machine                     # measures waits of 4 ranks on 2 CPUs: the CPUs to itself (scripts/test)
@pytest.mark.torch
def test_a_pipeline_s_slow_stage_is_named_by_its_measured_waits_not_the_stage_it_holds_up(tmp_path):
    """4 ranks of a 2-stage pipeline, 2 replicas (``pipeline_ddp.py``: send/recv between the
    stages, each stage's gradients all-reduced with its peer of the other replica); rank 3
    (stage 1 of replica 1) computes 3x. Rank 2, its stage 0, waits for its gradients and so
    reaches its own all-reduce late: the arrivals alone would blame it. The report names rank
    3, by the compute its hooks measured (they time ``dist.recv``), and no finding names rank 2."""
    script = ROOT / "tests" / "run" / "scripts" / "pipeline_ddp.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HPCML_RUN_FR_EVERY": "2",
           "STEPS": "100", "STEP_S": "0.02", "SLOW_RANK": "3", "SLOW": "3"}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "4", "--dir", "job", "--no-report", "--",
                        sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    obs = next((tmp_path / "job").glob("**/observe"))
    rep = subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", str(obs), "--json",
                          "--min-straggler-s", "5"], env=env, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["straggler_check"]["measure"] == "compute"
    assert [s["rank"] for s in doc["stragglers"]] == [3], (doc["stragglers"], doc["arrivals"])
    assert doc["arrivals"]["straggler"] in (None, 3), doc["arrivals"]
    named = [f["message"] for f in doc["findings"] if "straggler" in f["kind"]]
    assert named and not any("rank 2 " in m for m in named), doc["findings"]


def _p2p(rank: int, peer: int, kind: str, seq: int, t_ns: int, took_ms: float) -> dict:
    """A point-to-point entry as NCCL's recorder writes one (``nccl:recv 1<-0``: local ranks
    of the default group, here the global ones)."""
    name = f"nccl:send {rank}->{peer}" if kind == "send" else f"nccl:recv {rank}<-{peer}"
    return {"record_id": 10_000 + seq, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "pt_main_thread",
            "thread_id": "1", "collective_seq_id": 0, "p2p_seq_id": seq, "op_id": seq, "profiling_name": name,
            "time_created_ns": t_ns, "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
            "output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": t_ns,
            "time_discovered_completed_ns": t_ns + int(took_ms * 1e6), "duration_ms": took_ms, "retired": True,
            "timeout_ms": 600000, "is_p2p": True}


def test_a_pipeline_stage_that_waits_in_receives_is_not_blamed_for_passing_the_lateness_on(tmp_path):
    """NCCL dumps (with timing) of a 2-rank data-parallel group {0, 2} whose rank 2 reaches
    every all-reduce 30 ms late: by the collectives alone it is the straggler. But each step
    it also spent 30 ms in a receive from its next stage (rank 3, the slow one) while rank
    0's receives took 1 ms: it waited for a neighbour, passing the lateness on, so the
    arrivals name no one. The same dumps without the long receives name rank 2."""
    base = 1_800_000_000_000_000_000 + np.arange(120) * 100_000_000
    dumps, plain = {}, {}
    for r in (0, 2):
        d = _dump(r, 4, [int(b + (30_000_000 if r == 2 else 0)) for b in base], [31.0 if r == 0 else 1.0] * 120)
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 2]"}}
        plain[r] = json.loads(json.dumps(d))
        d["entries"] += [_p2p(r, r + 1, "recv", k + 1, int(b - 40_000_000), 30.0 if r == 2 else 1.0)
                         for k, b in enumerate(base)]
        dumps[r] = d
    blamed = straggler(arrivals(_written(tmp_path, plain)))
    assert blamed is not None and blamed.rank == 2
    scores = arrivals(_written(tmp_path, dumps))
    top = next(a for a in scores if a.rank == 2)
    assert top.recv_share is not None and top.recv_share > 0.25 and top.group_size == 2, top
    assert straggler(scores) is None, [a.to_json() for a in scores]


def test_a_real_nccl_recording_with_timing_read_as_four_ranks(tmp_path):
    """The H100 recording (``tests/fixtures/gpu/fr/nccl_trace.pickle``: torch's NCCL recorder
    with ``TORCH_NCCL_ENABLE_TIMING=1``, world size 1, three groups) as four ranks of the same
    groups: the others' copies as recorded, rank 3's kernels started 2 ms later and so ran 2 ms
    shorter (the others waited for it in theirs). Every other field as torch wrote it."""
    import copy
    real = load_dump(ROOT / "tests" / "fixtures" / "gpu" / "fr" / "nccl_trace.pickle")
    assert any(e.get("time_discovered_started_ns") for e in real["entries"])
    dumps = {}
    for r in range(4):
        d = copy.deepcopy(real)
        for pg in d["pg_config"].values():
            pg["ranks"] = "[0, 1, 2, 3]"
        for i, e in enumerate(d["entries"]):
            if e.get("time_discovered_started_ns") is None:
                continue
            jitter = (i * 7919 + r * 104729) % 200_000 / 1e6     # up to 0.2 ms between the copies
            e["duration_ms"] = float(e["duration_ms"]) + jitter + (0.0 if r == 3 else 2.0)
        dumps[r] = d
    scores = arrivals(_written(tmp_path, dumps))
    top = straggler(scores)
    assert top is not None and top.rank == 3 and top.measure == "kernel duration", [a.to_json() for a in scores]
    assert 0.0018 < top.late_s < 0.0022 and top.busy_s is not None and top.busy_s < 0.001


def test_the_rank_s_sitecustomize_writes_where_the_arrivals_read():
    from hpcml.observe import arrivals as mod
    from hpcml.run.inject import sitecustomize
    assert sitecustomize.LIVE == mod.LIVE


def test_hostile_dumps_are_refused_or_ignored_never_a_crash(tmp_path):
    """A FIFO is not waited on; numbers past what torch writes (inf, 10**400), a ranks text
    that is not a list, nesting: no arrivals from them, no exception out of ``arrivals``."""
    from hpcml.observe.arrivals import reduce
    fifo = tmp_path / "rank-00001"
    os.mkfifo(fifo)
    with pytest.raises(ValueError):
        load_dump(fifo)
    base = 1_800_000_000_000_000_000 + np.arange(20) * 50_000_000
    good = _dump(0, 2, [int(b) for b in base], None)
    bad = _dump(1, 2, [int(b) for b in base], None)
    for i, e in enumerate(bad["entries"]):
        e["time_created_ns"] = [float("inf"), 10 ** 400, -5, "x", None][i % 5]
    bad["pg_config"]["0"]["ranks"] = "-" * 200_000 + "1"
    assert arrivals({0: good, 1: bad}) == [] and arrivals({0: reduce(good), 1: reduce(bad)}) == []
    bad["pg_config"]["0"]["ranks"] = "[0, 1]"
    bad["entries"][0]["process_group"] = [[[[["0"]]]]]
    assert straggler(arrivals({0: good, 1: bad})) is None


def test_a_rank_late_by_less_than_the_chronic_share_of_a_step_is_no_straggler(tmp_path):
    """Rank 1 starts every collective 3 ms late: with 0.5 s steps that is 0.6% of a step, not
    a straggler by the step model's measure either; with 20 ms steps it is 15%, one."""
    base = 1_800_000_000_000_000_000 + np.arange(200) * 20_000_000
    dumps = {0: _dump(0, 2, [int(b) for b in base], None, "gloo"),
             1: _dump(1, 2, [int(b + 3_000_000) for b in base], None, "gloo")}
    scores = arrivals(_written(tmp_path, dumps))
    assert straggler(scores, step_s=0.5) is None
    got = straggler(scores, step_s=0.02)
    assert got is not None and got.rank == 1


def test_a_live_dump_s_newest_untimed_collectives_and_skewed_clocks_do_not_mislead(tmp_path):
    """The periodic dump is taken while the job runs: the newest collectives have no
    ``duration_ms`` yet (the watchdog fills it in once it sees the kernel end). Rank 1's host
    clock is 50 ms ahead, so by enqueue it would look last every time; rank 3 arrives 4 ms late
    and runs 4 ms shorter. The durations name rank 3, judged over the timed collectives only."""
    rng = np.random.default_rng(11)
    base = 1_800_000_000_000_000_000 + np.arange(150) * 40_000_000
    dumps = {}
    for r in range(4):
        jitter = rng.integers(0, 200_000, 150)
        skew = 50_000_000 if r == 1 else 0
        took = [0.5 + (0.0 if r == 3 else 4.0) + float(j) / 1e6 for j in jitter]
        d = _dump(r, 4, [int(b + skew + j + (4_000_000 if r == 3 else 0)) for b, j in zip(base, jitter)], took)
        for e in d["entries"][-(3 + r):]:                 # each rank's watchdog behind by a few
            e["duration_ms"] = e["time_discovered_started_ns"] = e["time_discovered_completed_ns"] = None
            e["state"] = "started"
        dumps[r] = d
    scores = arrivals(_written(tmp_path, dumps))
    top = straggler(scores)
    assert top is not None and top.rank == 3 and top.measure == "kernel duration", [a.to_json() for a in scores]
    assert top.collectives == 150 - 6 and 0.0035 < top.late_s < 0.0045
    untimed = {r: _dump(r, 4, [int(e["time_created_ns"]) + 200_000 for e in d["entries"]], None)
               for r, d in dumps.items()}
    # NCCL without timing: the host's enqueue times would name rank 1 for its skewed clock (and
    # any rank for its host running ahead of its GPU): not judged, no one named
    assert arrivals(_written(tmp_path, untimed)) == []


def test_nccl_without_timing_names_no_one_by_the_host_s_enqueue_times(tmp_path):
    """TORCH_NCCL_ENABLE_TIMING=0: rank 1's host issues every all-reduce 3 ms after the
    others' (it logs, say) while the GPUs run in step. The enqueue times are the host's, not
    the GPU's arrivals: no straggler (was: rank 1 named "enqueue"). The same dumps from gloo,
    whose collectives run on the host as issued, name rank 1."""
    base = 1_800_000_000_000_000_000 + np.arange(300) * 20_000_000
    rng = np.random.default_rng(8)
    starts = {r: [int(b + j + (3_000_000 if r == 1 else 0)) for b, j in zip(base, rng.integers(0, 500_000, 300))]
              for r in range(4)}
    assert arrivals(_written(tmp_path, {r: _dump(r, 4, s, None) for r, s in starts.items()})) == []
    gloo = straggler(arrivals(_written(tmp_path, {r: _dump(r, 4, s, None, "gloo") for r, s in starts.items()})))
    assert gloo is not None and gloo.rank == 1 and gloo.measure == "enqueue"


def test_coalesced_collectives_are_timed_by_the_record_that_closes_them(tmp_path):
    """Coalesced ops (``_coalescing_manager``): torch records each member op without events
    and times only the closing ``coalesced`` record of the same sequence number. Rank 2
    arrives 5 ms late and its kernels run 5 ms shorter: named by kernel duration, read from
    the closing record (was: the first member's missing duration, judged by enqueue)."""
    base = 1_800_000_000_000_000_000 + np.arange(120) * 50_000_000
    dumps = {}
    for r in range(4):
        took = [1.0 + (0.0 if r == 2 else 5.0)] * 120
        d = _dump(r, 4, [int(b + (5_000_000 if r == 2 else 0)) for b in base], took)
        entries = []
        for e in d["entries"]:
            member = {**e, "profiling_name": "nccl:broadcast", "duration_ms": None,
                      "time_discovered_started_ns": None, "time_discovered_completed_ns": None}
            entries += [member, {**e, "record_id": e["record_id"] + 10_000, "profiling_name": "nccl:coalesced"}]
        d["entries"] = entries
        dumps[r] = d
    top = straggler(arrivals(_written(tmp_path, dumps)))
    assert top is not None and top.rank == 2 and top.measure == "kernel duration"


def test_a_real_live_dump_of_an_hpcml_run_on_a_gpu_read_as_four_ranks(tmp_path):
    """The H200 recording's periodic dump (``tests/fixtures/gpu-h200/run/fr-live-rank-00000.pickle``:
    what an ``hpcml run`` rank's sitecustomize wrote while DDP over NCCL trained, with the
    ``TORCH_NCCL_ENABLE_TIMING=1`` hpcml run sets; 2,000 all-reduces, the newest 45 not yet
    timed). Its ``time_discovered_started_ns`` fall on the watchdog's polls (a few dozen
    distinct milliseconds for 1,955 kernels), which is why the arrivals read the durations.
    As four ranks whose rank 2 arrives 3 ms late at each (the others' kernels 3 ms longer):
    rank 2 is named, by the kernel durations, over the timed collectives only."""
    import copy
    real = load_dump(ROOT / "tests" / "fixtures" / "gpu-h200" / "run" / "fr-live-rank-00000.pickle")
    timed = [e for e in real["entries"] if e.get("duration_ms") is not None]
    assert len(real["entries"]) == 2000 and len(timed) == 1955
    polls = {int(e["time_discovered_started_ns"]) // 1_000_000 for e in timed}
    assert len(polls) < len(timed) / 10
    dumps = {}
    for r in range(4):
        d = copy.deepcopy(real)
        d["pg_config"]["0"]["ranks"] = "[0, 1, 2, 3]"
        for i, e in enumerate(d["entries"]):
            if e.get("duration_ms") is not None:
                jitter = ((i * 7919 + r * 104729) % 300) / 1000.0      # up to 0.3 ms between the copies
                e["duration_ms"] = float(e["duration_ms"]) + jitter + (0.0 if r == 2 else 3.0)
        dumps[r] = d
    scores = arrivals(_written(tmp_path, dumps))
    top = straggler(scores)
    assert top is not None and top.rank == 2 and top.measure == "kernel duration", [a.to_json() for a in scores]
    assert top.collectives == 1955 and 0.0027 < top.late_s < 0.0033 and top.stability == 1.0
