"""``hpcml run`` watching its job live (``hpcml.run.watch``): hangs and crashes named while
the job runs, with the culprit rank and the line it is stuck on.

Real processes: 2 local ranks of a DDP job (torch CPU, gloo) where rank 1 goes wrong at
step 30 (tests/run/faulty_ddp.py), real recorders, real py-spy. The hang timeout's default
(at least 120 s) is shown on a virtual clock through the real heartbeat files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest

from hpcml import schemas
from hpcml.observe.beat import BeatWriter, Progress
from hpcml.observe.snapshot import REQUEST
from hpcml.run.watch import AUTO_FLOOR, HANG, Watch

TASK = Path(__file__).with_name("faulty_ddp.py")


def hpcml(*args, cwd: Path, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    full["PATH"] = f"{Path(sys.executable).parent}:{full.get('PATH', '')}"
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=full, timeout=timeout)


def valid(doc: dict) -> dict:
    jsonschema.validate(doc, schemas.load("run"), cls=jsonschema.Draft202012Validator)
    return doc


def culprit_line(kind: str) -> int:
    lines = TASK.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# culprit:{kind}"))


def left_running(cwd: Path) -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(TASK.name in part for part in p.info["cmdline"] or []) and p.cwd() == str(cwd):
                out.append(f"{p.pid} {p.status()}")
        except psutil.Error:
            continue
    return out


@pytest.mark.torch
@pytest.mark.parametrize("fault", ["collective", "loader", "gil"])
def test_a_hang_is_named_with_the_culprit_and_its_line_and_the_job_stopped(tmp_path, fault):
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--no-report", "--hang-timeout", "2s", "--kill-grace", "3",
              "--", "python", TASK, cwd=tmp_path, env={"FAULT": fault})
    assert p.returncode == HANG, p.stderr
    where = f"{TASK}:{culprit_line(fault)}"
    named = [line for line in p.stderr.splitlines() if "hang: culprit rank" in line]
    assert len(named) == 1 and "culprit rank 1 on " in named[0] and where in named[0], p.stderr
    assert "rank 0 waits, blocked behind 1" in p.stderr
    run = valid(json.loads((tmp_path / "job" / "run.json").read_text()))
    hang = run["hang"]
    assert run["exit_code"] == HANG and hang["action"] == "stop" and hang["stacks"] == 2
    assert [c["rank"] for c in hang["verdict"]["culprits"]] == [1] and hang["verdict"]["blocked"] == [0]
    assert hang["began"] < hang["detected"] <= hang["named"] and hang["detected"] - hang["began"] >= 2
    assert [e["kind"] for e in run["timeline"]] == ["hang"] and run["timeline"][0]["culprits"] == [1]
    # the Flight Recorder: both ranks dumped where the rank blocked in C++ released the GIL;
    # where rank 1 holds it, only rank 0 could, and the stacks named rank 1
    dumps = sorted(x.name for x in (tmp_path / "job" / "observe" / "flight-recorder").iterdir())
    assert dumps == (["rank-00000"] if fault == "gil" else ["rank-00000", "rank-00001"])
    if fault != "gil":
        assert hang["verdict"]["method"] == "flight-recorder" and "never entered" in named[0], named
    assert "crash:" not in p.stderr                 # the ranks the watch stopped did not crash
    assert left_running(tmp_path) == []
    if fault == "collective":                       # the report: the hang first, its timeline, no "failed"
        rep = hpcml("report", "job", "--json", cwd=tmp_path)
        doc = json.loads(rep.stdout)
        jsonschema.validate(doc, schemas.load("run.report"), cls=jsonschema.Draft202012Validator)
        assert doc["findings"][0]["kind"] == "hang" and where in doc["findings"][0]["message"]
        assert not any(f["kind"] == "failed_rank" for f in doc["findings"])
        text = hpcml("report", "job", cwd=tmp_path).stdout
        assert re.search(r"hang: culprit ranks 1 \(flight-recorder\); ranks 0 blocked behind them \(began \d+ s, "
                         r"detected \d+ s, named \d+ s, stop\)", text), text


@pytest.mark.torch
def test_a_crashed_rank_is_named_at_once_and_the_others_stopped(tmp_path):
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--no-report", "--", "python", TASK,
              cwd=tmp_path, env={"FAULT": "exit"})
    assert p.returncode == 1, p.stderr
    crashes = [line for line in p.stderr.splitlines() if "crash:" in line]
    assert crashes == [next(line for line in crashes if "rank 1 " in line)], p.stderr   # rank 0 was stopped
    assert re.search(r"crash: rank 1 on \S+ exited 1 after step 29: injected crash at step 30", crashes[0])
    run = valid(json.loads((tmp_path / "job" / "run.json").read_text()))
    assert [(e["kind"], e["rank"], e["exit_code"]) for e in run["timeline"]] == [("crash", 1, 1)]
    assert run["hang"] is None and left_running(tmp_path) == []


@pytest.mark.torch
def test_report_only_names_the_hang_and_lets_the_job_run(tmp_path):
    """``--on-hang report``: a pause longer than the timeout is named, and the job finishes."""
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--no-report", "--hang-timeout", "1s", "--on-hang", "report",
              "--", "python", TASK, cwd=tmp_path, env={"FAULT": "pause", "PAUSE": "7"})
    assert p.returncode == 0, p.stderr
    assert "hang: no rank completed a step" in p.stderr and "stopping the job" not in p.stderr
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["hang"]["action"] == "report" and run["exit_code"] == 0
    assert all(f"rank {r} done" in (tmp_path / "job" / "logs" / f"rank-0000{r}.out").read_text() for r in (0, 1))


@pytest.mark.parametrize("flag, value, words", [
    ("--hang-timeout", "0s", "more than 0 s"), ("--hang-timeout", "soon", "not auto, off or a duration"),
    ("--on-hang", "panic", "not one of stop, report"), ("--kill-grace", "-1", "at least 0 s"),
    ("--prometheus-port", "70000", "port number"),
])
def test_bad_watch_flags_are_one_line_exit_2_and_nothing_launched(tmp_path, flag, value, words):
    marker = tmp_path / "ran"
    p = hpcml("run", "--dir", "job", flag, value, "--", "touch", marker, cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert words in p.stderr and flag.lstrip("-").replace("-", "_") in p.stderr.replace("-", "_")
    assert not marker.exists() and not (tmp_path / "job").exists()


# -- the hang timeout's default, on a virtual clock -------------------------------------------

def _feed(progress: dict[int, Progress], t: float, step: int) -> None:
    for p in progress.values():
        p.update([t], ["metric"], ["loss"], [1.0], [step])


def test_a_90_s_pause_on_every_rank_of_a_10_minute_job_is_not_a_hang(tmp_path):
    """1 step/s for 10 minutes, every rank pausing 90 s at minute 5 (an evaluation, a
    checkpoint): under the default timeout (max(10 x median step, 120 s)) no hang; a pause
    past it is one, detected on the first scan after the timeout."""
    d = tmp_path / "job"
    observe = d / "observe"
    progress = {r: Progress() for r in range(4)}
    writers = {r: BeatWriter(observe, r, f"n{r}") for r in range(4)}
    watch = Watch(d, 0, 4, period=1.0)
    t0, step = 1_800_000_000.0, 0
    for second in range(1, 600):          # a scan every virtual second; no step in the pause
        t = t0 + second
        if not 300 <= second < 390:
            step += 1
            _feed(progress, t, step)
        for r, w in writers.items():      # the recorders write every interval, steps or not
            w.write(progress[r], now=t)
        assert watch.poll(t + 0.5) is None and watch.hang is None, second
    assert watch.hang_timeout() == AUTO_FLOOR
    last = t
    for k in range(1, 130):               # the job stops making progress
        for r, w in writers.items():
            w.write(progress[r], now=last + k)
        watch.poll(last + k)
        if watch.hang is not None:
            break
    assert watch.hang is not None and watch.hang.detected - last == AUTO_FLOOR
    assert watch.hang.began == last
    assert (observe / "beat" / REQUEST).is_file()          # every rank asked for its stack


def test_no_hang_before_the_first_step_and_the_timeout_follows_slow_steps(tmp_path):
    d = tmp_path / "job"
    progress = {0: Progress(), 1: Progress()}
    writers = {r: BeatWriter(d / "observe", r, "n1") for r in progress}
    for r, w in writers.items():
        w.write(progress[r])
    watch = Watch(d, 0, 2, period=1.0)
    assert watch.poll(time.time() + 10_000) is None and watch.hang is None        # start-up: no step yet
    t = 1_800_000_000.0
    for step in range(20):
        t += 30.0                                                               # 30 s steps
        _feed(progress, t, step)
    for r, w in writers.items():
        w.write(progress[r], now=t + 299)
    watch.poll(t + 299)
    assert watch.hang is None and watch.hang_timeout() == 300.0                # 10 x 30 s
    for r, w in writers.items():
        w.write(progress[r], now=t + 301)
    watch.poll(t + 301)
    assert watch.hang is not None


def test_what_the_watch_says_shows_the_job_s_escapes_as_text(tmp_path, capsys):
    """A line of the watch's that holds the job's own words (a culprit's reason from a
    Flight Recorder dump's names, a stack's) prints an escape sequence as text: no faked
    launcher line, no cleared screen or window title on the operator's terminal."""
    watch = Watch(tmp_path / "job", 0, 2, period=1.0)
    watch._say("hang: culprit rank 3 on n1: x (pg \x1b]0;owned\x07\x1b[2K\rhpcml run: all ranks OK)")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err and "\\x1b]0;owned" in err, err


