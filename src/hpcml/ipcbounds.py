"""What an Arrow IPC record batch will decode to, read from its message before Arrow decodes it.

A compressed (zstd, LZ4) IPC buffer starts with the length it decompresses to, and Arrow
allocates that length and fills it: a 37 KB batch of zeros claims, and becomes, 1.2 GB. A
reader that counts a batch once decoded (``RecordBatch.nbytes``) has already paid for it.
The claim is in the message: its metadata (a flatbuffer ``Message`` whose header is a
``RecordBatch``: the body's buffers, as offset and length, and the compression) says where
each buffer lies in the body, and each compressed buffer's first 8 bytes say what it decodes
to. ``decoded_size`` adds those up, so a reader can refuse the batch before it exists.

Why by hand: pyarrow exposes a message's metadata only as bytes, and the ``flatbuffers``
package's generated Arrow classes are not a dependency; the part read here (a root table, a
union, two vectors of structs, one small table) is the flatbuffer format's plainest layout
(https://flatbuffers.dev/internals/, Arrow's ``format/Message.fbs`` and ``Schema.fbs``).
Every offset is checked against the bytes it points into; a message this cannot read is a
``ValueError``, and the caller refuses the batch. Arrow reads the same bytes, so the sizes
summed are the sizes it would allocate.
"""

from __future__ import annotations

import struct
from typing import IO

#: ``MessageHeader`` union member of a record batch (Message.fbs)
RECORD_BATCH = 3
#: the union's members, as a message is named in a problem
HEADERS = {0: "headerless", 1: "schema", 2: "dictionary batch", 3: "record batch", 4: "tensor", 5: "sparse tensor"}
#: a compressed buffer whose prefix is this was stored uncompressed (Arrow's format)
UNCOMPRESSED = -1
#: the most metadata one message may carry. The store's are 448 bytes (its schema) and 480
#: (a batch of its 7 columns, whatever its rows). Arrow builds what a flatbuffer references
#: as often as it is referenced, and its verifier lets a table be visited 8 times per byte:
#: a schema whose fields' children point many times at one field named by one long string
#: built GBs from 16 KiB (the review's nested alias). At 2 KiB that is at most ~32 MB
METADATA_MAX = 2 << 10
#: the encapsulated format's continuation marker (Arrow 0.15+; before it, the length alone)
CONTINUATION = b"\xff\xff\xff\xff"
#: ``MetadataVersion.V5`` (Schema.fbs), what Arrow 1.0 and later write. Arrow still reads a V4
#: record batch as compressed when its custom metadata says ``ARROW:experimental_compression``
#: and it has no ``BodyCompression``: such a batch is refused, not counted by its stored sizes.
METADATA_V5 = 4


class _Table:
    """One flatbuffer table: ``buf`` at ``pos`` with its vtable, every read bounded."""

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos
        vtable = pos - _i32(buf, pos)
        self.vsize = _u16(buf, vtable)
        self.vtable = vtable
        if self.vsize < 4 or vtable + self.vsize > len(buf):
            raise ValueError("a table's vtable lies outside the metadata")

    def _field(self, i: int) -> int | None:
        at = 4 + 2 * i
        if at + 2 > self.vsize:
            return None
        off = _u16(self.buf, self.vtable + at)
        return self.pos + off if off else None

    def scalar(self, i: int, fmt: str, default: int) -> int:
        at = self._field(i)
        return default if at is None else _unpack(fmt, self.buf, at)

    def table(self, i: int) -> _Table | None:
        at = self._field(i)
        return None if at is None else _Table(self.buf, at + _u32(self.buf, at))

    def structs(self, i: int, size: int) -> list[bytes | memoryview]:
        """A vector of structs of ``size`` bytes each."""
        at = self._field(i)
        if at is None:
            return []
        start = at + _u32(self.buf, at)
        n = _u32(self.buf, start)
        end = start + 4 + n * size
        if end > len(self.buf):
            raise ValueError("a vector runs past the metadata")
        return [self.buf[start + 4 + k * size:start + 4 + (k + 1) * size] for k in range(n)]


def _unpack(fmt: str, buf: bytes | memoryview, at: int) -> int:
    size = struct.calcsize(fmt)
    if at < 0 or at + size > len(buf):
        raise ValueError("an offset points outside the metadata")
    return struct.unpack_from(fmt, buf, at)[0]


