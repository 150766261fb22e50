"""XidCheck on hand-written kernel logs (tests/fixtures/dmesg) and on this machine's own log.

The samples follow the Xid/SXid line formats of NVIDIA's documentation; no GPU node produced
them. The clock is pinned (``xid._now``) so the 24 h window gives the same answer every day.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from hpcml.vet.checks import nvml_snapshot, xid
from hpcml.vet.checks.base import CheckContext
from hpcml.vet.checks.xid import XidCheck, parse_event, parse_kmsg_record, parse_time
from hpcml.vet.model import Outcome
from tests import needs

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "dmesg"
NOON = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc).timestamp()


@pytest.fixture
def at(monkeypatch, tmp_path):
    """Pin 'now' and pretend the NVIDIA driver is loaded (or not) on this host."""
    def set_(now=NOON, driver=True):
        monkeypatch.setattr(xid, "_now", lambda: now)
        proc = tmp_path / ("version" if driver else "absent")
        if driver:
            proc.write_text("NVRM version: 550.54.15\n")
        monkeypatch.setattr(nvml_snapshot, "DRIVER_MARKERS", (str(proc),))
    set_()
    return set_


def run(sample: str | None, **params):
    if sample is not None:
        params["source"] = str(DATA / sample)
    return XidCheck(XidCheck.Params(**params), CheckContext(node="n1")).run()


def test_xid79_fails(at):
    r = run("xid79.log")
    assert (r.outcome, r.value) == (Outcome.FAIL, 1)
    assert r.message == "Xid 79 on 0000:47:00: GPU has fallen off the bus."
    ev = r.details["events"][0]
    assert (ev["kind"], ev["code"], ev["pci"]) == ("Xid", 79, "0000:47:00")
    assert ev["time"] == pytest.approx(NOON - 19 * 60 + 51.00453)


def test_xid13_only_warns(at):
    r = run("xid13.log")
    assert (r.outcome, r.value) == (Outcome.WARN, 0)
    assert r.message.startswith("Xid 13 on 0000:07:00 x2: Graphics Exception: ESR")
    assert r.message.endswith("(warn)") and ";" not in r.message


def test_other_xids_can_be_ignored_or_made_critical(at):
    at(driver=False)
    r = run("xid13.log", warn_on_other=False)
    assert (r.outcome, r.message) == (
        Outcome.PASS, "no critical Xid/SXid in the last 24 h (NVIDIA driver not loaded)")
    assert run("xid13.log", critical=[13]).outcome is Outcome.FAIL


def test_sxid_fatal_fails_nonfatal_warns(at):
    r = run("sxid.log")
    assert (r.outcome, r.value) == (Outcome.FAIL, 1)
    assert r.message == ("SXid 20034 on 0000:c2:00.0: Fatal, Link 28 LTSSM Fault Up; "
                         "SXid 19084 on 0000:c5:00.0 x2: Severity 0 Engine instance 10 "
                         "Sub-engine instance 00 (warn)")
    r = run("sxid.log", fail_on_fatal_sxid=False)
    assert (r.outcome, r.value) == (Outcome.WARN, 0)


def test_clean_log_passes(at):
    r = run("clean.log")
    assert (r.outcome, r.value, r.message) == (Outcome.PASS, 0, "no Xid/SXid in the last 24 h")
    at(driver=False)
    assert run("clean.log").message == "no Xid/SXid in the last 24 h (NVIDIA driver not loaded)"


def test_window(at):
    at(now=NOON + 2 * 86400)                                   # two days later
    r = run("xid79.log")
    assert (r.outcome, r.details["older_ignored"]) == (Outcome.PASS, 1)
    assert run("xid79.log", window=None).outcome is Outcome.FAIL
    at(now=NOON)
    assert run("xid79.log", window="1 h").outcome is Outcome.FAIL   # 11:40 is within 1 h
    at(now=NOON + 3600)
    r = run("xid79.log", window="1 h")
    assert (r.outcome, r.message) == (Outcome.PASS, "no Xid/SXid in the last 1 h")


def test_undated_lines_are_always_judged(at):
    at(now=NOON + 365 * 86400)
    r = run("old_xid79_bracketed.log")
    assert (r.outcome, r.details["untimed"]) == (Outcome.FAIL, 1)
    assert r.message == "Xid 79 on 0000:47:00: GPU has fallen off the bus."


def test_params():
    assert XidCheck.Params(window="2 h").window == 7200
    assert XidCheck.Params().critical == [48, 63, 64, 74, 79, 92, 94, 95, 119, 154]
    with pytest.raises(ValidationError):
        XidCheck.Params(windw="1 h")


def test_parsers():
    ts, rest = parse_time("2026-01-01T13:00:00,500000+01:00 NVRM: hello")
    assert (ts, rest) == (NOON + 0.5, "NVRM: hello")
    assert parse_time("2026-01-01T12:00:00+0000 host kernel: x")[0] == NOON  # journalctl
    assert parse_time("[   5.9] NVRM: x") == (None, "[   5.9] NVRM: x")
    ev = parse_event(None, "Jan  1 12:00:00 host kernel: NVRM: Xid (0000:03:00): 14, "
                           "Channel 00000001")
    assert (ev.kind, ev.pci, ev.code, ev.message) == ("Xid", "0000:03:00", 14,
                                                      "Channel 00000001")
    assert parse_event(None, "NVRM: GPU at PCI:0000:47:00: GPU-9b8a") is None
    rec = (b"3,1234,12051004530,-;NVRM: Xid (PCI:0000:47:00): 79, pid=1, name=x, "
           b"GPU has fallen off the bus.\n SUBSYSTEM=pci\n")
    ts, text = parse_kmsg_record(rec, boot=1000.0)
    assert ts == pytest.approx(1000 + 12051.00453)
    assert parse_event(ts, text).message == "GPU has fallen off the bus."


def test_missing_source_is_an_error(at, tmp_path):
    with pytest.raises(FileNotFoundError):
        run(None, source=str(tmp_path / "nope.log"))


def test_unreadable_kernel_log_raises(at, monkeypatch):
    def dmesg(*a, **k):
        return subprocess.CompletedProcess(a[0], 1, "", "dmesg: read kernel buffer failed: "
                                                        "Operation not permitted\n")

    def kmsg(*a, **k):
        raise PermissionError(13, "Permission denied", "/dev/kmsg")

    monkeypatch.setattr(xid.subprocess, "run", dmesg)
    monkeypatch.setattr(xid, "read_kmsg", kmsg)
    with pytest.raises(PermissionError, match="cannot read the kernel log.*Operation not "
                                              "permitted.*Permission denied"):
        run(None)


def test_falls_back_to_kmsg(at, monkeypatch):
    monkeypatch.setattr(xid.subprocess, "run",
                        lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("dmesg")))
    line = "NVRM: Xid (PCI:0000:0f:00): 119, pid=2, name=x, Timeout after 6s of waiting for RPC"
    monkeypatch.setattr(xid, "read_kmsg", lambda: [(NOON - 60, line)])
    r = run(None)
    assert (r.outcome, r.details["source"]) == (Outcome.FAIL, "/dev/kmsg")
    assert r.message == "Xid 119 on 0000:0f:00: Timeout after 6s of waiting for RPC"


def test_live_kernel_log_of_this_machine(monkeypatch):
    """The real dmesg and /dev/kmsg paths, where this host lets us read them."""
    probe = subprocess.run(["dmesg", "--time-format", "iso"], capture_output=True, text=True)
    if probe.returncode != 0:
        needs.missing("kernel-log", f"kernel log not readable here: {probe.stderr.strip()}")
    r = XidCheck(XidCheck.Params(), CheckContext(node="n1")).run()
    assert r.details["source"] == "dmesg"
    expected = Outcome.PASS if "NVRM: Xid" not in probe.stdout and "SXid" not in probe.stdout \
        else r.outcome
    assert r.outcome is expected
    try:
        records = xid.read_kmsg()                  # must return, not block for new records
    except PermissionError:
        return
    assert records and all(isinstance(t, float) for t, _ in records[:10])
