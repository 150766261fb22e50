"""``hpcml observe record`` around real processes (outside Slurm: one rank)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcml.observe.store import read_job  # noqa: E402

TRAIN = """
import sys, time
from hpcml import observe
for i in range(20):
    with observe.section("step"):
        time.sleep(0.01)
    observe.log(step=i, loss=1.0 / (i + 1))
sys.exit(int(sys.argv[1]))
"""


def _record(tmp_path: Path, *cmd: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir",
                             str(tmp_path / "job"), "--interval", "0.1", "--", *cmd],
                            env={**os.environ, **(env or {})}, **kw)


def test_records_app_metrics_host_samples_and_exit_code(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    p = _record(tmp_path, sys.executable, str(script), "5", env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert p.wait(timeout=120) == 5
    job = read_job(tmp_path / "job")
    t = job.table.to_pydict()
    names = set(zip(t["kind"], t["name"]))
    assert ("metric", "loss") in names and ("section", "step") in names
    assert ("host", "proc_rss_bytes") in names and ("host", "cpu_percent") in names
    meta = json.loads((tmp_path / "job" / "rank-00000.json").read_text())
    assert meta["exit_code"] == 5 and meta["app_batches"] >= 1
    assert json.loads((tmp_path / "job" / "job.json").read_text())["end"] >= meta["start"]
    assert job.missing == []


def test_sigterm_is_forwarded_and_the_exit_code_follows(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        import signal, sys, time, pathlib
        def bye(sig, frame):
            pathlib.Path({str(tmp_path / 'got-term')!r}).write_text(str(sig))
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        pathlib.Path({str(tmp_path / 'ready')!r}).touch()
        time.sleep(60)
    """))
    p = _record(tmp_path, sys.executable, str(child))
    deadline = time.time() + 60
    while not (tmp_path / "ready").exists() and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0
    assert (tmp_path / "got-term").read_text() == str(int(signal.SIGTERM))


