"""Leftover processes of other users: another job's stray ranks hold CPU, memory or a GPU."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import psutil

from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import ProcessesParams  # noqa: F401


class ProcessesCheck(Check["ProcessesParams"]):
    default_timeout = 5.0

    def run(self) -> CheckReport:
        p = self.params
        me = os.getuid()
        foreign = []
        for proc in psutil.process_iter(["pid", "name", "uids", "username"]):
            info = proc.info
            uid = info["uids"].real if info.get("uids") else None
            if uid is None or uid == me or uid < p.min_uid:
                continue
            if info["username"] in p.allowed_users or info["name"] in p.ignore_names:
                continue
            foreign.append(f"{info['username']}:{info['name']}({info['pid']})")
        msg = ", ".join(foreign[:10]) + (" …" if len(foreign) > 10 else "")
        return judge(len(foreign) <= p.max_foreign, len(foreign), threshold=f"<= {p.max_foreign}",
                     unit="processes", message=msg or "no processes of other users",
                     processes=foreign[:50])
