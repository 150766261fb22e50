"""Where a file lives (its mount, and what backs a squashfs mount) and how to make its
next read cold: what a storage benchmark needs before every pass."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from hpcml.errors import UsageError
from hpcml.proctree import command_lines


@dataclass(frozen=True)
class Mount:
    point: str
    device: str
    fstype: str


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_of(path: str | os.PathLike, mounts: str = "/proc/self/mounts") -> Mount:
    """The mount holding ``path`` (the longest mount point above it), for the label."""
    real, best = os.path.realpath(path), Mount("/", "?", "unknown")
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape(parts[1])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.point):
            best = Mount(point, _unescape(parts[0]), parts[2])
    return best


def backing_files(m: Mount) -> list[str]:
    """Caches below a squashfs mount that evicting its files leaves warm: the loop device
    and its image (kernel mount), or the image squashfuse was started on."""
    out: list[str] = []
    if m.device.startswith("/dev/loop"):
        out.append(m.device)
        try:
            out.append(Path(f"/sys/block/{Path(m.device).name}/loop/backing_file").read_text().strip())
        except OSError:
            pass
    elif m.fstype.startswith("fuse") and "squash" in m.fstype + m.device:
        for pid, argv in command_lines():
            if len(argv) < 3 or "squashfuse" not in Path(argv[0]).name:
                continue
            cwd = Path(f"/proc/{pid}/cwd")
            real = [os.path.realpath(cwd / a) for a in argv]
            if m.point in real[2:]:
                out.append(real[real.index(m.point, 2) - 1])
                break
    return out


def _evict_some(paths: Sequence[str]) -> int:
    n = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n


def evict(paths: Iterable[str], threads: int = 8) -> int:
    """Drop these files' pages from the page cache (no root needed); returns how many.

    Threads because on a parallel filesystem each open is a metadata round trip.
    """
    paths = list(paths)
    step = max(1, min(1000, -(-len(paths) // threads)))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(pool.map(_evict_some, [paths[i:i + step] for i in range(0, len(paths), step)]))


def drop_caches() -> None:
    """The kernel's whole page cache, dentries and inodes (root only)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise UsageError(f"cannot drop caches: {exc.strerror} (needs root)",
                         file="/proc/sys/vm/drop_caches") from None
