"""Time and peak memory of one command, for the benchmarks (bench_scan.py, bench_score.py),
and the bytecode every start-up benchmark states it ran with.

    from measure import measure
    r = measure(["hpcml", "score", "report", "dir"], timeout=600)   # r["seconds"], r["peak_rss_mb"]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

MB = 1 << 20
POLL_S = 0.020

# Peak memory of the child process tree is measured in a fresh wrapper process per run
# (this file run as a script), which starts the tool, times it and reports two
# figures; the table shows the larger:
# - getrusage(RUSAGE_CHILDREN).ru_maxrss after the wait: the kernel's own high-water mark,
#   so it cannot miss a short spike, but it is the largest single process of the tree, not
#   the sum, and it is a running maximum over every child a process has ever waited for.
#   Hence a fresh wrapper per run: measured in this process it would carry over the peaks
#   of earlier runs (of the 16 GB picklescan run, say) and be meaningless. Its floor is the
#   wrapper's own RSS (the child starts as a copy of it before exec), recorded as
#   "wrapper_rss_mb": about 20 MB, below any of the tools' peaks here.
# - psutil polling every 20 ms of the child and all its descendants, summed: catches a
#   scanner that works in several processes at once, which ru_maxrss would understate, but
#   may miss a spike shorter than 20 ms. The poller runs in a thread of the wrapper (not of
#   the tool), and the wrapper's main thread blocks in wait(), so the end of the command
#   is seen at once and the polling costs the timing nothing but a little CPU.
# The poller also enforces --mem-limit-mb (kills the tree, recorded as "memory limit"):
# picklescan keeps every opcode of a pickle in a list, which on the 10x object pickle
# would need many GB on a shared 24 GB machine.


def compile_sources() -> str:
    """Compile hpcml's sources to bytecode, as ``pip install`` does, and say so.

    The suite and the benchmarks use an editable install, whose sources are compiled only
    when an import may write ``__pycache__``: with ``PYTHONDONTWRITEBYTECODE`` set (CI
    machines often set it) every process compiles every hpcml module it imports, every
    time (~0.1 s of CPU for the launcher's and the report's modules). A warm run is one
    with bytecode, as an installed copy always has it."""
    src = Path(__file__).resolve().parents[1] / "src"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    return "hpcml's bytecode compiled (python -m compileall src), as pip install leaves it"


def _measure(spec: dict) -> dict:
    """Runs in the wrapper process: start, time and watch one command."""
    import resource
    import signal
    import tempfile
    import threading

    import psutil

    state = {"peak": 0, "samples": 0, "killed_for_memory": False}
    stop = threading.Event()
    limit = spec["mem_limit_mb"] * MB

    def poll(pid: int) -> None:
        try:
            root = psutil.Process(pid)
        except psutil.Error:
            return
        while not stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            state["peak"] = max(state["peak"], total)
            state["samples"] += 1
            if limit and total > limit:
                state["killed_for_memory"] = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                return
            stop.wait(POLL_S)

    wrapper_rss = psutil.Process().memory_info().rss
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(spec["argv"], cwd=spec["cwd"], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        poller = threading.Thread(target=poll, args=(proc.pid,), daemon=True)
        poller.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=spec["timeout"])
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            rc = proc.wait()
        seconds = time.perf_counter() - start
        stop.set()
        poller.join()
        maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
        out.seek(0)
        err.seek(0)
        stdout = out.read(4 * MB).decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    status = "timeout" if timed_out else "memory limit" if state["killed_for_memory"] else "ok"
    return {"seconds": seconds, "rc": rc, "status": status,
            "ru_maxrss_mb": maxrss / MB, "polled_peak_mb": state["peak"] / MB,
            "peak_rss_mb": max(maxrss, state["peak"]) / MB, "samples": state["samples"],
            "wrapper_rss_mb": wrapper_rss / MB, "stdout": stdout, "stderr": stderr[-4000:]}


def measure(argv: list[str], timeout: float, mem_limit_mb: int = 0, cwd: str | Path = ".") -> dict:
    """Time and peak RSS of one command, measured in a fresh wrapper process."""
    spec = {"argv": argv, "cwd": str(cwd), "timeout": timeout, "mem_limit_mb": mem_limit_mb}
    out = subprocess.run([sys.executable, __file__, json.dumps(spec)],
                         check=False, capture_output=True, text=True, timeout=timeout + 300)
    if out.returncode != 0:
        sys.exit(f"measuring wrapper failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


if __name__ == "__main__":
    print(json.dumps(_measure(json.loads(sys.argv[1]))))
