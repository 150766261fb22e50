"""Disk: free space on a path, and a short write/fsync/read-back that catches a read-only,
full or failing filesystem before the job writes its first checkpoint there."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from hpcml.units import fmt_bytes, fmt_rate
from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import DiskParams  # noqa: F401


class DiskCheck(Check["DiskParams"]):
    default_timeout = 15.0

    def run(self) -> CheckReport:
        p = self.params
        path = os.path.expandvars(p.path)
        st = os.statvfs(path)        # what shutil.disk_usage reads, without its import
        free = st.f_bavail * st.f_frsize
        problems = []
        if free < p.min_free:
            problems.append(f"{path}: free {fmt_bytes(free)} < {fmt_bytes(p.min_free)}")
        rate = self._write_read(path, int(p.write_size), problems)
        if rate is not None and p.min_write_rate and rate < p.min_write_rate:
            problems.append(f"write {fmt_rate(rate)} < {fmt_rate(p.min_write_rate)}")
        return judge(not problems, int(free), threshold=f">= {fmt_bytes(p.min_free)} free",
                     unit="B", message="; ".join(problems) or
                     f"{path}: {fmt_bytes(free)} free, write {fmt_rate(rate or 0)}",
                     write_rate=rate)

    @staticmethod
    def _write_read(path: str, size: int, problems: list[str]) -> float | None:
        data = os.urandom(min(size, 1 << 20)) * max(1, size // (1 << 20))
        try:
            name = os.path.join(path, f".hpcml-vet-{os.getpid()}-{os.urandom(4).hex()}")
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            problems.append(f"{path}: cannot create a file: {exc.strerror}")
            return None
        try:
            start = time.perf_counter()
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            elapsed = time.perf_counter() - start
            with open(name, "rb") as f:
                back = f.read()
            if back != data:
                problems.append(f"{path}: data read back differs from data written")
            return len(data) / max(elapsed, 1e-9)
        except OSError as exc:
            problems.append(f"{path}: write/read failed: {exc.strerror}")
            return None
        finally:
            try:
                os.unlink(name)
            except OSError:
                pass
