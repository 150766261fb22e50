"""Tar archives written by Python's tarfile, then hand-edited as an attacker would: a size
field rewritten (a PAX ``size`` record, a GNU base-256 number), the header checksum
recomputed so that every tar reader accepts the header.

Each archive holds ``a.txt`` (100 bytes) then ``b.txt`` (``B_SIZE`` bytes); the edit is on
``b.txt``. Given its true size, an edit leaves an archive that indexes like the original,
which is what tells a size check from a reader that refuses PAX or base-256 sizes.
"""

from __future__ import annotations

import io
import tarfile

BLOCK = 512
B_SIZE = 9000
HUGE = 10**20
MEMBERS = [("a.txt", b"a" * 100), ("b.txt", b"b" * B_SIZE)]


def written(fmt: int, members: list[tuple[str, bytes]] = MEMBERS, pax: dict[str, str] | None = None) -> bytes:
    """A tar as tarfile writes it; ``pax``: extra PAX records on ``b.txt`` (so it has a PAX header)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            if pax and name == "b.txt":
                info.pax_headers = dict(pax)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def header_offsets(raw: bytes) -> list[tuple[int, bytes, str]]:
    """``(offset, type, name)`` of every header, extended ones included, walked by hand."""
    out, pos = [], 0
    while pos + BLOCK <= len(raw) and raw[pos:pos + BLOCK].strip(b"\0"):
        hdr = raw[pos:pos + BLOCK]
        size = _size(hdr)
        out.append((pos, hdr[156:157], hdr[:100].split(b"\0", 1)[0].decode()))
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    return out


def _size(hdr: bytes) -> int:
    field = hdr[124:136]
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def with_checksum(hdr: bytearray) -> bytes:
    """The header with its checksum recomputed (spaces in the field while summing)."""
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr)


def base256_size(raw: bytes, offset: int, size: int) -> bytes:
    """``raw`` with the size field of the header at ``offset`` set to ``size`` in GNU base-256."""
    hdr = bytearray(raw[offset:offset + BLOCK])
    hdr[124:136] = b"\x80" + size.to_bytes(11, "big")
    return raw[:offset] + with_checksum(hdr) + raw[offset + BLOCK:]


def pax_record(key: str, value: str) -> bytes:
    """One PAX record, ``"<length> key=value\\n"``, its length counting itself."""
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n += 1
    return str(n).encode() + body


def rewrite_pax(raw: bytes, records: bytes) -> bytes:
    """``raw`` with the data of its first PAX header (``x``) replaced by ``records``: the
    header's size field and checksum rewritten, the data padded to whole blocks again."""
    offset = next(off for off, typ, _ in header_offsets(raw) if typ == tarfile.XHDTYPE)
    hdr = bytearray(raw[offset:offset + BLOCK])
    old = -(-_size(bytes(hdr)) // BLOCK) * BLOCK
    hdr[124:136] = b"%011o\0" % len(records)
    data = records + b"\0" * (-len(records) % BLOCK)
    return raw[:offset] + with_checksum(hdr) + data + raw[offset + BLOCK + old:]


def pax_size_tar(size: int) -> bytes:
    """``b.txt``'s PAX header says ``size`` (its ustar field keeps the true size)."""
    return rewrite_pax(written(tarfile.PAX_FORMAT, pax={"comment": "x"}), pax_record("size", str(size)))


def gnu_size_tar(size: int) -> bytes:
    """``b.txt``'s size field says ``size`` in GNU base-256."""
    raw = written(tarfile.GNU_FORMAT)
    offset = next(off for off, _, name in header_offsets(raw) if name == "b.txt")
    return base256_size(raw, offset, size)


def huge_extended_header(fmt: int) -> bytes:
    """A tar whose extended header before ``b...txt`` (PAX ``x``, or GNU ``L`` long name)
    claims ``HUGE`` bytes: tarfile would read that many into memory."""
    long = "d" * 150 + ".txt"
    raw = written(fmt, [("a.txt", b"a"), (long, b"b" * B_SIZE)])
    ext = tarfile.XHDTYPE if fmt == tarfile.PAX_FORMAT else tarfile.GNUTYPE_LONGNAME
    offset = next(off for off, typ, _ in header_offsets(raw) if typ == ext)
    return base256_size(raw, offset, HUGE)