def test_a_node_whose_clock_is_off_neither_makes_nor_hides_a_hang(tmp_path):
    """Rank 1's node runs 10 minutes ahead: its records carry its own times (judged against
    the launcher's clock, its last step would look 10 minutes in the future and hide the
    hang). Idle time is judged per rank on its own clock."""
    d = tmp_path / "job"
    skew = {0: 0.0, 1: 600.0}
    progress = {r: Progress() for r in skew}
    writers = {r: BeatWriter(d / "observe", r, f"n{r}") for r in skew}
    watch = Watch(d, 0, 2, period=1.0, timeout=60.0)
    t = 1_800_000_000.0
    for step in range(100):
        t += 1.0
        for r, p in progress.items():
            p.update([t + skew[r]], ["metric"], ["loss"], [1.0], [step])
            writers[r].write(p, now=t + skew[r])
        watch.poll(t)
    assert watch.hang is None
    for k in range(1, 62):                             # then nothing moves
        for r, w in writers.items():
            w.write(progress[r], now=t + k + skew[r])
        watch.poll(t + k)
    assert watch.hang is not None and watch.hang.detected - t == 60


@pytest.mark.slurm
@pytest.mark.torch
def test_a_hang_under_slurm_is_named_with_its_node_and_the_step_stopped(slurm_env, tmp_path):
    """The real 2-node local cluster: one rank per node, rank 1 (on n2) stuck before its
    all_reduce; its wrapper on n2 reads its stack, the launcher on n1 names it."""
    from tests.slurmjobs import run_job
    root = Path(__file__).resolve().parents[2]
    env = {**slurm_env, "PYTHONPATH": str(root), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}
    out = run_job(f"""#!/bin/bash
export FAULT=collective
hpcml run --dir job --no-report --hang-timeout 2s --kill-grace 3 -- python {TASK}
echo "run-rc=$?"
""", tmp_path, env, timeout=240)
    assert "run-rc=5" in out, out
    assert f"hang: culprit rank 1 on n2: {TASK}:{culprit_line('collective')}" in out, out
    run = valid(json.loads((tmp_path / "job" / "run.json").read_text()))
    assert run["mode"] == "slurm" and run["hang"]["verdict"]["blocked"] == [0]
    assert left_running(tmp_path) == []


