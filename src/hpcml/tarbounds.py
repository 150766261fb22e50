"""Tar members whose size the archive can hold, so a hostile header cannot hang a reader.

A tar header's size field is the attacker's: a PAX ``size`` record or a GNU base-256 size
can claim 10**20 bytes in a 10 KB file. ``tarfile`` skips a member's data by seeking to the
end it claims: in stream mode (``r|``, every compressed tar) that seek reads 10 KB at a
time and keeps calling ``read`` after the end of the data, so it spins for ever; on a real
file it raises ``ValueError`` for an offset past 2**63. An extended header (PAX, a GNU long
name) is read whole into memory, however large it claims to be. Both readers of tar shards
in hpcml (``hpcml data index`` and the scanner) therefore open them with ``open_tar`` and
walk them with ``checked_members``:

- an extended header may claim at most ``EXTENDED_MAX`` bytes (real ones hold a few
  hundred: a long name, a size, an mtime);
- where the archive's length is known (a plain tar on disk), each member's padded end is
  checked against it before the member is handed out;
- where it is not (a decompressed stream: no compression ratio bounds it usefully, bzip2's
  reaches millions), the rest of each member is read here in large chunks, as tarfile
  would have read it anyway, and a short read ends the walk. That costs nothing extra and
  stops at the stream's real end, whatever the header claims.

A sparse member (GNU ``S``, or PAX ``GNU.sparse.*``) is refused too: tarfile hands out its
data through the sparse map, while a reader of offsets (hpcml's shard reader, by the index)
reads the bytes stored, and a map can put any of those where no read of tarfile's reaches.
The scanner would judge one file and the loader return another. No shard writer makes one.

Every problem is a ``tarfile.ReadError`` naming the member, so each caller reports it
through the path it already has for an unreadable tar.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import IO, BinaryIO

#: how much of a member's data one read takes when skipping it in a stream
SKIP_CHUNK = 4 << 20
#: the most an extended header (PAX records, a GNU long name or link) may claim: generous,
#: real ones are a few hundred bytes, and tarfile reads one whole into memory
EXTENDED_MAX = 16 << 20
_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
             tarfile.GNUTYPE_LONGLINK)


class BoundedTarInfo(tarfile.TarInfo):
    """A header that refuses an extended header larger than ``EXTENDED_MAX`` as it is parsed,
    before tarfile reads that many bytes into memory."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> BoundedTarInfo:
        obj = super().frombuf(buf, encoding, errors)
        if obj.type in _EXTENDED and obj.size > EXTENDED_MAX:
            raise tarfile.ReadError(f"an extended header (type {obj.type.decode('ascii', 'replace')!r}) "
                                    f"claims {obj.size:,} bytes, more than the {EXTENDED_MAX:,} allowed")
        return obj


def open_tar(fileobj: IO[bytes], mode: str) -> tarfile.TarFile:
    """``tarfile.open`` with headers parsed by ``BoundedTarInfo``; walk it with ``checked_members``.
    A first header tarfile cannot parse is a ``ReadError``, as in ``checked_members``."""
    try:
        return tarfile.open(fileobj=fileobj, mode=mode, tarinfo=BoundedTarInfo)  # type: ignore[call-overload]
    except (ValueError, OverflowError) as exc:
        raise tarfile.ReadError(f"a malformed first header: {exc}") from None


def file_room(fh: BinaryIO) -> int:
    """The absolute offset where ``fh`` ends (tarfile's offsets are absolute in the file it
    is given); ``fh``'s position is kept."""
    here = fh.tell()
    try:
        return fh.seek(0, io.SEEK_END)
    finally:
        fh.seek(here)


def checked_members(tf: tarfile.TarFile, *, room: int | None) -> Iterator[tarfile.TarInfo]:
    """The members of ``tf``, each one's size checked against what the archive can hold.

    ``room``: the offset where the archive's bytes end, when known; checked before a member is
    handed out. ``None``: ``tf`` is a stream of unknown length; after the caller is done with
    a member (it may have read its data), the rest of the data is read here, and a stream that
    ends first raises. A header tarfile cannot parse (a garbled number) is a ``ReadError`` too,
    not a ``ValueError`` from deep inside tarfile, and each error names the member before it.
    """
    members = iter(tf)
    previous = ""
    while True:
        try:
            info = next(members)
        except StopIteration:
            return
        except tarfile.TarError as exc:
            raise tarfile.ReadError(f"{exc} (after member {previous!r})" if previous else str(exc)) from None
        except (ValueError, OverflowError) as exc:
            after = f" after member {previous!r}" if previous else ""
            raise tarfile.ReadError(f"a malformed header{after}: {exc}") from None
        if info.issparse() or info.type == tarfile.GNUTYPE_SPARSE or any(
                k.startswith("GNU.sparse.") for k in info.pax_headers):
            raise tarfile.ReadError(f"member {info.name!r} is sparse: its data is not the bytes stored "
                                    "(a reader of the tar and a reader of its offsets would see different bytes)")
        end = tf.offset                     # where tarfile will look for the next header
        if room is not None and end > room:
            raise tarfile.ReadError(f"member {info.name!r} claims {_claimed(info, end):,} bytes of data, "
                                    f"past the end of the archive ({room:,} bytes)")
        yield info
        if room is None:
            _skip_to(tf, info, end)
        previous = info.name


def _claimed(info: tarfile.TarInfo, end: int) -> int:
    """The data size the header claims (for a sparse member: the bytes stored, not its real size)."""
    return info.size if not info.issparse() else end - info.offset_data


def _skip_to(tf: tarfile.TarFile, info: tarfile.TarInfo, end: int) -> None:
    """Read ``tf``'s stream up to ``end`` in large chunks; raise when it ends before."""
    stream = tf.fileobj
    assert stream is not None
    while (left := end - stream.tell()) > 0:
        if not stream.read(min(left, SKIP_CHUNK)):
            raise tarfile.ReadError(f"member {info.name!r} claims {_claimed(info, end):,} bytes of data, "
                                    f"but the archive ends after {stream.tell():,} bytes")
