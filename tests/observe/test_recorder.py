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
    its GPU was held back (about half of the 1.2 s) and the reasons seen, for the watch."""
    from hpcml.observe.beat import read_beats
    replay = tmp_path / "nvml.jsonl"
    replay.write_text("\n".join(json.dumps({"gpus": [
        {"index": 0, "util_gpu_percent": 99, "sm_clock_mhz": 1980 if k % 2 else 1200,
         "clocks_event_reasons": 0x1 if k % 2 else 0x40}]}) for k in range(2)))
    p = _record(tmp_path, sys.executable, "-c", "import time; time.sleep(1.2)",
                env={"HPCML_OBSERVE_NVML_REPLAY": str(replay), "SLURM_STEP_GPUS": "0"})
    assert p.wait(timeout=60) == 0
    beat = read_beats(tmp_path / "job")[0]
    assert beat.gpu_throttle == 0x40, beat
    assert beat.gpu_throttled_s is not None and 0.2 <= beat.gpu_throttled_s <= 1.0, beat


@pytest.mark.parametrize("args, words", [
    (["--interval", "0.01", "--", "true"], "--interval"),
    (["--", "/nonexistent/command"], "cannot start"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, words):
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", "--dir",
                          str(tmp_path / "j"), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("after", [0.05, 0.3, 1.5])
def test_ctrl_c_at_any_moment_is_never_a_traceback(tmp_path, after):
    """Issue 19: SIGINT while hpcml was still starting printed a traceback. At any moment
    (while the interpreter starts, while hpcml imports, while the command runs): one line
    at most, no traceback, status 130 (-2: the signal came before any Python ran)."""
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(tmp_path / "d"), "--",
                          "sleep", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
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