def test_a_rank_that_turns_slow_is_named_within_a_minute_with_its_onset(tmp_path):
    """8 ranks, 0.5 s steps (a ``step`` section); rank 5 becomes 1.8x slower at step 400.
    Scans every 5 virtual seconds through the real heartbeat files: nothing is named before
    the onset, rank 5 within 60 s of it, with the step it began, once; the Prometheus
    endpoint (a real HTTP server, scraped) says the same."""
    from hpcml.ports import free_port
    from hpcml.run.watchexport import WatchExporter
    d = tmp_path / "job"
    progress = {r: Progress() for r in range(8)}
    writers = {r: BeatWriter(d / "observe", r, f"n{r}") for r in range(8)}
    port = free_port("127.0.0.1")
    watch = Watch(d, 0, 8, period=5.0, exporter=WatchExporter(port, "127.0.0.1", "77"))
    t, onset_t, named_at = 1_800_000_000.0, None, None
    for step in range(700):
        t += 0.5
        if step == 400:
            onset_t = t
        for r, p in progress.items():
            slow = 1.8 if r == 5 and step >= 400 else 1.0
            p.update([t], ["section"], ["step"], [0.5 * slow * (1 + 0.02 * ((step * 7 + r * 3) % 5))], [step])
        if step % 10 == 0:
            for r, w in writers.items():
                w.write(progress[r], now=t)
            watch.poll(t)
            if watch.stragglers and named_at is None:
                named_at = t
    assert list(watch.stragglers) == [5], watch.stragglers
    s = watch.stragglers[5]
    assert named_at is not None and onset_t is not None and named_at - onset_t <= 60
    assert 395 <= s.since_step <= 410 and 1.6 < s.score < 2.0 and s.node == "n5"
    assert [e.kind for e in watch.timeline] == ["straggler"]
    import urllib.request
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        watch.exporter.close()
    assert 'hpcml_run_straggler{node="n5",rank="5",slurm_job="77"} 1.0' in text
    assert f'hpcml_run_straggler_since_step{{node="n5",rank="5",slurm_job="77"}} {float(s.since_step)}' in text
    assert 'hpcml_run_straggler{node="n4"' not in text and 'hpcml_run_hang{slurm_job="77"} 0.0' in text
    assert 'hpcml_run_step{slurm_job="77"} 690.0' in text
    assert 'hpcml_run_straggler_score{node="n4",rank="4",slurm_job="77"}' in text


def _metrics(port: int) -> str:
    import urllib.request
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


@pytest.mark.parametrize("timeout", [None, float("inf")])
def test_the_hang_gauge_is_absent_until_the_watch_has_judged_never_0_for_unjudged(tmp_path, timeout):
    """``hpcml_run_hang`` reads 0 only once the watch has judged the job not hung: before any
    step ended (stuck in NCCL's init, say) and with ``--hang-timeout off`` (inf) it is absent,
    so an alert on it is not told "not hung" by a check that never ran (was: 0 from the start)."""
    from hpcml.ports import free_port
    from hpcml.run.watchexport import WatchExporter
    d = tmp_path / "job"
    progress = {r: Progress() for r in range(2)}
    writers = {r: BeatWriter(d / "observe", r, f"n{r}") for r in range(2)}
    port = free_port("127.0.0.1")
    watch = Watch(d, 0, 2, period=1.0, timeout=timeout, exporter=WatchExporter(port, "127.0.0.1", "78"))
    try:
        t = 1_800_000_000.0
        for r, w in writers.items():
            w.write(progress[r], now=t)                    # alive, no step yet
        watch.poll(t)
        assert "hpcml_run_hang{" not in _metrics(port)
        for step in range(20):
            t += 0.5
            for p in progress.values():
                p.update([t], ["section"], ["step"], [0.5], [step])
            for r, w in writers.items():
                w.write(progress[r], now=t)
            watch.poll(t)
        text = _metrics(port)
        if timeout is None:
            assert 'hpcml_run_hang{slurm_job="78"} 0.0' in text, text
        else:
            assert "hpcml_run_hang{" not in text, text
    finally:
        watch.exporter.close()