def test_a_command_killed_by_a_signal_exits_128_plus_n(tmp_path):
    p = _record(tmp_path, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert p.wait(timeout=60) == 128 + 9
    meta = json.loads(next(tmp_path.rglob("rank-00000.json")).read_text())
    assert meta["exit_code"] == 137 and meta["signal"] == 9         # as the shell says, not -9


def test_gpu_rows_from_a_recorded_nvml_replay(tmp_path):
    """No GPU here: the NVML sampler replays recorded samples (HPCML_OBSERVE_NVML_REPLAY);
    only the GPU bound to the task (SLURM_STEP_GPUS=1) is recorded."""
    replay = tmp_path / "nvml.jsonl"
    replay.write_text("\n".join(json.dumps({"gpus": [
        {"index": 0, "util_gpu_percent": 99, "power_w": 300.0},
        {"index": 1, "util_gpu_percent": 40 + k, "power_w": 250.0, "sm_clock_mhz": 1410}]})
        for k in range(3)))
    p = _record(tmp_path, sys.executable, "-c", "import time; time.sleep(0.8)",
                env={"HPCML_OBSERVE_NVML_REPLAY": str(replay), "SLURM_STEP_GPUS": "1"})
    assert p.wait(timeout=60) == 0
    t = read_job(tmp_path / "job").table.to_pydict()
    gpu_rows = [(n, v, g) for k, n, v, g in zip(t["kind"], t["name"], t["value"], t["gpu"]) if k == "gpu"]
    assert gpu_rows and {g for _, _, g in gpu_rows} == {1}
    assert {v for n, v, _ in gpu_rows if n == "util_gpu_percent"} <= {40.0, 41.0, 42.0}
    meta = read_job(tmp_path / "job").meta["ranks"]["0"]
    # the sampler opened after the command started: its open is off the rank's start, and said
    assert meta["command_started"] <= meta["gpu_sampler_opened"] and meta["gpu_sampler_open_s"] >= 0
    assert meta["gpu_sampler"]["kind"] == "nvml", meta["gpu_sampler"]


def test_a_gpu_held_back_for_heat_is_counted_on_the_heartbeat(tmp_path):
    """The replayed GPU reports hardware thermal slowdown (NVML's 0x40) on every other sample
    and an idle bit (0x1, no slowdown) on the rest: the rank's heartbeat carries the seconds
    its GPU was held back (about half of the 3 s: room for a loaded machine's late first
    samples, which once left 0.12 s of 1.2) and the reasons seen, for the watch."""
    from hpcml.observe.beat import read_beats
    replay = tmp_path / "nvml.jsonl"
    replay.write_text("\n".join(json.dumps({"gpus": [
        {"index": 0, "util_gpu_percent": 99, "sm_clock_mhz": 1980 if k % 2 else 1200,
         "clocks_event_reasons": 0x1 if k % 2 else 0x40}]}) for k in range(2)))
    p = _record(tmp_path, sys.executable, "-c", "import time; time.sleep(3)",
                env={"HPCML_OBSERVE_NVML_REPLAY": str(replay), "SLURM_STEP_GPUS": "0"})
    assert p.wait(timeout=60) == 0
    beat = read_beats(tmp_path / "job")[0]
    assert beat.gpu_throttle == 0x40, beat
    assert beat.gpu_throttled_s is not None and 0.2 <= beat.gpu_throttled_s <= 2.5, beat


def _unbound(**env: str) -> dict:
    """This environment with no GPU bound to the task (every GPU visible, as on a workstation,
    a cloud VM or a site that does not bind GPUs), and ``env``."""
    from hpcml.cluster.allocation import GPU_BINDINGS
    return {**{k: v for k, v in os.environ.items() if k not in GPU_BINDINGS}, **env}


def test_a_recorder_that_samples_its_node_s_gpus_credits_its_rank_with_none_it_is_not_proven_to_use(tmp_path):
    """No GPU bound to the task: the recorder samples both GPUs of the node (it claimed them),
    GPU 1 held back for heat on every sample. Which GPU the rank uses is not proven (the replay
    shows no processes): its heartbeat's throttling is unknown (None), not GPU 1's (was: the
    seconds GPU 1 was held back, credited to whichever rank recorded it)."""
    from hpcml.observe.beat import read_beats
    replay = tmp_path / "nvml.jsonl"
    replay.write_text("\n".join(json.dumps({"gpus": [
        {"index": 0, "util_gpu_percent": 99, "clocks_event_reasons": 0x1},
        {"index": 1, "util_gpu_percent": 99, "clocks_event_reasons": 0x40}]}) for _ in range(2)))
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(tmp_path / "job"),
                          "--interval", "0.1", "--", sys.executable, "-c", "import time; time.sleep(1.2)"],
                         env=_unbound(HPCML_OBSERVE_NVML_REPLAY=str(replay)))
    assert p.wait(timeout=60) == 0
    t = read_job(tmp_path / "job").table.to_pydict()
    assert {g for k, n, g in zip(t["kind"], t["name"], t["gpu"]) if k == "gpu" and n == "clocks_event_reasons"} == {0, 1}
    meta = read_job(tmp_path / "job").meta["ranks"]["0"]
    assert meta["gpu_binding"] == "all visible GPUs" and "gpus_used" not in meta
    beat = read_beats(tmp_path / "job")[0]
    assert beat.gpu_throttled_s is None, beat


def test_a_gpu_that_falls_off_the_bus_leaves_the_rank_s_throttling_unknown(tmp_path):
    """The task's GPU (bound: SLURM_STEP_GPUS=0) runs unthrottled, then NVML answers GPU_IS_LOST
    for it (the replay's ``"lost": true``): a ``gpu_lost`` row each sample, and the heartbeat's
    throttling is unknown from then on (was: 0.0 s, read by the watch as "not throttled")."""
    from hpcml.observe.beat import read_beats
    replay = tmp_path / "nvml.jsonl"
    lines = [{"gpus": [{"index": 0, "util_gpu_percent": 99, "clocks_event_reasons": 0x1}]}] * 3 \
        + [{"gpus": [{"index": 0, "lost": True}]}] * 3
    replay.write_text("\n".join(json.dumps(line) for line in lines))
    p = _record(tmp_path, sys.executable, "-c", "import time; time.sleep(1.5)",
                env={"HPCML_OBSERVE_NVML_REPLAY": str(replay), "SLURM_STEP_GPUS": "0"})
    assert p.wait(timeout=60) == 0
    beat = read_beats(tmp_path / "job")[0]
    assert beat.gpu_throttled_s is None, beat
    t = read_job(tmp_path / "job").table.to_pydict()
    names = [(n, g) for k, n, g in zip(t["kind"], t["name"], t["gpu"]) if k == "gpu"]
    assert ("gpu_lost", 0) in names and ("clocks_event_reasons", 0) in names


