"""One attempt's signals (hpcml.run.attempt): a TERM that reaches the launcher while its
ranks are being started is held and passed on to every rank once they run, exactly once,
and run.json says it came; it is not Python's default death of the launcher, which left
the ranks to die unrecorded (a CI run hit it: the watch's imports, niced, widened the gap).

The signal's moment is the only stand-in: a real TERM, raised by the launcher's own process
right after the local backend started its ranks (from outside, that moment cannot be hit on
demand); the ranks, their wrappers and the forwarding are the real ones, in a process of
their own (the local backend makes its process a subreaper: not pytest's)."""

from __future__ import annotations

import json
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.run.test_ownership import PY, WAIT, _env, lines, nothing_left

#: a rank that counts the TERMs it gets: it notes that it started, and one second after its
#: first TERM, how many came (a TERM sent twice would show), then ends (no kill needed)
RANK = textwrap.dedent("""
    import os, signal, sys, time
    marks, got = sys.argv[1], []
    signal.signal(signal.SIGTERM, lambda *a: got.append(time.monotonic()))
    def note(word):
        with open(marks, "a") as f:
            f.write(word + "-" + os.environ["RANK"] + "\\n")
    note("start")
    while not got or time.monotonic() - got[0] < 1.0:
        time.sleep(0.05)
    note("term" * len(got))
""")

LAUNCHER = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    from hpcml.jobmodel import RunRecord
    from hpcml.run.attempt import run_attempt
    from hpcml.run.backends import Local, Settings
    from hpcml.run.config import Config, Options

    class TermWhileStarting(Local):
        def start(self, plan):
            super().start(plan)
            end = time.monotonic() + 60
            while WAIT_FOR and time.monotonic() < end and (not MARKS.exists() or MARKS.read_text().count("start") < 2):
                time.sleep(0.05)                     # both ranks run their command
            signal.raise_signal(signal.SIGTERM)      # its handler has run when this returns

    d, cmd, MARKS, WAIT_FOR = Path(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1"
    d.mkdir()
    cfg = Config.of(Options(cmd=cmd, ntasks=2, kill_grace=60), nodes=1, local=True)
    rec = RunRecord(command=cmd, mode="local", started=0.0, attempt=1)
    backend = TermWhileStarting(Settings(ntasks=2, ntasks_per_node=None, gpus_per_task=None, env={}), ["localhost"], None)
    rc = run_attempt(cfg, d, rec, backend, [])
    print(json.dumps({"rc": rc, "signals": rec.signals_forwarded, "signalled_at": rec.signalled_at}))
""")


@pytest.mark.parametrize("ranks_run", [True, False], ids=["ranks-running", "wrappers-starting"])
def test_a_term_while_the_ranks_start_reaches_each_rank_once_and_is_recorded(tmp_path: Path, ranks_run: bool) -> None:
    """TERM inside the backend's start: once both ranks run their command (each gets it
    once, after the start, and ends by itself), and at once (the wrappers, still starting,
    die of it: nothing is left, and the launcher records it)."""
    marker, marks = f"hpcml-test-{uuid.uuid4().hex}", tmp_path / "marks"
    cmd = [PY, "-c", RANK, str(marks), marker]
    p = subprocess.run([PY, "-c", LAUNCHER, str(tmp_path / "job"), json.dumps(cmd), str(marks), str(int(ranks_run))],
                       cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=WAIT * 2)
    nothing_left(marker, marks)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["signals"] == ["SIGTERM"] and got["signalled_at"] is not None, got
    if ranks_run:
        assert lines(marks, "start-0") == lines(marks, "start-1") == 1, marks.read_text()
        assert lines(marks, "term-0") == lines(marks, "term-1") == 1, marks.read_text()      # once each, not twice
    assert got["rc"] == (0 if ranks_run else -15), got       # the wrappers die of TERM before they own a rank


#: the main thread imports a module a prefetch thread is still importing (slowly), and a signal
#: comes while it waits whose handler imports a module of its own (as a forwarding handler's
#: first use of psutil or of hpcml.cluster.slurm does)
IMPORT_RACE = textwrap.dedent("""
    import os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from hpcml.run.attempt import prefetch, settled
    got = []
    def handler(sig, frame):
        import in_handler                               # noqa: F401 - its own import lock, this thread
        got.append(sig)
    signal.signal(signal.SIGUSR1, handler)
    prefetch("slow_module")
    while not os.path.exists(os.path.join(sys.argv[1], "importing")):   # the prefetch holds its lock now
        time.sleep(0.01)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    if sys.argv[2] == "settled":
        settled("slow_module")
    import slow_module                                  # noqa: F401
    print("imported", got, flush=True)
""")


@pytest.mark.machine                     # the signal must come while the import waits: the CPUs to itself
@pytest.mark.parametrize("way", ["settled", "direct"])
def test_a_signal_while_the_launcher_waits_for_a_prefetched_import(tmp_path, way):
    """Through ``settled`` (a thread's join) the handler runs and the import completes; the
    direct import shows why it is needed: CPython 3.11's module lock breaks (``KeyError``)
    when a handler imports while the thread waits on another thread's import."""
    import sys
    if way == "direct" and sys.version_info[:2] != (3, 11):
        pytest.skip("the module lock's bug shown is CPython 3.11's (the suite's interpreter)")
    (tmp_path / "slow_module.py").write_text(f"import time\nopen({str(tmp_path / 'importing')!r}, 'w').close()\n"
                                             "time.sleep(3.0)\n")
    (tmp_path / "in_handler.py").write_text("")
    p = subprocess.run([sys.executable, "-c", IMPORT_RACE, str(tmp_path), way], capture_output=True, text=True,
                       timeout=60, env=_env())
    if way == "settled":
        assert p.returncode == 0 and "imported [10]" in p.stdout, p.stderr
    else:
        assert p.returncode == 1 and "KeyError" in p.stderr, (p.stdout, p.stderr)
