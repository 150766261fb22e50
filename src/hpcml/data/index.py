"""Per-shard index: where each sample and each of its members lies in the tar.

Written by the packer next to each shard, read by the reader (to slice samples out of
large block reads) and by staging. A sample's span runs from its first member's header to
the end of its last member's padded data, so consecutive samples tile the shard.

Rows are ``[key, start, end, [[ext, data_offset, size], ...]]``; JSON because it is read a
shard at a time with orjson (about 2 ms for 5,000 samples) and a person can inspect it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from hpcml.errors import UsageError
from hpcml.files import read_json, write_atomic

BLOCK = 512


@dataclass
class ShardIndex:
    shard: str
    keys: list[str]
    starts: np.ndarray       # int64, byte offset of each sample's first header
    ends: np.ndarray         # int64, end of each sample's last padded member
    members: list[list]      # per sample: [[ext, data_offset, size], ...]

    def __len__(self) -> int:
        return len(self.keys)


#: tar shards as WebDataset names them, plain or compressed (hpcml data index reads all of them)
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def index_name(shard_name: str) -> str:
    """The index beside a shard: its name without the tar suffix (any case), ``.idx.json``."""
    lower = shard_name.lower()
    for suffix in sorted(SHARD_SUFFIXES, key=len, reverse=True):
        if lower.endswith(suffix):
            return shard_name[:-len(suffix)] + ".idx.json"
    return shard_name + ".idx.json"


def padded(n: int) -> int:
    """A member's size rounded up to whole tar blocks."""
    return -(-n // BLOCK) * BLOCK


def write_index(path: Path, shard: str, rows: list[list], fingerprint: str, sha256: str,
                size: int, *, compression: str = "", tar_bytes: int | None = None) -> None:
    """``compression`` and ``tar_bytes`` for a compressed shard (``hpcml data index``): its
    offsets are in the decompressed tar."""
    write_atomic(path, index_bytes(shard, rows, fingerprint, sha256, size, compression=compression,
                                   tar_bytes=tar_bytes).decode())


def index_bytes(shard: str, rows: list[list], fingerprint: str, sha256: str, size: int, *,
                compression: str = "", tar_bytes: int | None = None) -> bytes:
    """An index document, as a file or an object holds it."""
    doc: dict = {"shard": shard, "fingerprint": fingerprint, "sha256": sha256, "bytes": size}
    if compression:
        doc |= {"compression": compression, "tar_bytes": tar_bytes}
    doc["samples"] = rows
    return orjson.dumps(doc)


def read_index_doc(path: Path) -> dict:
    doc = read_json(path, None, missing="shard index missing", loads=orjson.loads)
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise UsageError("not a shard index", file=str(path), key="samples")
    return doc


def load_index(path: Path) -> ShardIndex:
    return index_of(read_index_doc(path), str(path))


def load_index_bytes(data: bytes, source: str) -> ShardIndex:
    """An index read from elsewhere (an object store): the same checks as a file's."""
    try:
        doc = orjson.loads(data)
    except ValueError as exc:
        raise UsageError(f"not JSON ({exc})", file=source) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise UsageError("not a shard index", file=source, key="samples")
    return index_of(doc, source)


def index_of(doc: dict, path: str) -> ShardIndex:
    rows = doc["samples"]
    try:
        starts = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        ends = np.fromiter((r[2] for r in rows), dtype=np.int64, count=len(rows))
        return ShardIndex(doc.get("shard", ""), [r[0] for r in rows], starts, ends, [r[3] for r in rows])
    except (TypeError, IndexError, ValueError):
        raise UsageError("malformed sample row", file=str(path), key="samples") from None


def size_field(field: bytes) -> int:
    """A ustar size field: octal, or GNU base-256 (first byte 0x80, then big-endian), which
    GNU tar and tarfile write for a member of 8 GiB or more. ValueError for anything else."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def header_problem(buf: bytes | memoryview, pos: int, size: int) -> str | None:
    """Why the 512-byte tar header at ``buf[pos:]`` does not announce ``size`` bytes, or None.

    Checks the ustar magic and the size field (and, when those differ from what the packer
    writes, the header checksum for a precise message): enough to catch a truncated,
    overwritten or misaligned shard without reading anything extra. The fast path costs
    a sample well under a microsecond.
    """
    if buf[pos + 257:pos + 262] == b"ustar" and buf[pos + 124:pos + 136] == b"%011o\0" % size:
        return None
    hdr = bytes(buf[pos:pos + BLOCK])
    if len(hdr) < BLOCK:
        return "truncated header"
    if hdr[257:262] != b"ustar":
        return "no tar header"
    try:
        stored = int(hdr[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
        found = size_field(hdr[124:136])
    except ValueError:
        return "garbled tar header"
    if stored != sum(hdr[:148]) + 256 + sum(hdr[156:]):
        return "tar header checksum mismatch"
    if found != size:
        return f"member size {found} in the tar, {size} in the index"
    return None
