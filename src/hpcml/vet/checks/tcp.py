"""A TCP endpoint the job needs (license server, proxy, object store) is reachable."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import TcpParams  # noqa: F401


class TcpCheck(Check["TcpParams"]):
    default_timeout = 10.0

    def run(self) -> CheckReport:
        p = self.params
        start = time.perf_counter()
        try:
            with socket.create_connection((p.host, p.port), timeout=p.connect_timeout):
                ms = (time.perf_counter() - start) * 1e3
            return judge(True, round(ms, 2), threshold="connects", unit="ms",
                         message=f"{p.host}:{p.port} connected in {ms:.1f} ms")
        except OSError as exc:
            return judge(False, None, threshold="connects",
                         message=f"{p.host}:{p.port}: {exc.strerror or exc}")
