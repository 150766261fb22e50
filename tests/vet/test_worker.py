import time

import pytest

from hpcml.vet.model import Outcome
from hpcml.vet.protocol import loads
from hpcml.vet.worker import run_check, run_node

CTX = {"node": "n1", "nodes": ("n1",), "rank": 0, "workdir": None, "gpus": (), "require_gpus": False}


def _ev(yaml_evals: str):
    return [e.to_dict() for e in loads("name: t\nevals:\n" + yaml_evals).evals]


def test_fail_downgraded_to_warn_by_severity():
    ev = _ev("  - {name: m, type: memory, min_available: 1 PB, severity: warn}\n")[0]
    r = run_check(ev, CTX, time.time() + 30)
    assert r.outcome is Outcome.WARN and "available" in r.message


def test_hang_is_error_by_its_timeout():
    ev = _ev("  - {name: h, type: tests.plugins.testchecks.Hang, timeout: 0.5}\n")[0]
    start = time.time()
    r = run_check(ev, CTX, time.time() + 30)
    assert r.outcome is Outcome.ERROR and "timed out after 0.5 s" in r.message
    assert time.time() - start < 3


@pytest.mark.machine                     # "not starved of a CPU": the CPUs to itself (scripts/test)
def test_hang_timeout_says_it_ran_not_waited():
    ev = _ev("  - {name: h, type: tests.plugins.testchecks.Hang, timeout: 0.5}\n")[0]
    r = run_check(ev, CTX, time.time() + 30)
    assert r.message == "timed out after 0.5 s", r.message
    assert r.details["starved"] is False and r.details["cpu_wait_s"] < 0.25


@pytest.mark.machine                     # measures contention: the CPUs to itself (scripts/test)
def test_check_starved_of_cpu_is_told_apart_from_a_hang():
    """Three busy processes pinned to CPU 0 beside a check pinned there: the check gets a
    quarter of a CPU, so its timeout runs out mostly in the run queue. Still an error (fail
    closed), but the message and details say it waited for a CPU."""
    import subprocess
    import sys
    spin = "import os; os.sched_setaffinity(0, {0}); print('pinned', flush=True)\nwhile True: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        assert [p.stdout.readline() for p in busy] == ["pinned\n"] * 3       # all three on CPU 0 now
        ev = _ev("  - {name: s, type: tests.plugins.testchecks.Spin, timeout: 1.5}\n")[0]
        r = run_check(ev, CTX, time.time() + 30)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert r.outcome is Outcome.ERROR
    assert "waiting for a CPU" in r.message and "oversubscribed" in r.message, r.message
    assert r.details["starved"] is True and r.details["cpu_wait_s"] > r.details["cpu_s"]


def test_crash_is_error():
    ev = _ev("  - {name: c, type: tests.plugins.testchecks.Crash}\n")[0]
    r = run_check(ev, CTX, time.time() + 30)
    assert r.outcome is Outcome.ERROR and "SIGSEGV" in r.message


def test_deadline_cuts_checks_short_and_skips_the_rest():
    evs = _ev("  - {name: h, type: tests.plugins.testchecks.Hang, timeout: 60}\n"
              "  - {name: m, type: compute, size: 64}\n")  # exclusive: runs after h
    start = time.time()
    rep = run_node({"evals": evs, "deadline_at": start + 1.5}, CTX)
    assert time.time() - start < 3
    h, m = rep.results
    assert h.outcome is Outcome.ERROR and "deadline" in h.message
    assert m.outcome is Outcome.ERROR and "not run" in m.message


def test_missing_dependency_is_error_that_says_so(monkeypatch):
    ev = _ev("  - {name: c, type: compute, device: gpu}\n")[0]
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch -> ImportError
    r = run_check(ev, CTX, time.time() + 30)
    assert r.outcome is Outcome.ERROR and "missing dependency" in r.message


def test_light_checks_run_side_by_side_and_keep_protocol_order():
    evs = _ev("  - {name: g, type: compute, size: 64}\n"
              "  - {name: h1, type: tests.plugins.testchecks.Hang, seconds: 1, timeout: 5}\n"
              "  - {name: h2, type: tests.plugins.testchecks.Hang, seconds: 1, timeout: 5}\n")
    rep = run_node({"evals": evs, "deadline_at": time.time() + 30}, CTX)
    assert [r.check for r in rep.results] == ["g", "h1", "h2"]
    assert all(r.outcome is Outcome.PASS for r in rep.results)
    h1, h2 = rep.results[1].details, rep.results[2].details
    assert h2["began"] < h1["ended"] and h1["began"] < h2["ended"]  # they overlapped
    assert rep.results[1].duration >= 1.0