def test_the_heartbeat_s_throttling_is_of_the_gpus_nvml_saw_the_rank_on():
    """One recorder's samples of two GPUs, GPU 1 held back for heat (0x40) on every sample:
    a rank NVML saw on GPU 0 was held back 0 s, one seen on GPU 1 4 s; a rank on a GPU its
    recorder does not sample (another task's claim) counts the reasons its tracker read; a rank
    seen on no GPU, unknown; and one whose GPU is lost, unknown from then on."""
    from hpcml.observe.recorder import _Throttle
    from hpcml.samplers.gpuuse import GpuUse, UsedGpu

    def run(used: set[int], read: dict[int, int] | None = None, lost_at: int | None = None) -> _Throttle:
        t = _Throttle()
        for k in range(5):
            ts = 1_800_000_000_000_000_000 + k * 10**9
            rows = [(ts, "gpu", "clocks_event_reasons", 0x1, None, 0), (ts, "gpu", "clocks_event_reasons", 0x40, None, 1)]
            gone = frozenset(used) if lost_at is not None and k >= lost_at else frozenset()
            t.add(ts, rows, GpuUse({i: UsedGpu(i) for i in used}, read or {}, gone))
        return t
    assert run({0}).beat() == {"gpu_throttled_s": 0.0, "gpu_throttle": None, "gpu_uuids": None}
    assert run({1}).beat() == {"gpu_throttled_s": 4.0, "gpu_throttle": 0x40, "gpu_uuids": None}
    assert run({2}, read={2: 0x20}).beat() == {"gpu_throttled_s": 4.0, "gpu_throttle": 0x20, "gpu_uuids": None}
    assert run({2}, read={2: 0x4}).beat() == {"gpu_throttled_s": 0.0, "gpu_throttle": None, "gpu_uuids": None}   # its power cap: load
    assert run(set()).beat()["gpu_throttled_s"] is None
    assert run({0}, lost_at=3).beat()["gpu_throttled_s"] is None
    one = _Throttle(one_gpu=True)                     # bound to the one GPU its recorder samples
    for k in range(3):
        one.add(k * 10**9, [(k * 10**9, "gpu", "clocks_event_reasons", 0x40, None, 3)])
    assert one.beat() == {"gpu_throttled_s": 2.0, "gpu_throttle": 0x40, "gpu_uuids": None}


