"""Disk: free space on a path, and a short write/fsync/read-back that catches a read-only,
full or failing filesystem before the job writes its first checkpoint there."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from hpcml import scratch
from hpcml.units import fmt_bytes, fmt_rate
from hpcml.vet.checks.base import Check, CheckReport, judge

if TYPE_CHECKING:  # the string type argument below
    from hpcml.vet.checks.params import DiskParams  # noqa: F401

#: where the filesystem has no O_TMPFILE, the write test's file is named
#: ``.hpcml-vet-HOST-PID-RANDOM`` for the microseconds before it is unlinked
SCRATCH_PREFIX = ".hpcml-vet"


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
        """Write, fsync, drop from the page cache, read back, through one descriptor of a
        file that has no name (``scratch``): a check killed at its timeout leaves nothing
        on the node's disk."""
        data = os.urandom(min(size, 1 << 20)) * max(1, size // (1 << 20))
        try:
            fd = scratch.scratch(path, SCRATCH_PREFIX)
        except OSError as exc:
            problems.append(f"{path}: cannot create a file: {exc.strerror}")
            return None
        try:
            start = time.perf_counter()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            elapsed = time.perf_counter() - start
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)    # read back from the disk, not the cache
            back = bytearray()
            while len(back) < len(data):
                chunk = os.pread(fd, len(data) - len(back), len(back))
                if not chunk:
                    break
                back += chunk
            if back != data:
                problems.append(f"{path}: data read back differs from data written")
            return len(data) / max(elapsed, 1e-9)
        except OSError as exc:
            problems.append(f"{path}: write/read failed: {exc.strerror}")
            return None
        finally:
            os.close(fd)
