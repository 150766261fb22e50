"""Disk: free space on a path, and a short write/fsync/read-back that catches a read-only,
full or failing filesystem before the job writes its first checkpoint there."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time

from pydantic import BaseModel, ConfigDict

from hpcml.units import Bytes, Rate, fmt_bytes, fmt_rate
from hpcml.vet.checks.base import Check, CheckReport, judge


class DiskParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = "/tmp"
    min_free: Bytes = 1e9
    write_size: Bytes = 8 * 2**20
    min_write_rate: Rate | None = None


class DiskCheck(Check[DiskParams]):
    default_timeout = 15.0

    def run(self) -> CheckReport:
        p = self.params
        path = os.path.expandvars(p.path)
        free = shutil.disk_usage(path).free
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
            fd, name = tempfile.mkstemp(prefix=".hpcml-vet-", dir=path)
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
            if hashlib.blake2b(back).digest() != hashlib.blake2b(data).digest():
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