def _sync_job(tmp_path, ranks: int, step_s: float, steps: int, slow_rank: int, sync: bool, window: float,
              everyone: bool = False, waiting: bool = False, hot: bool = False, capped: bool = False,
              cpu_hot: bool = False, gpus_of: int | None = None, waits_of: int | None = None):
    """Heartbeats of a job whose ``slow_rank`` computes twice as long from step 100: with
    ``sync`` every rank's step lasts as long as the slowest's and the others wait the
    difference in collectives (a ``collective_wait`` per step), else each rank's step is its
    own compute. ``waiting``: the slow rank's extra time is spent waiting for a CPU (its
    threads' run delay, as its recorder reports it). ``hot``: the slow rank's GPU has its
    clocks held back for heat (hardware thermal slowdown) from then on; ``capped``: every
    rank's GPU reaches its power cap every other step (as busy GPUs do). ``cpu_hot``: the slow
    rank's CPU cores run throttled for heat from then on (the kernel's thermal throttle
    counters, as its recorder reports them; the others' too, a tenth of the time). ``gpus_of``:
    only that rank's recorder reports GPU throttling (it claimed every GPU of the node);
    ``waits_of``: only that rank's recorder reports its wait for a CPU (no schedstats on the others' nodes).
    Scanned every second of virtual time; (watch, seconds from onset to named)."""
    d = tmp_path / "job"
    progress = {r: Progress() for r in range(ranks)}
    writers = {r: BeatWriter(d / "observe", r, f"n{r}") for r in range(ranks)}
    watch = Watch(d, 0, ranks, period=1.0, straggler_window=window)
    t, onset, named = 1_800_000_000.0, None, None
    waited = [0.0] * ranks
    held = [0.0] * ranks
    cooked = [0.0] * ranks
    reasons = [0x4 if capped else 0] * ranks
    for step in range(steps):
        compute = [step_s * (2.0 if (r == slow_rank or everyone) and step >= 100 else 1.0)
                   * (1 + 0.02 * ((step * 7 + r * 3) % 5)) for r in range(ranks)]
        if waiting and step >= 100:
            waited[slow_rank] += compute[slow_rank] / 2
        for r in range(ranks):           # at the power cap every other step; held back for heat every step
            if (capped and step % 2) or (hot and r == slow_rank and step >= 100):
                held[r] += max(compute) + 0.001 if sync else step_s
        if hot and step >= 100:
            reasons[slow_rank] |= 0x40
        if cpu_hot:
            for r in range(ranks):
                cooked[r] += (max(compute) + 0.001) * (0.9 if r == slow_rank and step >= 100 else 0.1)
        longest = max(compute) + 0.001
        t += longest if sync else step_s
        if step == 100:
            onset = t
        for r, p in progress.items():
            if sync:
                p.update([t, t], ["section", "section"], ["step", "collective_wait"], [longest, longest - compute[r]],
                         [step, step])
            else:
                p.update([t], ["section"], ["step"], [compute[r]], [step])
        if step % max(1, int(1 / step_s)) == 0:
            for r, w in writers.items():
                gpu = gpus_of is None or r == gpus_of
                wait = waited[r] if waits_of in (None, r) else None
                w.write(progress[r], now=t, cpu_wait_s=wait, steal_s=0.0, gpu_throttled_s=held[r] if gpu else None,
                        gpu_throttle=(reasons[r] or None) if gpu else None,
                        **({"cpu_throttled_s": round(cooked[r], 3)} if cpu_hot else {}))
            watch.poll(t)
            if (watch.stragglers or watch.contended) and named is None:
                named = t
    return watch, None if named is None else named - onset


def test_in_a_synchronous_2_rank_job_the_rank_the_other_waits_for_is_named_about_2x(tmp_path):
    """DDP's case: both ranks' steps equal (the all-reduce waits for the slower); from the
    waits the slow rank is named within two minutes of its onset (the default 60 s window),
    against the other rank alone (2x, not the 1.33x a median of two gives)."""
    watch, after = _sync_job(tmp_path, 2, 0.5, 400, 1, sync=True, window=60.0)
    assert list(watch.stragglers) == [1] and 1.8 < watch.stragglers[1].score < 2.2, watch.stragglers
    st = watch.stragglers[1]
    assert after is not None and after <= 60 and st.since_step == 100 and not st.since_before
    assert st.confidence is not None and 0.5 <= st.confidence <= 1.0


def test_a_rank_slowed_by_waiting_for_its_node_s_cpus_is_named_as_contention_not_a_straggler(tmp_path):
    """The slow rank's extra time is run-queue wait (another process on its node): it is
    named as contention, with its wait, and is no straggler (a restart would not act)."""
    watch, after = _sync_job(tmp_path, 2, 0.5, 400, 1, sync=True, window=60.0, waiting=True)
    assert watch.stragglers == {} and list(watch.contended) == [1], (watch.stragglers, watch.contended)
    c = watch.contended[1]
    assert c.since_step == 100 and c.cpu_wait is not None and 0.4 <= c.cpu_wait <= 0.6 and after <= 60
    assert [e.kind for e in watch.timeline] == ["contention"]
    assert "waited for a CPU" in watch.timeline[0].what
    seen = watch.fields()
    assert [s.rank for s in seen.contended] == [1] and seen.stragglers == []


