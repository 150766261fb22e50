"""Per-shard index: where each sample and each of its members lies in the tar.

Written by the packer next to each shard, read by the reader (to slice samples out of
large block reads) and by staging. A sample's span runs from its first member's header to
the end of its last member's padded data, so consecutive samples tile the shard.

Rows are ``[key, start, end, [[ext, data_offset, size], ...]]``; JSON because it is read a
shard at a time with orjson (about 2 ms for 5,000 samples) and a person can inspect it.

An index is a file like any other, so ``index_of`` checks every row before the reader slices
with it: integers (no bool, no float), samples in tar order without overlap, each at least a
header long, each member inside its sample after a header of its own, and as many rows as
the manifest counts. The bound by the shard's real length is the reader's (it alone knows
it: ``fstat`` of the descriptor it reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from hpcml.errors import UsageError
from hpcml.files import read_json, write_atomic

BLOCK = 512
#: the most a compressed shard's tar may hold decompressed: it is read whole, decompressed from
#: its start, as one block (no compression webdataset uses allows a seek), into memory that
#: grows with what decompresses (never with what an index claims); ``hpcml data index``
#: refuses a larger one as it walks it (a deflate bomb costs the walk no more), and the reader
#: an index that claims more. Far above webdataset's advice (shards of 100 MB to a few GB)
MAX_INFLATED_BYTES = 16 << 30


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


def load_index(path: Path, *, samples: int | None = None) -> ShardIndex:
    """``samples``: the count the manifest gives the shard, which the index must hold."""
    return index_of(read_index_doc(path), str(path), samples=samples)


def load_index_bytes(data: bytes, source: str, *, samples: int | None = None) -> ShardIndex:
    """An index read from elsewhere (an object store): the same checks as a file's."""
    try:
        doc = orjson.loads(data)
    except ValueError as exc:
        raise UsageError(f"not JSON ({exc})", file=source) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise UsageError("not a shard index", file=source, key="samples")
    return index_of(doc, source, samples=samples)


def index_of(doc: dict, path: str, *, samples: int | None = None) -> ShardIndex:
    """The index ``doc``, each row checked (``row_problem``); ``samples``: how many rows the
    manifest promises. A UsageError naming ``path`` and the row otherwise: the reader plans
    its order from the manifest's counts and slices with these offsets, so a row out of
    order or a count that differs would read another sample's bytes, or past the plan."""
    rows = doc["samples"]
    if samples is not None and len(rows) != samples:
        raise UsageError(f"holds {len(rows):,} samples, the manifest {samples:,}: the index is not this shard's "
                         "(index the shard again)", file=str(path), key="samples")
    prev = 0
    for i, row in enumerate(rows):
        problem = row_problem(row, prev)
        if problem is not None:
            raise UsageError(problem, file=str(path), key=f"samples[{i}]")
        prev = row[2]
    try:
        starts = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        ends = np.fromiter((r[2] for r in rows), dtype=np.int64, count=len(rows))
    except OverflowError:
        raise UsageError("an offset beyond 2**63", file=str(path), key="samples") from None
    return ShardIndex(doc.get("shard", ""), [r[0] for r in rows], starts, ends, [r[3] for r in rows])


def row_problem(row: object, prev_end: int) -> str | None:
    """Why ``row`` is not a sample that follows one ending at ``prev_end``, or None: a key,
    a span ``[start, end)`` at or after ``prev_end`` and at least one header long, and
    members ``[ext, data_offset, size]`` each after a header, inside the span, in order.
    About 0.4 us a sample: a fifth of what parsing the JSON costs."""
    if type(row) is not list or len(row) != 4:
        return "not a row [key, start, end, members]"
    key, start, end, members = row
    if type(key) is not str:
        return f"the key is not a string (found {key!r:.40})"
    if type(start) is not int or type(end) is not int or type(members) is not list:
        return "start and end must be integers, members a list"
    if start < prev_end:
        return (f"starts at byte {start:,}, before the previous sample ends ({prev_end:,}): "
                "samples overlap or are out of order" if start >= 0 else f"a negative offset ({start:,})")
    if end < start + BLOCK:
        return f"ends at byte {end:,}, less than one {BLOCK}-byte tar header after its start ({start:,})"
    at = start + BLOCK                        # the earliest a member's data can begin
    for m in members:
        if type(m) is not list or len(m) != 3:
            return "a member that is not [ext, data_offset, size]"
        ext, off, size = m
        if type(ext) is not str or type(off) is not int or type(size) is not int:
            return "a member's field must be a string, its offset and size integers"
        if off < at or size < 0 or off + size > end:
            return (f"member '{ext:.40}' at byte {off:,} ({size:,} bytes) is not inside the sample's span "
                    f"[{start:,}, {end:,}) after a header of its own")
        at = off + size + BLOCK
    return None


#: the type flags of a regular file's header: its data is the bytes stored after it
REGULAR = (b"0", b"\0", b"7")


def size_field(field: bytes) -> int:
    """A ustar size field: octal, or GNU base-256 (first byte 0x80, then big-endian), which
    GNU tar and tarfile write for a member of 8 GiB or more. ValueError for anything else."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def header_problem(buf: bytes | memoryview, pos: int, size: int) -> str | None:
    """Why the 512-byte tar header at ``buf[pos:]`` does not announce ``size`` bytes, or None.

    Checks the ustar magic, the type (a regular file: a sparse member's bytes stored are not
    its data) and the size field (and, when those differ from what the packer writes, the
    header checksum for a precise message): enough to catch a truncated, overwritten or
    misaligned shard without reading anything extra. The fast path costs a sample well under
    a microsecond.
    """
    if (buf[pos + 257:pos + 262] == b"ustar" and buf[pos + 124:pos + 136] == b"%011o\0" % size
            and buf[pos + 156:pos + 157] in REGULAR):
        return None
    hdr = bytes(buf[pos:pos + BLOCK])
    if len(hdr) < BLOCK:
        return "truncated header"
    if hdr[257:262] != b"ustar":
        return "no tar header"
    if hdr[156:157] not in REGULAR:
        return f"not a regular file's header (type {hdr[156:157]!r})"
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
