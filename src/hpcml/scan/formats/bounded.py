"""Bounded reads for the formats hpcml recognises but does not load (HDF5, ONNX, GGUF, TF
SavedModel): random access through one small window, and a file walked in overlapping
chunks. Memory never grows with the file, whatever its headers claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

CHUNK = 1 << 20


class Truncated(ValueError):
    """The file ends before something its own structure says is there."""


class ByteReader:
    """Exact reads of ``size`` bytes of ``fh`` (from its start) at any offset, served from
    a 64 KiB window so that many small reads (varints, lengths) cost few system calls."""

    WINDOW = 1 << 16

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh, self.size = fh, size
        self._start, self._buf = 0, b""

    def read(self, pos: int, n: int, what: str = "data") -> bytes:
        if pos < 0 or n < 0 or pos + n > self.size:
            raise Truncated(f"{what} at byte {pos} runs past the end of the file ({self.size} bytes)")
        if not (self._start <= pos and pos + n <= self._start + len(self._buf)):
            if n > self.WINDOW:
                return self._exact(pos, n, what)
            self._start, self._buf = pos, self._exact(pos, min(self.WINDOW, self.size - pos), what)
        at = pos - self._start
        return self._buf[at:at + n]

    def _exact(self, pos: int, n: int, what: str) -> bytes:
        self.fh.seek(pos)
        data = self.fh.read(n)
        if len(data) != n:
            raise Truncated(f"{what} at byte {pos}: the file ended after {len(data)} of {n} bytes")
        return data


def chunks(fh: BinaryIO, size: int, overlap: int) -> Iterator[tuple[int, bytes, int]]:
    """``(offset, data, fresh)`` over ``size`` bytes of ``fh``, read front to back (a
    compressed archive member seeks backwards only by reading again from its start): each
    chunk ends with the first ``overlap`` bytes of the next, so a match shorter than that
    is whole in one chunk; count only matches that start before ``fresh`` (then each is
    seen once). The caller may read elsewhere in ``fh`` between chunks."""
    pos, tail, left = 0, b"", size
    while left > 0:
        if fh.tell() != size - left:
            fh.seek(size - left)
        new = fh.read(min(CHUNK, left))
        if not new:
            raise Truncated(f"the file ended at byte {size - left} of {size}")
        left -= len(new)
        data = tail + new
        fresh = max(len(data) - overlap, 0) if left else len(data)
        yield pos, data, fresh
        pos, tail = pos + fresh, data[fresh:]