def test_the_heartbeat_names_the_rank_s_gpus_by_the_uuids_nvml_gives():
    """The GPUs proven the rank's, by UUID: those NVML showed its processes on (the tracker's
    UUID), or the one GPU its recorder samples for it (the sampler's); a GPU its recorder
    samples for the node's other ranks names none of it, and one whose UUID NVML did not give
    is left out, not guessed. Once proven a GPU stays named, lost or not."""
    from hpcml.observe.recorder import _Throttle
    from hpcml.samplers.gpuuse import GpuUse, UsedGpu
    sampler = {"0": "GPU-aaaa0000-0000-4000-8000-000000000000", "1": "GPU-bbbb1111-0000-4000-8000-000000000001"}
    rows = [(1, "gpu", "clocks_event_reasons", 0x1, None, 0), (1, "gpu", "clocks_event_reasons", 0x1, None, 1)]
    seen = _Throttle(uuids=sampler)
    seen.add(1, rows, GpuUse({5: UsedGpu(5, "GPU-cccc5555-0000-4000-8000-000000000005"), 1: UsedGpu(1)}, {}, frozenset()))
    assert seen.beat()["gpu_uuids"] == [sampler["1"], "GPU-cccc5555-0000-4000-8000-000000000005"]
    seen.add(2, rows, GpuUse({}, {}, frozenset({5})))
    assert seen.beat()["gpu_uuids"] == [sampler["1"], "GPU-cccc5555-0000-4000-8000-000000000005"]
    unproven = _Throttle(uuids=sampler)
    unproven.add(1, rows, GpuUse({}, {}, frozenset()))
    assert unproven.beat()["gpu_uuids"] is None
    unnamed = _Throttle()
    unnamed.add(1, rows, GpuUse({7: UsedGpu(7)}, {}, frozenset()))
    assert unnamed.beat()["gpu_uuids"] is None
    one = _Throttle(one_gpu=True, uuids={"1": sampler["1"]})
    one.add(1, rows[1:])
    assert one.beat()["gpu_uuids"] == [sampler["1"]]
    odd = _Throttle(one_gpu=True, uuids={"1": "MIG-GPU-5a1b2c3d-0e4f-4a5b-8c6d-7e8f9a0b1c2d/1/0"})
    odd.add(1, rows[1:])                            # R450's MIG form: not NVML's GPU name; left out, never fatal
    assert odd.beat()["gpu_uuids"] is None


def test_the_heartbeat_of_a_rank_bound_by_slurm_names_its_gpu_by_uuid(tmp_path):
    """A real recorder on the recorded H100 node's replay (four GPUs), bound by Slurm to device
    2: its heartbeat names GPU 2 by the UUID NVML gives, the one its metadata records; with no
    binding it samples all four and names none (none is proven the rank's)."""
    from hpcml.cluster.allocation import GPU_BINDINGS
    from hpcml.observe.beat import read_beats
    node = {"HPCML_GPM_REPLAY": str(Path(__file__).parents[1] / "fixtures" / "gpm" / "gpm-h100.jsonl"),
            "HPCML_GPM_REPLAY_GPUS": "4"}
    p = _record(tmp_path, sys.executable, "-c", "import time; time.sleep(1.0)", env={**node, "SLURM_STEP_GPUS": "2"})
    assert p.wait(timeout=60) == 0
    meta = read_job(tmp_path / "job").meta["ranks"]["0"]
    assert read_beats(tmp_path / "job")[0].gpu_uuids == [meta["gpu_uuids"]["2"]], meta
    free = tmp_path / "free"
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(free / "job"),
                          "--interval", "0.1", "--", sys.executable, "-c", "import time; time.sleep(1.0)"],
                         env={**{k: v for k, v in os.environ.items() if k not in GPU_BINDINGS}, **node})
    assert p.wait(timeout=60) == 0
    assert len(read_job(free / "job").meta["ranks"]["0"]["gpu_uuids"]) == 4
    assert read_beats(free / "job")[0].gpu_uuids is None


def test_the_rank_s_metadata_names_the_gpus_nvml_saw_it_on(monkeypatch):
    """The recorder's tracker (``samplers.gpuuse``) on a stand-in NVML whose GPU 2 runs this
    process: the rank's metadata gets ``gpus_used`` once (rewritten when it changes), for the
    report; GPU sampling off: nothing is followed."""
    import hpcml.samplers.gpuuse as gpuuse
    from hpcml.observe.recorder import _Uses
    from tests.samplers.test_gpuuse import FakeNvml
    nv = FakeNvml({0: [1], 1: [], 2: [os.getpid()]}, {0: 0, 1: 0, 2: 0x4})
    monkeypatch.setattr(gpuuse, "open_tracker", lambda root, env=None: gpuuse.UseTracker(nv, root))
    meta: dict = {"gpu_sampler": {"kind": "none", "reason": "claimed_by_another_task"}}
    uses = _Uses(meta, os.getpid())
    rows: list[tuple] = []
    use = uses.sample(1, rows)
    assert use is not None and use.reasons == {2: 0x4} and uses.changed and not rows
    assert meta["gpus_used"] == [{"index": 2, "uuid": "GPU-2"}]
    uses.sample(2, rows)
    assert not uses.changed
    uses.close()
    off = _Uses({"gpu_sampler": {"kind": "none", "reason": "off"}}, os.getpid())
    assert off.sample(1, rows) is None and off.tracker is None