def test_host_checks_worker_loads_no_pydantic_psutil_or_clustershell(tmp_path):
    """What every node pays: the worker for the CPU protocol's host checks, started the way
    the launcher starts it, imports neither pydantic, psutil nor ClusterShell (~0.3 s of CPU
    together on this machine), and its checks still pass with the launcher's values."""
    import json
    import subprocess
    import sys

    from hpcml.vet.engine import _spec
    from hpcml.vet.launch import _worker_command
    proto = loads("name: t\nevals:\n"
                  "  - {name: m, type: memory, min_available_fraction: 1%}\n"
                  "  - {name: l, type: load, max_load_per_cpu: 1000}\n"
                  f"  - {{name: d, type: disk, path: {tmp_path}, min_free: 1 MB, write_size: 1 MiB}}\n"
                  "  - {name: mo, type: mounts, paths: [/proc]}\n"
                  "  - {name: e, type: env, absent: [HPCML_SURELY_UNSET]}\n"
                  "  - {name: c, type: clock, max_skew: 1 s}\n")
    spec = _spec(proto, proto.evals, ["n1"], time.time() + 60, None)
    probe = ("import sys, atexit; atexit.register(lambda: print('MODULES', ' '.join(sorted("
             "m for m in sys.modules if m.split('.')[0] in ('pydantic', 'psutil', 'ClusterShell'))), "
             "file=sys.stderr)); ")
    cmd = _worker_command(sys.executable)
    cmd[-1] = probe + cmd[-1]
    out = subprocess.run(cmd, input=json.dumps(spec) + "\n", capture_output=True, text=True,
                         env={**__import__("os").environ, "SLURMD_NODENAME": "n1"}, timeout=60)
    assert out.returncode == 0, out.stderr
    from hpcml.vet.wire import Reassembler
    reassembler = Reassembler()
    reports = [r for line in out.stdout.splitlines() if (r := reassembler.feed(line))]
    assert [node for node, _ in reports] == ["n1"]
    outcomes = {r["check"]: r["outcome"] for r in reports[0][1]["results"]}
    assert outcomes == dict.fromkeys(["m", "l", "d", "mo", "e", "c"], "pass"), reports
    modules = [ln for ln in out.stderr.splitlines() if ln.startswith("MODULES")]
    assert modules == ["MODULES "], out.stderr


def test_inline_check_that_raises_is_its_error_not_the_workers(monkeypatch):
    """memory runs in the worker itself (no fork): what it raises still ends as its error."""
    from hpcml.vet.checks import memory

    def broken():
        raise RuntimeError("meminfo unreadable")
    monkeypatch.setattr(memory, "available_total", broken)
    ev = _ev("  - {name: m, type: memory}\n")[0]
    r = run_check(ev, CTX, time.time() + 30)
    assert r.outcome is Outcome.ERROR and r.message == "check raised RuntimeError: meminfo unreadable"


def test_subclass_of_an_inline_check_with_its_own_run_forks_and_times_out(capfd):
    """A site's subclass of memory whose run hangs: forked with its timeout, like any check,
    and its print never reaches the worker's stdout (the report stream)."""
    ev = _ev("  - {name: s, type: tests.plugins.testchecks.SlowMemory, timeout: 0.5}\n")[0]
    start = time.time()
    r = run_check(ev, CTX, time.time() + 30)
    # (on a loaded machine the message may add that it waited for a CPU: test_hang_timeout_says_it_ran_not_waited)
    assert r.outcome is Outcome.ERROR and r.message.startswith("timed out after 0.5 s"), r.message
    assert time.time() - start < 10
    assert "chatter" not in capfd.readouterr().out


def test_inline_check_that_prints_keeps_stdout_clean(capfd):
    ev = _ev("  - {name: c, type: tests.plugins.testchecks.ChattyMemory}\n")[0]
    r = run_check(ev, CTX, time.time() + 30)
    out, err = capfd.readouterr()
    assert r.outcome is Outcome.PASS, r.message
    assert "chatter" not in out and "chatter" in err
