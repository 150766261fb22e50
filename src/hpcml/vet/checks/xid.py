"""NVIDIA Xid / SXid errors in the kernel log.

Why: the driver reports GPU and NVSwitch faults (fallen off the bus, double-bit ECC, row
remap failures, GSP timeouts, NVLink errors) as Xid/SXid lines in the kernel log, often
before NVML shows anything. The default critical codes are those of the vetting note
(48, 63, 64, 74, 79, 92, 94, 95, 119, 154); other Xids (13, 31, 43: mostly the application's
own faults) only warn. SXids fail when the line says ``Fatal``.

The log comes from ``dmesg --time-format iso`` (timeout 5 s), else from ``/dev/kmsg`` read
non-blocking, else from the file ``source`` (a saved log, for tests and replay). Lines with an
absolute timestamp older than ``window`` are ignored; lines without one (``[  12.3]`` or
syslog prefixes in a saved file) cannot be dated and are always judged; so are lines whose
ISO prefix is no real time (a torn line: month 13), counted (``malformed_time``): neither
the whole check made an error by one torn line, nor an Xid 79 passed because its time was
torn (fail closed: it may be recent). An unreadable log raises, so the runner reports
``error`` rather than a pass.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone

from pydantic import BaseModel, ConfigDict

from hpcml import unit_fields
from hpcml.vet.checks.base import Check
from hpcml.vet.checks.nvml_snapshot import driver_present
from hpcml.vet.model import CheckReport, Json, Outcome

CRITICAL_XIDS = [48, 63, 64, 74, 79, 92, 94, 95, 119, 154]

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")
_SXID = re.compile(r"(nvidia-nvswitch\d*): SXid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")
_PIDNAME = re.compile(r"^pid=[^,]*,\s*name=[^,]*,\s*")
_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?"
                  r"(Z|[+-]\d{2}:?\d{2})?\s+")


class XidParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str | None = None            # saved kernel log; default: the live one
    window: unit_fields.Seconds | None = 86400.0
    critical: list[int] = CRITICAL_XIDS
    warn_on_other: bool = True
    fail_on_fatal_sxid: bool = True


@dataclass
class XidEvent:
    kind: str                 # "Xid" or "SXid"
    pci: str
    code: int
    message: str
    time: float | None        # epoch seconds, None when the line has no absolute time
    fatal: bool | None = None  # SXid severity; None for Xid


#: the time ``parse_time`` gives a line whose ISO prefix is no date (``2024-13-45``): such a
#: line is counted and judged as one without a time, not the whole check made an error by it
MALFORMED = float("nan")


def parse_time(line: str) -> tuple[float | None, str]:
    """Strip an ISO-8601 prefix (dmesg --time-format iso, journalctl short-iso); its time is
    ``MALFORMED`` (NaN) where the prefix is no real date or time."""
    m = _ISO.match(line)
    if not m:
        return None, line
    date, hms, frac, tz = m.groups()
    try:
        dt = datetime.fromisoformat(f"{date}T{hms}")
        if frac:
            dt += timedelta(microseconds=int(frac[:6].ljust(6, "0")))
        if tz and tz != "Z":
            sign = 1 if tz[0] == "+" else -1
            hh, mm = int(tz[1:3]), int(tz[-2:])
            if hh > 23 or mm > 59:               # +00:60 is no offset (timezone() would take it as 1 h)
                raise ValueError(f"offset {tz}")
            dt = dt.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))
        else:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp(), line[m.end():]
    except (ValueError, OverflowError):      # month 13, hour 25, offset +99:00
        return MALFORMED, line[m.end():]


def parse_event(ts: float | None, text: str) -> XidEvent | None:
    if m := _XID.search(text):
        return XidEvent("Xid", m.group(1), int(m.group(2)),
                        _PIDNAME.sub("", m.group(3)).strip(), ts)
    if m := _SXID.search(text):
        rest = m.group(4).strip()
        severity = rest.split(",", 1)[0].strip().lower()
        return XidEvent("SXid", m.group(2), int(m.group(3)), rest, ts,
                        fatal=severity == "fatal")
    return None


def parse_kmsg_record(rec: bytes, boot: float) -> tuple[float | None, str]:
    """``prio,seq,usec,flags;message`` -> (epoch seconds, message)."""
    head, _, body = rec.decode("utf-8", "replace").partition(";")
    fields = head.split(",")
    try:
        ts = boot + int(fields[2]) / 1e6
    except (IndexError, ValueError):
        ts = None
    return ts, body.split("\n", 1)[0]


def read_kmsg(path: str = "/dev/kmsg", max_records: int = 1_000_000):
    """Every record in the kernel ring buffer, without blocking for new ones."""
    boot = time.time() - time.monotonic()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        for _ in range(max_records):
            try:
                rec = os.read(fd, 16384)
            except BlockingIOError:
                break
            except BrokenPipeError:        # records overwritten while reading: go on
                continue
            if not rec:
                break
            out.append(parse_kmsg_record(rec, boot))
    finally:
        os.close(fd)
    return out


def read_live_log() -> tuple[list[tuple[float | None, str]], str]:
    """The kernel log with times: dmesg first, /dev/kmsg if dmesg cannot."""
    try:
        r = subprocess.run(["dmesg", "--time-format", "iso"], capture_output=True,
                           text=True, errors="replace", timeout=5)
        if r.returncode == 0:
            return [parse_time(line) for line in r.stdout.splitlines()], "dmesg"
        why = r.stderr.strip() or f"exit {r.returncode}"
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)
    try:
        return read_kmsg(), "/dev/kmsg"
    except OSError as e:
        raise PermissionError(
            f"cannot read the kernel log for the Xid scan: dmesg: {why}; /dev/kmsg: "
            f"{e.strerror or e} (needs kernel.dmesg_restrict=0 or CAP_SYSLOG, "
            "or run it in the prolog as root)") from None


def _now() -> float:
    return time.time()


class XidCheck(Check[XidParams]):
    """Fails on critical Xid/SXid lines in the kernel log within the window."""

    def read_log(self) -> tuple[list[tuple[float | None, str]], str]:
        src = self.params.source
        if not src:
            return read_live_log()
        with open(src, encoding="utf-8", errors="replace") as f:
            return [parse_time(line.rstrip("\n")) for line in f], src

    def run(self) -> CheckReport:
        p = self.params
        entries, source = self.read_log()
        since = None if p.window is None else _now() - p.window
        events, old, malformed = [], 0, 0
        for ts, text in entries:
            if ts is not None and math.isnan(ts):
                malformed += 1
                ts = None             # cannot be dated: judged, as a line without a time is
            ev = parse_event(ts, text)
            if ev is None:
                continue
            if since is not None and ev.time is not None and ev.time < since:
                old += 1
            else:
                events.append(ev)
        bad = [e for e in events if (e.kind == "Xid" and e.code in p.critical)
               or (e.kind == "SXid" and e.fatal and p.fail_on_fatal_sxid)]
        other = [e for e in events if e not in bad] if p.warn_on_other else []
        details: dict[str, Json] = {"source": source, "window": p.window, "older_ignored": old,
                                    "untimed": sum(e.time is None for e in events),
                                    "malformed_time": malformed,
                                    "events": [asdict(e) for e in events]}
        span = "" if p.window is None else f" in the last {_span(p.window)}"
        if not bad and not other:
            driver = "" if driver_present() else " (NVIDIA driver not loaded)"
            return CheckReport(Outcome.PASS, 0, "0 critical", "events",
                               f"no critical Xid/SXid{span}{driver}"
                               if events else f"no Xid/SXid{span}{driver}", details)
        message = "; ".join(_group(bad) + [s + " (warn)" for s in _group(other)])
        return CheckReport(Outcome.FAIL if bad else Outcome.WARN, len(bad), "0 critical",
                           "events", message, details)


def _span(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


def _group(events: list[XidEvent]) -> list[str]:
    """One phrase per (kind, code, device), with the count and the latest message."""
    groups: dict[tuple, list[XidEvent]] = {}
    for e in events:
        groups.setdefault((e.kind, e.code, e.pci), []).append(e)
    out = []
    for (kind, code, pci), evs in groups.items():
        n = f" x{len(evs)}" if len(evs) > 1 else ""
        out.append(f"{kind} {code} on {pci}{n}: {evs[-1].message}")
    return out
