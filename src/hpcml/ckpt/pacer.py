"""Write a buffer to a file at no more than a set number of bytes per second.

The write path is buffered ``write`` in 8 MiB pieces, ``fdatasync`` every 64 MiB and
``posix_fadvise(DONTNEED)`` on what was synced. Why not O_DIRECT: tmpfs (``/dev/shm``, a
common local tier) refuses it, and Lustre and GPFS accept it only with alignment rules
per file system. Why the periodic sync: without it the pacing would only pace the page
cache, and the kernel's writeback would still hit the disk (and the parallel file system)
in one burst; syncing every 64 MiB makes the device see the capped rate, and dropping the
synced pages keeps a multi-GB checkpoint from evicting the training job's own page cache.

The cap is held over the whole write (a token bucket with no burst beyond one piece), so
"500 MB/s" means a 2 GB shard takes 4 s whatever the device could do.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator

from hpcml.ckpt.layout import FILE_MODE, create

PIECE = 8 << 20
SYNC_EVERY = 64 << 20


def _pump(path: str, pieces: Iterable[memoryview | bytes], rate: float | None,
          should_stop: Callable[[], bool], mode: int) -> int:
    crc = 0
    fd = create(path, mode)
    try:
        start, done, synced = time.monotonic(), 0, 0
        for piece in pieces:
            if should_stop():
                raise InterruptedError("checkpoint write abandoned")
            crc = zlib.crc32(piece, crc)
            view, n = memoryview(piece), 0
            while n < len(view):
                n += os.write(fd, view[n:])
            done += len(view)
            if done - synced >= SYNC_EVERY:
                os.fdatasync(fd)
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, synced, done - synced, os.POSIX_FADV_DONTNEED)
                synced = done
            if rate:
                ahead = start + done / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        os.fsync(fd)
        if hasattr(os, "posix_fadvise") and done > synced:
            os.posix_fadvise(fd, synced, done - synced, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return crc


def write_paced(path: str, buf: memoryview, rate: float | None, *,
                should_stop: Callable[[], bool] = lambda: False, mode: int = FILE_MODE) -> int:
    """Write ``buf`` to ``path`` (created, truncated, ``mode``), fsynced; returns its crc32.
    ``rate``: bytes/s cap (None: as fast as the device goes)."""
    return _pump(path, (buf[i:i + PIECE] for i in range(0, len(buf), PIECE)), rate, should_stop, mode)


def copy_paced(src: str, dst: str, rate: float | None, *,
               should_stop: Callable[[], bool] = lambda: False, mode: int = FILE_MODE) -> int:
    """Copy a file under the cap (the drain from the local tier); returns its crc32."""
    def chunks() -> Iterator[bytes]:
        with open(src, "rb", buffering=0) as fh:
            while chunk := fh.read(PIECE):
                yield chunk
    return _pump(dst, chunks(), rate, should_stop, mode)