def test_a_rank_that_waited_for_a_cpu_is_no_contention_where_no_other_rank_s_wait_was_measured(tmp_path):
    """The slow rank waits for a CPU half its time, and no other rank's wait is measured (no
    schedstats on their nodes): whether its wait sets it apart is unknown, not measured
    against 0, so it stays a straggler a restart may act on (was: contention)."""
    watch, after = _sync_job(tmp_path, 2, 0.5, 400, 1, sync=True, window=60.0, waiting=True, waits_of=1)
    assert list(watch.stragglers) == [1] and watch.contended == {}, (watch.stragglers, watch.contended)
    assert after is not None and after <= 60


def test_a_rank_whose_gpu_is_held_back_for_heat_is_named_as_contention_with_the_reason(tmp_path):
    """Every GPU at its power cap half the time (excuses no one), and from step 100 the slow
    rank's GPU also held back by hardware thermal slowdown all the time: named as contention, the GPU's
    share beyond the others' and its reasons said, no straggler. The same job with the power
    cap alone names the slow rank a straggler."""
    watch, after = _sync_job(tmp_path, 4, 0.5, 400, 1, sync=True, window=60.0, hot=True, capped=True)
    assert watch.stragglers == {} and list(watch.contended) == [1], (watch.stragglers, watch.contended)
    c = watch.contended[1]
    assert c.gpu_throttled is not None and 0.3 <= c.gpu_throttled <= 1.0, c
    assert c.since_step == 100 and after is not None and after <= 60
    assert c.gpu_throttle == ["sw_power_cap", "hw_thermal_slowdown"]
    assert [e.kind for e in watch.timeline] == ["contention"]
    assert "its GPU's clocks were held back" in watch.timeline[0].what
    assert "power or cooling" in watch.timeline[0].what
    capped, _ = _sync_job(tmp_path / "capped", 4, 0.5, 400, 1, sync=True, window=60.0, capped=True)
    assert list(capped.stragglers) == [1] and capped.contended == {}, (capped.stragglers, capped.contended)


def test_a_rank_whose_cpu_cores_run_throttled_for_heat_is_contention_not_a_straggler(tmp_path):
    """The slow rank's cores run throttled for heat 90% of the time from its onset (the
    others' a tenth, as a warm machine's do): named as contention with that share beyond
    the others' and the CPU's cooling as the cause, no straggler."""
    watch, after = _sync_job(tmp_path, 4, 0.5, 400, 1, sync=True, window=60.0, cpu_hot=True)
    assert watch.stragglers == {} and list(watch.contended) == [1], (watch.stragglers, watch.contended)
    c = watch.contended[1]
    assert c.cpu_throttled is not None and 0.5 <= c.cpu_throttled <= 0.9, c
    assert c.since_step == 100 and after is not None and after <= 60
    what = watch.timeline[0].what
    assert "its CPU cores ran throttled for heat" in what and "CPU cooling held it back" in what, what


def test_a_job_that_slows_down_as_a_whole_has_no_straggler(tmp_path):
    """Every rank 2x slower from step 100 (the host, the filesystem, the job itself): the
    leave-one-out score moves no rank, and no onset is a straggler's."""
    watch, after = _sync_job(tmp_path, 4, 0.5, 400, -1, sync=True, window=60.0, everyone=True)
    assert watch.stragglers == {} and after is None
    assert all(0.9 < v < 1.1 for v in watch.scores.values()), watch.scores


def test_slow_steps_of_10_s_are_named_on_enough_steps_with_their_onset(tmp_path):
    """10 s steps: a 60 s window is six samples, too few; the model waits for its 30 steps
    of evidence and names the rank with the step its slowness began."""
    watch, after = _sync_job(tmp_path, 2, 10.0, 200, 1, sync=True, window=60.0)
    assert list(watch.stragglers) == [1] and watch.stragglers[1].since_step == 100
    assert after is not None and after <= 20 * 20.0          # within 20 of its (2x) steps


def test_fast_steps_that_do_not_synchronise_are_judged_within_the_ring(tmp_path):
    """10 ms steps: a 60 s window is 6,000 steps, more than the 2,048 each rank's ring keeps;
    the model judges the ring instead (20 s of steps) and names the rank within 2 minutes."""
    watch, after = _sync_job(tmp_path, 4, 0.01, 9000, 2, sync=False, window=60.0)
    assert list(watch.stragglers) == [2] and 1.8 < watch.stragglers[2].score < 2.2, watch.stragglers
    assert after is not None and after <= 120


def test_a_job_that_logs_every_100_steps_or_on_rank_0_only_gets_a_timeout_that_fits(tmp_path):
    """0.5 s steps, a step logged every 100 (50 s apart), by rank 0 only: the default timeout
    is 10 x the 50 s between two logs, not 10 x the 0.5 s step (a false hang at 120 s)."""
    d = tmp_path / "job"
    progress = {0: Progress(), 1: Progress()}
    writers = {r: BeatWriter(d / "observe", r, "n1") for r in progress}
    watch = Watch(d, 0, 2, period=1.0)
    t = 1_800_000_000.0
    for k in range(10):
        t += 50.0
        progress[0].update([t], ["metric"], ["loss"], [1.0], [100 * k])
    for k in (1, 200, 499):
        for r, w in writers.items():
            w.write(progress[r], now=t + k)
        assert watch.poll(t + k) is None and watch.hang is None, k
    assert watch.hang_timeout() == 500.0
    for r, w in writers.items():
        w.write(progress[r], now=t + 501)
    watch.poll(t + 501)
    assert watch.hang is not None


