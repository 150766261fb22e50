"""A checkpoint shard's bytes read as its manifest names them, and the errors of a read.

``CheckedRead`` reads a shard once, in file order, and takes its crc32 over exactly the
bytes the reader uses: what loads (or exports) is what the manifest's checksum names. Apart
from ``layout`` (the files) and ``flatten`` (the state), which both read through it.
"""

from __future__ import annotations

import os
import zlib

from hpcml.errors import HpcmlError


class CheckpointError(HpcmlError):
    """A save or load that could not complete (the message says which file)."""


class CorruptShard(HpcmlError):
    """A shard whose structure does not match its bytes."""


class RefusedLeaf(CorruptShard):
    """A pickled leaf the scan's policy refuses to load (a global, or an argument: the same
    judgement as ``hpcml scan``): the checkpoint is not loaded."""


class ChecksumMismatch(CorruptShard, CheckpointError):
    """A shard (or its index) whose bytes, as a load read them, are not those the manifest's
    crc32 names: changed or rotted since it was written. ``path``: which file."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: checksum mismatch (corrupt): the bytes read are not those the manifest names")
        self.path = path


#: the padding between leaves is read in pieces of at most this
GAP_CHUNK = 1 << 20


class CheckedRead:
    """A shard read once, in file order, its crc32 taken over exactly the bytes the reader
    uses and the padding between them: what loads is what the manifest's checksum names.
    A check on a first read and a load on a second would let a file that changed between
    the two load unchecked (a rename over it, a rewrite, a copy still arriving), and reads
    every byte twice. Each span is read straight into its caller's memory (``into``)."""

    def __init__(self, fd: int, size: int, source: str) -> None:
        self.fd, self.size, self.source = fd, size, source
        self.pos = self.crc = 0
        self._scratch = bytearray()

    def into(self, offset: int, view: memoryview) -> None:
        """Fill ``view`` from ``offset`` (at or after the end of the last span read); the
        padding before it comes in the same ``preadv`` (a leaf is one call, not two)."""
        if not len(view):
            return                              # an empty leaf has no bytes, wherever its offset
        if offset < self.pos:
            raise CorruptShard(f"{self.source}: bytes {offset}+ read out of file order (after {self.pos})")
        if offset - self.pos > GAP_CHUNK:
            self._through(offset)
        gap = self._gap(offset - self.pos)
        read_into(self.fd, self.pos, view, self.source, before=gap)
        self.crc = zlib.crc32(view, zlib.crc32(gap, self.crc))
        self.pos = offset + len(view)

    def _gap(self, n: int) -> memoryview:
        if len(self._scratch) < n:
            self._scratch = bytearray(max(n, min(4096, GAP_CHUNK)))
        return memoryview(self._scratch)[:n]

    def _through(self, offset: int) -> None:
        while self.pos < offset:
            piece = self._gap(min(offset - self.pos, GAP_CHUNK))
            read_into(self.fd, self.pos, piece, self.source)
            self.crc = zlib.crc32(piece, self.crc)
            self.pos += len(piece)

    def finish(self, crc: int | None) -> None:
        """The rest of the file read, and its checksum compared with ``crc`` (None: not compared)."""
        self._through(self.size)
        if crc is not None and self.crc != crc:
            raise ChecksumMismatch(self.source)


def read_into(fd: int, offset: int, into: memoryview, source: str, *, before: memoryview | None = None) -> None:
    """Fill ``into`` from ``fd`` at ``offset`` (``before`` and then ``into``, when given:
    one ``preadv`` for both): one ``read`` gives at most 2 GiB on Linux, and a tensor may
    be larger; a file that ends first raises ``CorruptShard``."""
    views = [v for v in (before, into) if v is not None and len(v)]
    end = offset + sum(len(v) for v in views)
    while views:
        got = os.preadv(fd, views, offset)
        if not got:
            raise CorruptShard(f"{source}: ends at byte {offset}, inside a leaf that runs to {end}")
        offset += got
        while views and got >= len(views[0]):
            got -= len(views[0])
            views.pop(0)
        if views and got:
            views[0] = views[0][got:]
