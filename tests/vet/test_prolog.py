"""Prolog mode without Slurm: fast-check selection, the budget, exit codes, the wrapper script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpcml as hpcml_pkg
from hpcml.errors import UsageError
from hpcml.vet import prolog
from hpcml.vet.cli.prolog import PROLOG_PROTOCOL, render_script
from hpcml.vet.model import Outcome
from hpcml.vet.protocol import load, loads

ROOT = Path(__file__).parents[2]
#: the hpcml this process imported: the subprocesses run the same code
SRC = Path(hpcml_pkg.__file__).parents[1]
SLEEP = "tests.vet.prolog_checks.Sleep"


def hpcml(*args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    e["PYTHONPATH"] = f"{SRC}{os.pathsep}{ROOT}"  # this checkout's hpcml; tests/vet/prolog_checks.py
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True,
                          text=True, env=e, timeout=timeout)


def proto_file(tmp_path: Path, evals: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f"name: t\nevals:\n{evals}")
    return path


# --- which checks run -------------------------------------------------------------------------

def test_fast_by_type_by_key_and_by_plugin_declaration():
    proto = loads("""
name: t
evals:
  - {name: mem, type: memory}
  - {name: mem-off, type: memory, fast: false}
  - {name: env, type: env}
  - {name: gemm, type: compute, size: 64}
  - {name: gemm-on, type: compute, size: 64, fast: true}
  - {name: clock, type: clock}
  - {name: clock-on, type: clock, fast: true}
  - {name: plugin, type: tests.vet.prolog_checks.Sleep}
  - {name: unmarked, type: tests.vet.prolog_checks.Unmarked}
  - {name: unmarked-on, type: tests.vet.prolog_checks.Unmarked, fast: true}
