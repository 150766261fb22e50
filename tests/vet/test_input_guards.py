"""Bad input ends ``hpcml vet`` with one line and exit 2 before any check runs, and what
goes wrong after the run never loses its verdict: protocol keys and values the loader must
refuse, output paths that cannot be written, names Rich must not read as markup, one torn
line of a kernel log."""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from hpcml.errors import UsageError
from hpcml.vet import verdict
from hpcml.vet.checks import xid
from hpcml.vet.checks.base import CheckContext
from hpcml.vet.engine import VetRun
from hpcml.vet.model import CheckResult, NodeReport, Outcome
from hpcml.vet.protocol import loads
from hpcml.vet.report import table
from tests.vet.test_prolog import hpcml

SLEEP = "tests.vet.prolog_checks.Sleep"


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


# --- the loader ---------------------------------------------------------------------------------

VN = "vetnode.evaluations."


@pytest.mark.parametrize("evals, key", [
    ("  - name: m\n    type: memory\n    1: 2\n", "evals[0][1]"),               # was TypeError: keywords must be strings
    (f"  - name: g\n    type: {VN}gpu_eval.GPUEval\n    max_temp: '90 C'\n", "evals[0].max_temp"),
    (f"  - name: n\n    type: {VN}nccl_lib_eval.NcclLibEval\n    method: [a]\n", "evals[0].method"),
    (f"  - name: n\n    type: {VN}nccl_lib_eval.NcclLibEval\n    topology: [x]\n", "evals[0].topology"),
    ("  - {name: m, type: memory, timeout: .nan}\n", "evals[0].timeout"),
    ("  - {name: m, type: memory, timeout: .inf}\n", "evals[0].timeout"),
    ("  - {name: m, type: memory, timeout: 0}\n", "evals[0].timeout"),
    ("  - {name: ../../../escaped, type: memory}\n", "evals[0].name"),
    ("  - {name: a/b, type: memory}\n", "evals[0].name"),
    ("  - {name: .hidden, type: memory}\n", "evals[0].name"),
    ("  - {name: '..', type: memory}\n", "evals[0].name"),
])
def test_the_loader_refuses_with_one_line_naming_the_key(evals, key):
    with pytest.raises(UsageError) as info:
        loads(f"name: x\nevals:\n{evals}", "p.yaml")
    assert info.value.key == key and info.value.file == "p.yaml"


@pytest.mark.parametrize("deadline", [".inf", ".nan", "0", "-1"])
def test_a_deadline_must_be_finite_and_above_zero(deadline):
    with pytest.raises(UsageError) as info:
        loads(f"name: x\ndeadline: {deadline}\nevals:\n  - {{name: m, type: memory}}\n", "p.yaml")
    assert info.value.key == "deadline"


def test_names_vetnode_files_use_still_load():
    p = loads("name: x\nevals:\n  - {name: Check GPU 2, type: memory}\n  - {name: a.b_c-d, type: load}\n")
    assert [e.name for e in p.evals] == ["Check GPU 2", "a.b_c-d"]


def test_validate_says_a_bad_vetnode_field_in_one_line(tmp_path):
    proto = tmp_path / "p.yaml"
    proto.write_text(f"name: x\nevals:\n  - name: n\n    type: {VN}nccl_lib_eval.NcclLibEval\n    method: [a]\n")
    p = hpcml("vet", "validate", proto)
    assert p.returncode == 2 and "key 'evals[0].method'" in one_line(p)


def test_deadline_flag_must_be_above_zero(tmp_path):
    p = hpcml("vet", "--local", "--deadline", "0", "--out", tmp_path / "o")
    assert p.returncode == 2 and "flag '--deadline'" in one_line(p)


# --- the outputs --------------------------------------------------------------------------------

def _sleeper(tmp_path: Path, seconds: float) -> Path:
    proto = tmp_path / "p.yaml"
    proto.write_text(f"name: t\nevals:\n  - {{name: slow, type: {SLEEP}, seconds: {seconds}}}\n")
    return proto