def _two_ranks(tmp_path, at: float, exits=(None, None), **watch: Any):
    """Two ranks at step 5 since t, their records written at t + ``at`` (with ``exits``),
    one scan then: (the watch, the ranks' progress, their writers, t + ``at``)."""
    d = tmp_path / "job"
    progress = {0: Progress(), 1: Progress()}
    writers = {r: BeatWriter(d / "observe", r, f"n{r}") for r in progress}
    w = Watch(d, 0, 2, period=1.0, **watch)
    t = 1_800_000_000.0
    for r, p in progress.items():
        p.update([t], ["metric"], ["loss"], [1.0], [5])
        writers[r].write(p, now=t + at, exit=exits[r])
    w.poll(t + at)
    return w, progress, writers, t + at


def _hung_watch(tmp_path, on_hang="stop"):
    watch, progress, writers, t = _two_ranks(tmp_path, 20, timeout=10.0, on_hang=on_hang)
    assert watch.hang is not None
    return watch, progress, writers, t


def test_a_job_that_ends_while_its_stacks_are_taken_is_not_a_stopped_hang(tmp_path):
    watch, progress, writers, t = _hung_watch(tmp_path)
    for r, w in writers.items():
        w.write(progress[r], now=t + 1, exit=0)
    watch.finish()
    assert watch.hang.action == "ended" and watch.timeline[-1].action == "ended"
    valid({"schema": "hpcml.run/1", "command": ["x"], "mode": "local", "started": t, **watch.to_json()})


def test_what_the_watch_saw_goes_onto_the_record_as_its_models_and_into_run_json_unchanged(tmp_path):
    from hpcml.jobmodel import RunRecord
    watch, progress, writers, t = _hung_watch(tmp_path)
    for r, w in writers.items():
        w.write(progress[r], now=t + 1, exit=0)
    watch.finish()
    watch.stopping("node", "node n9 lost (DOWN)", t - 1, node="n9")
    seen = watch.fields()
    assert seen.hang is watch.hang and seen.timeline == watch.timeline and seen.furthest_step == 5
    assert seen.first_step_at == t - 20 and seen.stopped_for is None and seen.ignored_beats == []
    assert (watch.timeline[-1].kind, watch.timeline[-1].node, watch.timeline[-1].action) == ("node", "n9", "stop")
    record = RunRecord(command=["x"], mode="local", started=t)
    seen.into(record)
    doc = record.to_json()
    assert "stopped_for" not in doc and "ignored_beats" not in doc          # fields only when there is one
    # run.json's fields, in the order they always had
    assert json.dumps(watch.to_json()) == json.dumps({
        "timeline": [e.to_json() for e in watch.timeline], "hang": watch.hang.to_json(), "stragglers": [],
        "furthest_step": 5, "first_step_at": t - 20}) == json.dumps({k: doc[k] for k in watch.to_json()})


def test_ranks_that_exit_after_the_watch_stopped_the_job_are_not_crashes(tmp_path):
    """A rank's TERM handler may save and exit 1: after a stop, that is not a crash."""
    watch, progress, writers, t = _hung_watch(tmp_path)
    for r, w in writers.items():
        w.write(progress[r], now=t + 1, snapshot=10**13)
    assert watch.poll(t + 25) is None and watch.poll(t + 28) == "stop"     # the stacks, then the FR grace
    for r, w in writers.items():
        w.write(progress[r], now=t + 26, exit=1)
    watch.finish()
    assert [e.kind for e in watch.timeline] == ["hang"] and watch.crashed_codes == {}


# -- whose records, and what ended a rank ---------------------------------------------------

def test_a_rank_whose_record_stops_changing_does_not_hide_a_hang(tmp_path):
    """Rank 1's record replaced by a file that is not its (its recorder now writes to a file
    no one reads): its last record stays, but from then on it is idle by the launcher's
    clock, so the hang of both ranks is still found."""
    from hpcml.observe.beat import beat_path, rank_key, sign_with
    d, secret = tmp_path / "job", b"z" * 32
    progress = {0: Progress(), 1: Progress()}
    writers = {}
    for r in progress:
        sign_with(rank_key(secret, r))
        writers[r] = BeatWriter(d / "observe", r, f"n{r}")
    sign_with(None)
    watch = Watch(d, 0, 2, period=1.0, timeout=30.0, secret=secret)
    t = 1_800_000_000.0
    for r, p in progress.items():
        p.update([t], ["metric"], ["loss"], [1.0], [5])
        writers[r].write(p, now=t)
    watch.poll(t)
    forged = beat_path(d / "observe", 1).read_text().replace('"step":5', '"step":6')
    tmp = beat_path(d / "observe", 1).with_suffix(".new")
    tmp.write_text(forged)
    tmp.replace(beat_path(d / "observe", 1))
    for k in range(1, 40):                            # nothing moves; rank 0 keeps beating
        writers[0].write(progress[0], now=t + k)
        writers[1].write(progress[1], now=t + k)      # into the replaced file: unseen
        watch.poll(t + k)
        if watch.hang is not None:
            break
    assert watch.hang is not None and 30 <= watch.hang.detected - t <= 34, watch.hang
    assert [(i.rank, i.why) for i in watch.ignored] == [(1, "not signed by the rank's recorder")]
    assert watch.beats[1].step == 5