@pytest.mark.parametrize("args, words", [
    (["--interval", "0.01", "--", "true"], "--interval"),
    (["--", "/nonexistent/command"], "cannot start"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, words):
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", "--dir",
                          str(tmp_path / "j"), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1


CPYTHON_START_FAILURES = ("Could not import runpy module\n", "Fatal Python error: init_import_site:")
#: SIGINT inside the weakref callback of CPython's import lock (``_get_module_lock``): CPython
#: prints "Exception ignored" with its own frames and drops the interrupt, so no code of
#: hpcml's sees it (seen once under the full suite's load, 2026-11-29)
CPYTHON_SWALLOWED = "Exception ignored in: <function _get_module_lock.<locals>.cb"


@pytest.mark.parametrize("after", [0.05, 0.3, 1.5])
def test_ctrl_c_at_any_moment_is_never_a_traceback(tmp_path, after):
    """Issue 19: SIGINT while hpcml was still starting printed a traceback. At any moment
    (while the interpreter starts, while hpcml imports, while the command runs): one line
    at most, no traceback, status 130 (-2: the signal came before any Python ran).

    Some moments are CPython's own, before any of hpcml runs, with Python's SIGINT handler
    installed: ``site`` reading the venv's ``.pth`` files ("Fatal Python error:
    init_import_site") and ``python -m`` importing runpy ("Could not import runpy module"),
    each with its traceback (status 1). A loaded machine starts the interpreter slowly
    enough for 0.05 s to land there; such a moment is told apart by CPython's line and a
    traceback that names no file of hpcml's. One more is in importing itself: an interrupt in
    the import lock's weakref callback is printed by CPython as ignored, and dropped."""
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(tmp_path / "d"), "--",
                          "sleep", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    if err.startswith(CPYTHON_START_FAILURES):          # before hpcml: CPython's, not ours
        import hpcml
        assert str(Path(hpcml.__file__).parent) not in err and p.returncode == 1, (p.returncode, err)
        return
    if err.startswith(CPYTHON_SWALLOWED):               # CPython's import lock dropped the interrupt
        import hpcml
        frames = [line for line in err.splitlines() if line.strip().startswith("File ")]
        assert str(Path(hpcml.__file__).parent) not in err and all("<frozen importlib" in f for f in frames), err
        assert p.returncode in (0, 130, -signal.SIGINT), (p.returncode, err)
        return
    assert "Traceback" not in err and p.returncode in (130, -signal.SIGINT), (p.returncode, err)


def test_ctrl_c_once_the_command_runs_is_its_exit_in_the_store(tmp_path):
    """Once the command runs (its process is seen), it gets the SIGINT and the store says 128+2."""
    import signal
    import time

    import psutil
    marker = tmp_path / "started"
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(tmp_path / "d"), "--",
                          "sh", "-c", f"touch {marker}; exec sleep 31.7"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), p.communicate()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, (p.returncode, err)
    meta = json.loads((tmp_path / "d" / "rank-00000.json").read_text())
    assert meta["exit_code"] == 130
    assert not [c for c in psutil.process_iter(["cmdline"]) if c.info["cmdline"] == ["sleep", "31.7"]]


def test_the_jobs_declared_parallelism_is_kept_for_the_report(tmp_path):
    """HPCML_PARALLELISM in the job's environment goes to job.json (the report's advice on a
    speed split uses it); anything else is not recorded."""
    p = _record(tmp_path, sys.executable, "-c", "pass",
                env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "HPCML_PARALLELISM": "data"})
    assert p.wait(timeout=120) == 0
    assert json.loads((tmp_path / "job" / "job.json").read_text())["parallelism"] == "data"
    p = _record(tmp_path / "x", sys.executable, "-c", "pass",
                env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "HPCML_PARALLELISM": "$(rm -rf /)"})
    assert p.wait(timeout=120) == 0
    assert "parallelism" not in json.loads((tmp_path / "x" / "job" / "job.json").read_text())