@pytest.mark.parametrize("args, flag", [
    (["--out", "{tmp}/o"], "--out"),                               # o/report.json is a directory
    (["--out", "{tmp}/file"], "--out"),                            # a file where the folder goes
    (["--out", "{tmp}/o2", "--exclude-file", "/proc/nope/bad"], "--exclude-file"),
    (["--out", "{tmp}/o2", "--good-file", "{tmp}/o"], "--good-file"),
])
def test_outputs_that_cannot_be_written_are_refused_before_the_checks_run(tmp_path, args, flag):
    (tmp_path / "o" / "report.json").mkdir(parents=True)
    (tmp_path / "file").write_text("")
    start = time.monotonic()
    p = hpcml("vet", "--local", _sleeper(tmp_path, 20), *[a.format(tmp=tmp_path) for a in args])
    assert p.returncode == 2 and f"flag '{flag}'" in one_line(p)
    assert time.monotonic() - start < 15, "the check ran first"


def test_an_output_that_fails_after_the_run_keeps_the_verdict(tmp_path, monkeypatch, capsys):
    from hpcml.vet import fastvet, report
    from hpcml.vet.fastvet import VetRun as Args

    def full(*args, **kwargs):
        raise OSError(28, f"cannot write {tmp_path}/o/report.json: No space left on device")
    monkeypatch.setattr(report, "write_outputs", full)
    for name in [k for k in os.environ if k.startswith("SLURM")]:
        monkeypatch.delenv(name)
    code = fastvet.execute(Args(protocol=_sleeper(tmp_path, 0), out=tmp_path / "o", local=True))
    assert code == 0                                  # the verdict's: continue
    err = capsys.readouterr().err
    assert "hpcml vet: error: cannot write" in err and "No space left on device; the verdict (continue) stands" in err
    assert "Traceback" not in err


# --- Rich markup ---------------------------------------------------------------------------------

def _run(protocol_name: str, node: str, value: str) -> VetRun:
    proto = loads(f"name: '{protocol_name}'\nevals:\n  - {{name: m, type: memory}}\n")
    reports = {node: NodeReport(node=node, results=[CheckResult(node=node, check="m", type="memory",
                                                                outcome=Outcome.PASS, value=value)])}
    return VetRun(protocol=proto, nodes=[node], reports=reports, started_at=0, duration=0.1,
                  verdict=verdict.decide([node], reports, {"m": True}), notes=[f"culprit search on {node}: [/x]"])


def test_names_in_the_table_are_printed_as_written_never_as_markup():
    run = _run("[/]", "[/bold]n1", "[link=x]v")
    console = Console(width=200, record=True)
    console.print(table(run))                         # was: MarkupError on the title
    text = console.export_text()
    assert "hpcml vet: [/]" in text and "[/bold]n1" in text and "[link=x]v" in text


def test_notes_are_printed_as_written_never_as_markup(capsys):
    from hpcml.vet.fastvet import _print_human
    run = _run("p", "n1", "1")
    _print_human(run, {"exclude": Path("[/b]bad-nodes"), "report": Path("r")})
    out = capsys.readouterr().out
    assert "note: culprit search on n1: [/x]" in out and "exclude list: [/b]bad-nodes" in out


# --- the Xid check ------------------------------------------------------------------------------

def test_a_line_with_a_malformed_timestamp_is_counted_and_judged_undated(tmp_path, monkeypatch):
    """A torn time makes neither the whole check an error nor hides the line's Xid: it is
    judged as a line without a time (it may be recent), and counted."""
    monkeypatch.setattr(xid, "_now", lambda: 1704067300.0)
    log = tmp_path / "kern.log"
    log.write_text("2024-01-01T00:00:00,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, bad offset\n"
                   "2024-13-45T25:61:00,000000+00:00 some torn line\n"
                   "2024-01-01T00:00:01+99:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, "
                   "GPU has fallen off the bus.\n")
    r = xid.XidCheck(xid.XidCheck.Params(source=str(log), window=None), CheckContext(node="n1")).run()
    assert (r.outcome, r.value) == (Outcome.FAIL, 1)  # the torn line's Xid 79: skipped before, a pass
    assert r.details["malformed_time"] == 2 and r.details["untimed"] == 1
    assert "79" in r.message and "13" in r.message
    windowed = xid.XidCheck(xid.XidCheck.Params(source=str(log), window=60), CheckContext(node="n1")).run()
    assert (windowed.outcome, windowed.value) == (Outcome.FAIL, 1)   # undated: inside any window


def test_an_offset_past_59_minutes_is_a_torn_time():
    """``+00:60`` names no offset: torn (judged undated), not read as +01:00."""
    assert math.isnan(xid.parse_time("2024-01-01T00:00:00+00:60 NVRM: Xid 79")[0])
    assert xid.parse_time("2024-01-01T00:00:00+01:00 x")[0] == 1704063600.0