def _ended_by_term(tmp_path, signals=(), job_id=None):
    """Rank 1 ended 143 (TERM); then ``signals`` reached hpcml run, before the next scan."""
    watch, _, _, t = _two_ranks(tmp_path, 0, (None, 143), timeout=60.0, job_id=job_id)
    assert watch.timeline == []                      # held for one scan: a TERM may be on its way
    watch.signals.extend(signals)
    watch.poll(t + 1)
    return watch


def test_a_rank_ended_by_a_term_that_reached_hpcml_run_too_is_not_a_crash(tmp_path):
    """scancel, the time limit, a requeue: each node's slurmd signals its own steps, and a
    rank may die of the TERM before hpcml run's own comes; it is not a crash for that."""
    import signal as sig
    assert _ended_by_term(tmp_path, [sig.SIGTERM]).timeline == []
    alone = _ended_by_term(tmp_path / "alone")                         # no TERM came: a crash after all
    assert [(e.kind, e.rank, e.exit_code) for e in alone.timeline] == [("crash", 1, 143)]


def test_a_rank_the_requeue_ended_is_not_a_crash(tmp_path, monkeypatch):
    """``hpcml ckpt`` notes the requeue before it asks Slurm for it: the 143 that follows
    is the requeue's."""
    from hpcml.cluster import requeue
    monkeypatch.setenv(requeue.ENV_DIR, str(tmp_path / "job"))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    (tmp_path / "job").mkdir()
    assert requeue.note(70, "SIGUSR1", tmp_path / "ckpt") is not None
    assert _ended_by_term(tmp_path, job_id="77").timeline == []


def test_records_for_ranks_the_job_does_not_have_are_said_once_each_and_then_no_more(tmp_path, capsys):
    """However many a program writes, and however often: one line each, up to a bound."""
    from hpcml.observe.beat import beat_path
    from hpcml.run.watch import IGNORED_SAID
    d = tmp_path / "job"
    beat_path(d / "observe", 0).parent.mkdir(parents=True)
    watch = Watch(d, 0, 2, period=1.0)
    t = 1_800_000_000.0
    for k in range(3):
        for r in range(2, IGNORED_SAID + 12):
            beat_path(d / "observe", r).write_text(json.dumps({"schema": "hpcml.observe.beat/1", "rank": r,
                                                               "progress": t + k, "beat": t + k, "exit": 3}))
        watch.poll(t + k)
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if "ignoring heartbeats for rank" in line]) == IGNORED_SAID == len(watch.ignored)
    assert len([line for line in err if "ignoring more heartbeats" in line]) == 1 and len(err) == IGNORED_SAID + 1
    assert watch.beats == {} and watch.timeline == [] and watch.to_json()["ignored_beats"] == [i.to_json() for i in watch.ignored]


def _even_nccl_job(tmp_path):
    """Four ranks of an NCCL job, 20 even steps of 0.5 s, no waits measured: (job dir, its
    watch, the time of its last beat)."""
    d = tmp_path / "job"
    progress = {r: Progress() for r in range(4)}
    writers = {r: BeatWriter(d / "observe", r, f"n{r}") for r in range(4)}
    watch = Watch(d, 0, 4, period=1.0)
    t = 1_800_000_000.0
    for step in range(20):
        t += 0.5
        for r, p in progress.items():
            p.update([t], ["section"], ["step"], [0.5], [step])
            writers[r].write(p, now=t)
        watch.poll(t)
    return d, watch, t


def test_where_no_rank_measures_its_waits_the_flight_recorder_s_arrivals_name_the_straggler(tmp_path):
    """An NCCL job: no rank's record has waits in collectives, and its step times are even
    (the all-reduce evens them). The ranks' periodic Flight Recorder dumps (built in the
    recorder's format, with timing) show rank 2 starting every collective 100 ms late (a fifth
    of its 0.5 s steps): the watch names it, by that measure, once."""
    import pickle

    import numpy as np

    from tests.observe.test_arrivals import _dump
    d, watch, t = _even_nccl_job(tmp_path)
    assert watch.stragglers == {}
    live = d / "observe" / "flight-recorder-live"
    live.mkdir(parents=True)
    base = 1_800_000_000_000_000_000 + np.arange(100) * 50_000_000
    for r in range(4):
        dump = _dump(r, 4, [int(b + (100_000_000 if r == 2 else 0) + r * 1000) for b in base],
                     [1.0 if r == 2 else 101.0] * 100)        # the others wait the 100 ms in theirs
        (live / f"rank-{r:05d}").write_bytes(pickle.dumps(dump))
    watch.poll(t + 20)
    assert list(watch.stragglers) == [2] and watch.stragglers[2].measure == "arrivals", watch.stragglers
    watch.poll(t + 40)
    assert [e.kind for e in watch.timeline] == ["straggler"] and "Flight Recorder" in watch.timeline[0].what