""")
    fast, slow = prolog.select_fast(proto)
    assert [e.name for e in fast] == ["mem", "env", "gemm-on", "plugin", "unmarked-on"]
    # clock needs the other nodes' reports: never in a single-node prolog
    assert [e.name for e in slow] == ["mem-off", "gemm", "clock", "clock-on", "unmarked"]


def test_allocation_checks_never_run_in_a_prolog():
    proto = loads("name: t\nevals:\n  - {name: ar, type: collective, fast: true}\n")
    assert prolog.select_fast(proto) == ([], proto.evals)


def test_builtin_prolog_protocol_is_all_fast():
    fast, slow = prolog.select_fast(load(PROLOG_PROTOCOL))
    assert slow == [] and {e.type for e in fast} <= prolog.FAST_TYPES


def test_fast_key_must_be_a_boolean():
    with pytest.raises(UsageError, match=r"key 'evals\[0\]\.fast'.*true or false"):
        loads("name: t\nevals:\n  - {name: m, type: memory, fast: maybe}\n")


# --- the budget -------------------------------------------------------------------------------

def test_check_running_past_the_budget_is_stopped_and_fails_the_node():
    proto = loads(f"name: t\nevals:\n  - {{name: mem, type: memory, min_available_fraction: 1%}}\n"
                  f"  - {{name: slow, type: {SLEEP}, seconds: 30}}\n")
    start = time.time()
    res = prolog.run_prolog(proto, budget=1.5, started=start)
    elapsed = time.time() - start
    assert elapsed < 1.5 + 3  # stopped, not waited for (generous bound)
    by = {r.check: r for r in res.results}
    assert by["mem"].outcome is Outcome.PASS
    assert by["slow"].outcome is Outcome.ERROR and by["slow"].details["budget_overrun"]
    assert by["slow"].message == f"{prolog.OVERRUN} (1.5 s)"
    assert res.bad == [f"slow: error: {prolog.OVERRUN} (1.5 s)"] and res.exit_code == 1


def test_overrun_ok_reports_the_overrun_but_keeps_the_node():
    proto = loads(f"name: t\nevals:\n  - {{name: slow, type: {SLEEP}, seconds: 30}}\n")
    res = prolog.run_prolog(proto, budget=1.0, started=time.time(), overrun_ok=True)
    assert res.results[0].outcome is Outcome.ERROR and res.results[0].details["budget_overrun"]
    assert res.bad == [] and res.exit_code == 0


def test_own_timeout_inside_the_budget_is_not_an_overrun():
    proto = loads(f"name: t\nevals:\n  - {{name: slow, type: {SLEEP}, seconds: 30, timeout: 0.3 s}}\n")
    res = prolog.run_prolog(proto, budget=3.0, started=time.time(), overrun_ok=True)
    # its own timeout, not the budget's (a loaded machine may add that the check waited for a CPU)
    assert res.results[0].message.startswith("timed out after 0.3 s")
    assert not res.results[0].details.get("budget_overrun"), res.results[0].details
    assert res.exit_code == 1


def test_budget_counts_from_process_start():
    proto = loads(f"name: t\nevals:\n  - {{name: s, type: {SLEEP}, seconds: 0}}\n")
    res = prolog.run_prolog(proto, budget=1.0, started=time.time() - 5)  # already spent
    assert res.results[0].message.startswith(prolog.OVERRUN) and res.exit_code == 1


# --- the command --------------------------------------------------------------------------------

def test_cli_healthy_node_exits_0_with_json_record(tmp_path):
    p = hpcml("vet", "--prolog", "--json")  # the built-in prolog protocol
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)
    assert rec["healthy"] and rec["exit_code"] == 0 and rec["budget"] == 5.0
    assert {r["check"] for r in rec["results"]} >= {"memory", "tmp-disk", "mounts"}


def test_cli_failing_check_exits_1_with_one_stderr_line_per_failure(tmp_path):
    proto = proto_file(tmp_path, "  - {name: need-x, type: env, expected: {HPCML_PROLOG_X: '1'}}\n"
                                 "  - {name: mem, type: memory, min_available: 1 PB}\n"
                                 "  - {name: gemm, type: compute, size: 64}\n")
    p = hpcml("vet", "run", "--prolog", proto, env={"SLURMD_NODENAME": "nx"})
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("hpcml vet --prolog: nx: ") for line in lines)
    assert "need-x: HPCML_PROLOG_X is not set" in lines[0] and "mem:" in lines[1]
    assert "nx bad (need-x:" in p.stdout  # what Slurm logs: it keeps a failed prolog's stdout
    assert hpcml("vet", "--prolog", proto, env={"HPCML_PROLOG_X": "1"}).returncode == 1


def test_cli_budget_overrun_ends_in_time(tmp_path):
    proto = proto_file(tmp_path, f"  - {{name: slow, type: {SLEEP}, seconds: 60}}\n")
    start = time.monotonic()
    p = hpcml("vet", "--prolog", "--budget", "2 s", proto, "--json")
    assert time.monotonic() - start < 2 + 3  # generous bound
    assert p.returncode == 1 and "did not finish within the prolog budget" in p.stderr
    assert json.loads(p.stdout)["duration"] < 2 + 1
    assert hpcml("vet", "--prolog", "--budget", "2 s", "--overrun-ok", proto).returncode == 0


@pytest.mark.parametrize("args, needle", [
    (["--budget", "soon"], "--budget"),
    (["--budget", "0"], "--budget"),
    (["/nonexistent/p.yaml"], "file not found"),
])
def test_cli_bad_input_exits_2(args, needle):
    p = hpcml("vet", "--prolog", *args)
    assert p.returncode == 2 and needle in p.stderr


def test_drain_reason_is_one_short_line():
    reason = prolog.drain_reason(['env: X="a"\nb', "x" * 300])
    assert reason.startswith("hpcml: env: X='a' b; xxx") and len(reason) == 200
    assert "\n" not in reason and '"' not in reason


# --- the wrapper script -------------------------------------------------------------------------

def test_prolog_script_runs_without_path(tmp_path):
    """Slurm gives the prolog no PATH: the script must still find python and timeout."""
    log = tmp_path / "prolog.log"
    script = tmp_path / "prolog.sh"
    script.write_text(render_script(budget="4 s", log=log, drain=False))
    text = script.read_text()
    assert text.startswith("#!/bin/sh\n") and f"{sys.executable} -m hpcml vet --prolog" in text
    command = text.splitlines()[-1]
    assert "--budget '4 s'" in command and "--drain" not in command and "timeout -k 1 6 " in command
    env = {"PYTHONPATH": f"{SRC}{os.pathsep}{ROOT}"} if "PYTHONPATH" in os.environ else {}
    p = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, log.read_text() if log.exists() else p.stderr
    assert json.loads(log.read_text().splitlines()[-1])["healthy"] is True


def test_prolog_script_command():
    from typer.testing import CliRunner

    from hpcml.vet.cli import app
    out = CliRunner().invoke(app, ["prolog-script", str(PROLOG_PROTOCOL), "--budget", "3 s"])
    assert out.exit_code == 0, out.output
    assert "--drain" in out.stdout and str(PROLOG_PROTOCOL) in out.stdout and "exec " in out.stdout
    assert CliRunner().invoke(app, ["prolog-script", "--budget", "later"]).exit_code == 2


# --- its report, its drain (issue 69) ----------------------------------------------------------

def test_a_drain_that_fails_is_exit_3_with_a_line_an_operator_sees(tmp_path):
    """scontrol cannot reach the controller (no slurm.conf here): the node is bad and was not
    drained; that is said on stderr and stdout (slurmd logs a failed prolog's stdout), exit 3,
    and the report carries it for the collector."""
    proto = proto_file(tmp_path, "  - {name: need-x, type: env, expected: {HPCML_PROLOG_X: '1'}}\n")
    p = hpcml("vet", "--prolog", "--drain", proto, env={"SLURMD_NODENAME": "nx", "SLURM_CONF": str(tmp_path / "none")})
    assert p.returncode == 3, (p.stdout, p.stderr)
    line = "hpcml vet --prolog: error: nx is bad and was not drained: cannot set the drain reason"
    assert line in p.stderr and line in p.stdout
    res = prolog.PrologResult(node="nx", results=[], bad=["x"], duration=0.1, budget=5, drain_failed="why")
    (drain,) = [r for r in res.node_report("t", 0.0)["results"] if r["type"] == "drain"]
    assert drain["outcome"] == "error" and "drain failed: why" in drain["message"] and res.exit_code == 3
    ok = prolog.PrologResult(node="nx", results=[], bad=["x"], duration=0.1, budget=5, drained="hpcml: x")
    (drain,) = ok.node_report("t", 0.0)["results"]
    assert (drain["name"], drain["outcome"], drain["message"], ok.exit_code) == ("hpcml-drain", "fail", "hpcml: x", 1)


def test_a_collector_that_never_answers_does_not_take_the_prolog_past_its_budget(tmp_path):
    """The collector accepts the connection and never answers; the checks would run a minute:
    the prolog still ends within its budget (the send's time is kept out of the checks'),
    the node is bad, and its report waits in the spool for the next run."""
    import socket
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)                          # never accepted, never answered
    try:
        proto = proto_file(tmp_path, f"  - {{name: slow, type: {SLEEP}, seconds: 60}}\n")
        start = time.monotonic()
        p = hpcml("vet", "--prolog", "--budget", "3 s", proto, "--report-to", f"http://127.0.0.1:{mute.getsockname()[1]}",
                  "--report-spool", tmp_path / "spool", env={"HPCML_VET_TOKEN": "t" * 32})
        elapsed = time.monotonic() - start
    finally:
        mute.close()
    assert p.returncode == 1 and "report not sent" in p.stderr, p.stderr
    assert elapsed < 3 + 1.5, elapsed       # before: the budget, then up to 2 s more for the send
    assert len(list((tmp_path / "spool").iterdir())) >= 1


@pytest.mark.parametrize("state, reason, updated", [
    ("IDLE", "", True),
    ("IDLE+DRAIN", "admin: new DIMMs", False),                    # a person's drain stays theirs
    ("IDLE+DRAIN", "hpcml: rule hurts-jobs: 3 jobs", False),      # hpcml's first drain stands
    ("DOWN+DRAIN", "hpcml: scratch: not a mount point", False),
])
def test_the_drain_leaves_a_drained_node_as_it_is(monkeypatch, state, reason, updated):
    """scontrol is replaced (no controller here, said): what matters is whether the node's
    drain is written again, which would turn a rule's drain into one the handler resumes."""
    from hpcml.cluster import slurm
    calls = []

    def run(argv, timeout=None):
        calls.append(argv)
        out = f"NodeName=n1 State={state} Reason={reason}" if argv[1] == "show" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")
    monkeypatch.setattr(slurm, "run", run)
    monkeypatch.setattr(prolog.shutil, "which", lambda *a, **k: "/usr/bin/scontrol")
    got = prolog.drain_node("n1", ["scratch: not a mount point"])
    assert (got[0] is not None) == updated and got[1] is None
    assert any(a[1] == "update" for a in calls) == updated


def test_a_report_the_collector_did_not_take_waits_and_goes_with_the_next_run(tmp_path):
    """The collector is down for the first run: its report waits in the spool (root's own
    directory); the second run, with the collector up, sends it and its own: two reports
    stored, the spool empty."""
    from tests.run.test_summary import TOKEN, Collector
    spool = tmp_path / "spool"
    c = Collector(tmp_path)
    proto = proto_file(tmp_path, "  - {name: need-x, type: env, expected: {HPCML_PROLOG_X: '1'}}\n")
    # a budget that a loaded machine's start-up cannot use up (the default 4 s could: the
    # check then "did not finish" and the verdict was not the one this test is about)
    args = ("vet", "--prolog", proto, "--budget", "30s", "--report-to", c.url, "--report-spool", spool)
    env = {"SLURMD_NODENAME": "nx", "HPCML_VET_TOKEN": TOKEN}
    first = hpcml(*args, env=env)
    assert first.returncode == 1 and "kept in" in first.stderr, first.stderr
    assert len(list(spool.glob("*.json"))) == 1 and (spool.stat().st_mode & 0o777) == 0o700
    again = hpcml(*args, env=env)                 # still down: each report tells what waited before it
    assert again.returncode == 1
    told = sorted(json.loads(p.read_text())["spool_waiting"] for p in spool.glob("*.json"))
    assert told == [0, 1]
    c.start()
    try:
        second = hpcml(*args, env={**env, "HPCML_PROLOG_X": "1"})
    finally:
        c.stop()
    assert second.returncode == 0 and "2 earlier reports sent, 0 still waiting" in second.stderr, second.stderr
    assert list(spool.glob("*.json")) == []
    import sqlite3
    with sqlite3.connect(c.db) as conn:
        rows = conn.execute("SELECT node, verdict FROM reports ORDER BY time").fetchall()
    assert rows == [("nx", "bad"), ("nx", "bad"), ("nx", "good")]


def test_a_spool_someone_else_can_write_is_not_used(tmp_path):
    from hpcml.centre.spool import Spool
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    assert Spool(open_dir).put({"node": "n1"}) is None and Spool(open_dir).pending() == []
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert Spool(link).put({"node": "n1"}) is None


def test_the_spool_sends_oldest_first_drops_what_is_refused_for_good_and_stops_on_a_failure(tmp_path, monkeypatch):
    from hpcml.centre import spool as spool_mod
    from hpcml.centre.client import Refusal
    monkeypatch.setattr(spool_mod, "MAX_FILES", 3)
    s = spool_mod.Spool(tmp_path / "s")
    for i in range(5):
        s.put({"n": i})
    assert [spool_mod.orjson.loads(p.read_bytes())["n"] for p in s.pending()] == [2, 3, 4]     # the oldest went
    answers = {2: None, 3: Refusal("bad field", 400), 4: Refusal("down")}
    seen = []

    def send(doc, _timeout):
        seen.append(doc["n"])
        return answers[doc["n"]]
    assert s.flush(send, time.monotonic() + 5) == (1, 1)
    assert seen == [2, 3, 4] and [spool_mod.orjson.loads(p.read_bytes())["n"] for p in s.pending()] == [4]
    # only its own files: another program's JSON beside them is neither sent nor deleted;
    # one of its own that is no report is dropped, not sent
    (tmp_path / "s" / "config.json").write_text('{"n": 9}')
    (tmp_path / "s" / f"{1:020d}-1.json").write_text("[1, 2]")
    seen.clear()
    answers[4] = None
    assert s.flush(send, time.monotonic() + 5) == (1, 0)
    assert seen == [4] and (tmp_path / "s" / "config.json").exists() and s.pending() == []


def test_prolog_script_sends_its_reports_and_says_what_slurm_conf_needs(tmp_path):
    from typer.testing import CliRunner

    from hpcml.vet.cli import app
    token = tmp_path / "token"
    token.write_text("t\n")
    out = CliRunner().invoke(app, ["prolog-script", "--report-to", "http://centre:8787", "--report-token-file",
                                   str(token), "--report-spool", str(tmp_path / "sp")])
    assert out.exit_code == 0, out.output
    command = out.stdout.splitlines()[-1]
    assert "--report-to http://centre:8787" in command and f"--report-token-file {token}" in command
    assert "--report-spool" in command and "timeout -k 1 7 " in command            # 5 s + 2 s: the send is inside the budget
    for line in ("HealthCheckNodeState=ANY", "SchedulerParameters=nohold_on_prolog_fail", "scontrol release"):
        assert line in out.stdout
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    told = CliRunner().invoke(app, ["prolog-script"], env={"SLURM_CONF": str(conf)})
    assert told.exit_code == 0 and f"export SLURM_CONF={conf}" in told.stdout      # the health check's scontrol
    script = tmp_path / "p.sh"
    script.write_text(told.stdout)
    shown = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    missing = CliRunner().invoke(app, ["prolog-script", "--slurm-conf", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "file not found" in missing.output
    bad = CliRunner().invoke(app, ["prolog-script", "--report-to", "centre:8787"])
    assert bad.exit_code == 2 and "--report-to" in bad.output
    assert CliRunner().invoke(app, ["prolog-script", "--report-spool", "/x"]).exit_code == 2



def test_nothing_checked_is_not_healthy(tmp_path, monkeypatch):
    """No fast check in the protocol, or every one skipped (a GPU check on a node without a
    driver): exit 0 (nothing to drain for), but "not vetted", never "healthy"."""
    slow = proto_file(tmp_path, "  - {name: gemm, type: compute, size: 64}\n")
    p = hpcml("vet", "--prolog", slow)
    assert p.returncode == 0, p.stderr
    assert " not vetted (no check measured anything): 0 fast checks in " in p.stdout and "healthy" not in p.stdout
    rec = json.loads(hpcml("vet", "--prolog", slow, "--json").stdout)
    assert rec["healthy"] is None and rec["exit_code"] == 0 and rec["results"] == []
    monkeypatch.setenv("HPCML_VET_NVML_REPLAY", str(ROOT / "tests" / "fixtures" / "nvml" / "no_driver.json"))
    res = prolog.run_prolog(loads("name: t\nevals:\n  - {name: gpu, type: gpu}\n"), budget=5.0, started=time.time())
    assert [r.outcome for r in res.results] == [Outcome.SKIPPED] and res.exit_code == 0
    assert res.to_json()["healthy"] is None
    assert res.notes == ["all 1 fast checks were skipped: nothing vetted (e.g. no GPU (NVIDIA driver not loaded))"]


def test_a_node_nothing_was_checked_on_is_sent_to_the_collector_as_unchecked_never_good(tmp_path, monkeypatch):
    """``healthy`` null: the collector's node report says ``unchecked`` (and the collector
    takes it); a node checked and healthy is ``good``."""
    from hpcml.centre.collector.schema import parse
    monkeypatch.setenv("HPCML_VET_NVML_REPLAY", str(ROOT / "tests" / "fixtures" / "nvml" / "no_driver.json"))
    skipped = prolog.run_prolog(loads("name: t\nevals:\n  - {name: gpu, type: gpu}\n"), budget=5.0, started=time.time())
    none_run = prolog.run_prolog(loads("name: t\nevals:\n  - {name: gemm, type: compute, size: 64}\n"), budget=5.0,
                                 started=time.time())
    checked = prolog.run_prolog(loads("name: t\nevals:\n  - {name: mem, type: memory, min_available_fraction: 1%}\n"),
                                budget=5.0, started=time.time())
    assert (skipped.healthy, none_run.healthy, checked.healthy) == (None, None, True)
    sent = [r.node_report("t", 1.0) for r in (skipped, none_run, checked)]
    assert [d["verdict"] for d in sent] == ["unchecked", "unchecked", "good"]
    assert [r.verdict for r in parse(json.dumps(sent).encode())] == ["unchecked", "unchecked", "good"]


def test_a_node_whose_only_check_broke_uncounted_measured_nothing(tmp_path, monkeypatch):
    """A check that could not run (an error) with its errors not counted (``count_errors:
    false``) measured nothing of the node: the prolog said healthy and sent ``good``, and
    the collector counted it a pass. It is ``unchecked`` now, and a ``good`` an older
    prolog sends with only an error in it is stored as ``unchecked``."""
    from hpcml.centre.collector.schema import parse
    (tmp_path / "brokencheck.py").write_text(
        "from hpcml.vet.checks.base import Check, CheckReport, MissingDependency\n\n\n"
        "class Broken(Check):\n    fast = True\n    inline = True\n\n"
        "    def run(self) -> CheckReport:\n        raise MissingDependency('nvml library missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    res = prolog.run_prolog(loads("name: p\nevals:\n  - {name: nvml, type: brokencheck.Broken, count_errors: false}\n"),
                            budget=5.0, started=time.time())
    assert [r.outcome for r in res.results] == [Outcome.ERROR] and not res.bad
    assert res.healthy is None and res.node_report("p", 1.0)["verdict"] == "unchecked"
    old = {**res.node_report("p", 1.0), "verdict": "good"}
    assert [r.verdict for r in parse(json.dumps([old]).encode())] == ["unchecked"]
