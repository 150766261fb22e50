"""Leftover processes of other users: another job's stray ranks hold CPU, memory or a GPU."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import psutil

from hpcml.vet.checks.base import Check, CheckReport, judge
from hpcml.vet.model import Outcome

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import ProcessesParams  # noqa: F401


MOUNTS = "/proc/self/mounts"


def hidden(mounts: str, euid: int, groups: list[int]) -> str | None:
    """Why other users' processes may be hidden from this process, or None: ``/proc``
    mounted with ``hidepid`` 1 or 2 (``noaccess``, ``invisible`` since Linux 5.8), as many HPC
    sites mount it, unless this process is root or in the mount's ``gid=`` group."""
    if euid == 0:
        return None
    procs = [f for line in mounts.splitlines() if len(f := line.split()) >= 4 and f[2] == "proc" and f[1] == "/proc"]
    if not procs:
        return None
    opts = {k: v for k, _, v in (o.partition("=") for o in procs[-1][3].split(","))}   # the last mount is seen
    level = opts.get("hidepid")
    if level is None or level in ("0", "off"):
        return None
    gid = opts.get("gid", "")
    if gid.isdigit() and int(gid) in groups:
        return None
    return f"/proc is mounted hidepid={level}"


class ProcessesCheck(Check["ProcessesParams"]):
    default_timeout = 5.0

    def run(self) -> CheckReport:
        p = self.params
        me = os.getuid()
        foreign = []
        unread = 0                       # processes whose owner this process may not read
        for proc in psutil.process_iter(["pid", "name", "uids", "username"]):
            info = proc.info
            uid = info["uids"].real if info.get("uids") else None
            if uid is None:
                unread += 1
                continue
            if uid == me or uid < p.min_uid:
                continue
            if info["username"] in p.allowed_users or info["name"] in p.ignore_names:
                continue
            foreign.append(f"{info['username']}:{info['name']}({info['pid']})")
        msg = ", ".join(foreign[:10]) + (" …" if len(foreign) > 10 else "")
        try:
            with open(MOUNTS) as f:
                why = hidden(f.read(), os.geteuid(), [os.getegid(), *os.getgroups()])
        except OSError:
            why = None
        if why is None and unread:
            why = f"the owner of {unread} processes could not be read"
        if why is not None and len(foreign) <= p.max_foreign:
            # what was seen passes, but what may be hidden was not judged: unknown, not "none";
            # a warning, not an error: one site setting would otherwise count every node bad
            return CheckReport(Outcome.WARN, len(foreign) if foreign else None, f"<= {p.max_foreign}", "processes",
                               f"other users' processes not judged: {why}"
                               + (f" (seen: {msg})" if msg else "") + "; run the check as root, or in /proc's gid= group",
                               {"processes": foreign[:50], "hidden": why})
        return judge(len(foreign) <= p.max_foreign, len(foreign), threshold=f"<= {p.max_foreign}",
                     unit="processes", message=msg or "no processes of other users",
                     processes=foreign[:50])