def test_nccl_dumps_without_timing_are_said_not_judged_once_not_left_silent(tmp_path, capsys):
    """TORCH_NCCL_ENABLE_TIMING=0: the live dumps carry no kernel durations, so the arrivals
    judge nothing; the watch says so, once, rather than leaving silence read as "no straggler"."""
    import pickle

    import numpy as np

    from tests.observe.test_arrivals import _dump
    d, watch, t = _even_nccl_job(tmp_path)
    live = d / "observe" / "flight-recorder-live"
    live.mkdir(parents=True)
    base = 1_800_000_000_000_000_000 + np.arange(100) * 50_000_000
    for r in range(4):
        dump = _dump(r, 4, [int(b + (100_000_000 if r == 2 else 0)) for b in base], None)
        (live / f"rank-{r:05d}").write_bytes(pickle.dumps(dump))
    watch.poll(t + 20)
    (live / "rank-00000").write_bytes((live / "rank-00000").read_bytes())    # changed: read again
    watch.poll(t + 40)
    said = capsys.readouterr()
    text = said.out + said.err
    assert watch.stragglers == {} and text.count("no kernel timing") == 1, text


def test_a_rank_that_turns_late_near_the_end_is_named_from_the_window_at_its_onset_with_confidence(tmp_path, capsys):
    """An NCCL job of 4 ranks, 0.5 s steps, two all-reduces a step for 300 s; rank 2 starts
    every collective 100 ms late from 250 s on (step 500), 50 s before the end: in the ring's
    1,200 collectives it is last in only a sixth, so judging the whole ring named no one.
    The arrivals judge the watch's window (60 s), name it, at its onset's step, with the
    line's confidence."""
    import pickle

    import numpy as np

    from tests.observe.test_arrivals import _dump
    d = tmp_path / "job"
    progress = {r: Progress() for r in range(4)}
    writers = {r: BeatWriter(d / "observe", r, f"n{r}") for r in range(4)}
    watch = Watch(d, 0, 4, period=1.0)
    t0 = t = 1_800_000_000.0
    for step in range(600):
        t += 0.5
        for p in progress.values():
            p.update([t], ["section"], ["step"], [0.5], [step])
        if step % 4 == 0:
            for r, w in writers.items():
                w.write(progress[r], now=t)
            watch.poll(t)
    assert watch.stragglers == {}
    live = d / "observe" / "flight-recorder-live"
    live.mkdir(parents=True)
    base = int(t0 * 1e9) + np.arange(1200) * 250_000_000
    for r in range(4):
        late = [100_000_000 if r == 2 and k >= 1000 else 0 for k in range(1200)]
        took = [1.0 if r == 2 and k >= 1000 else (101.0 if k >= 1000 else 1.0) for k in range(1200)]
        dump = _dump(r, 4, [int(b + late[k] + r * 1000) for k, b in enumerate(base)], took)
        (live / f"rank-{r:05d}").write_bytes(pickle.dumps(dump))
    watch.poll(t + 1)
    assert list(watch.stragglers) == [2], watch.stragglers
    st = watch.stragglers[2]
    assert st.measure == "arrivals" and not st.since_before and abs(st.since_step - 500) <= 6, st
    line = [ln for ln in capsys.readouterr().err.splitlines() if "straggler: rank 2" in ln]
    assert line and "Flight Recorder" in line[0] and "(confidence " in line[0] and "since step" in line[0], line


def test_a_node_whose_every_rank_is_slow_is_named_as_the_node(tmp_path):
    """8 ranks on 4 nodes (two each); both ranks of n1 compute 2x from step 100: one line
    names the node and its ranks, not two stragglers; each rank is still recorded."""
    d = tmp_path / "job"
    node_of = {r: f"n{r // 2}" for r in range(8)}
    progress = {r: Progress() for r in range(8)}
    writers = {r: BeatWriter(d / "observe", r, node_of[r]) for r in range(8)}
    watch = Watch(d, 0, 8, period=1.0)
    t = 1_800_000_000.0
    for step in range(400):
        compute = [0.5 * (2.0 if node_of[r] == "n1" and step >= 100 else 1.0) * (1 + 0.02 * ((step * 7 + r * 3) % 5))
                   for r in range(8)]
        longest = max(compute) + 0.001
        t += longest
        for r, p in progress.items():
            p.update([t, t], ["section", "section"], ["step", "collective_wait"], [longest, longest - compute[r]],
                     [step, step])
        if step % 2 == 0:
            for r, w in writers.items():
                w.write(progress[r], now=t)
            watch.poll(t)
    assert sorted(watch.stragglers) == [2, 3], watch.stragglers
    assert len(watch.timeline) == 1 and watch.timeline[0].what.startswith("node n1: all 2 of its ranks "), \
        watch.timeline


def test_a_power_cap_no_other_rank_s_gpu_was_measured_for_excuses_no_straggler(tmp_path):
    """Every GPU at its power cap half the time, the slow rank's recorder the only one that
    reports GPU throttling (it claimed the node's GPUs): the other ranks' share is unknown,
    not 0, so the cap sets the slow rank apart from nothing: a straggler, its GPU throttling
    beyond the others' unknown (was: contention)."""
    watch, _ = _sync_job(tmp_path, 4, 0.5, 400, 1, sync=True, window=60.0, capped=True, gpus_of=1)
    assert list(watch.stragglers) == [1] and watch.contended == {}, (watch.stragglers, watch.contended)