def _u16(buf: bytes | memoryview, at: int) -> int:
    return _unpack("<H", buf, at)


def _i32(buf: bytes | memoryview, at: int) -> int:
    return _unpack("<i", buf, at)


def _u32(buf: bytes | memoryview, at: int) -> int:
    return _unpack("<I", buf, at)


def message_type(metadata: bytes | memoryview) -> int:
    """The ``MessageHeader`` union member of a message (3: a record batch); ValueError where
    its metadata cannot be read."""
    return _Table(metadata, _u32(metadata, 0)).scalar(1, "<B", 0)


def decoded_size(metadata: bytes | memoryview, body: bytes | memoryview) -> int:
    """The bytes a record batch message's buffers decode to (their sum). ``metadata``: the
    message's flatbuffer (``pyarrow.ipc.Message.metadata``); ``body``: its body. A message
    that is not a record batch decodes to nothing here (the caller decides what it takes);
    a buffer outside the body, or a metadata this cannot read, is a ``ValueError``."""
    message = _Table(metadata, _u32(metadata, 0))
    if message.scalar(1, "<B", 0) != RECORD_BATCH:             # header_type
        return 0
    if message.scalar(0, "<h", 0) < METADATA_V5:                # version
        raise ValueError("a message of metadata version V4 or older: its compression may be named "
                         "in its custom metadata, which this does not read")
    batch = message.table(2)                                     # header: RecordBatch
    if batch is None:
        raise ValueError("a record batch message without its header")
    compressed = batch.table(3) is not None                      # compression: BodyCompression
    view = memoryview(body)
    total = 0
    for entry in batch.structs(2, 16):                           # buffers: [Buffer {offset, length}]
        offset, length = struct.unpack("<qq", entry)
        if offset < 0 or length < 0 or offset + length > len(view):
            raise ValueError("a buffer lies outside the message's body")
        if not compressed or length == 0:
            total += length
            continue
        if length < 8:
            raise ValueError("a compressed buffer shorter than its length prefix")
        claimed = struct.unpack_from("<q", view, offset)[0]
        if claimed == UNCOMPRESSED:
            total += length - 8
        elif claimed < 0:
            raise ValueError("a compressed buffer claims a negative length")
        else:
            total += claimed
    return total


class Truncated(ValueError):
    """The file ends inside a message: a writer killed mid-write (``kill -9``), not a forgery."""


def next_message(fh: IO[bytes], size: int) -> tuple[bytes, bytes] | None:
    """The next message of an IPC stream read from ``fh`` (a file of ``size`` bytes), as its
    metadata and its body, read here so that Arrow is handed only bytes that were checked;
    None at the stream's end (its end marker, or the file's). A message cut short (a body
    longer than what is left of the file among them) is ``Truncated``; metadata past
    ``METADATA_MAX``, or metadata this cannot read, a ValueError.
    The stream's framing: ``0xFFFFFFFF``, then the metadata's length (int32), the metadata
    (a flatbuffer ``Message``, padded to 8 bytes), then ``bodyLength`` bytes of body; before
    Arrow 0.15 the length came without the marker (both are read, as Arrow reads them)."""
    head = fh.read(4)
    if not head:
        return None
    if head == CONTINUATION:
        head = fh.read(4)
    if len(head) < 4:
        raise Truncated("the file ends inside a message's length")
    (length,) = struct.unpack("<i", head)
    if length == 0:
        return None
    if not 0 < length <= METADATA_MAX:
        raise ValueError(f"a message's metadata of {length} bytes (at most {METADATA_MAX} read)")
    metadata = fh.read(length)
    if len(metadata) < length:
        raise Truncated("the file ends inside a message's metadata")
    body_length = _Table(metadata, _u32(metadata, 0)).scalar(3, "<q", 0)      # Message.bodyLength
    if body_length < 0:
        raise ValueError(f"a message's body of {body_length} bytes")
    if body_length > size - fh.tell():
        raise Truncated(f"the file ends inside a message's body ({body_length} bytes claimed)")
    body = fh.read(body_length)
    if len(body) < body_length:
        raise Truncated("the file ends inside a message's body")
    return metadata, body


def framed(metadata: bytes, body: bytes) -> bytes:
    """The message as one encapsulated buffer (``pyarrow.ipc.read_message`` reads it)."""
    return CONTINUATION + struct.pack("<i", len(metadata)) + metadata + body
