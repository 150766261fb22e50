"""joblib's compressed files (and gzipped pickles, and compressed tars): the pickles inside
are walked as ``pickles`` walks any, with joblib's array hooks (``scan.joblibwalk``)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from typing import TYPE_CHECKING, BinaryIO

from hpcml.scan import pickles
from hpcml.scan.formats import MAX_ARCHIVE_DEPTH, ScanContent, ScanFormat
from hpcml.scan.joblibwalk import FILE_WRAPPER, HOOKS, WRAPPER, on_build  # noqa: F401 - their home before
from hpcml.scan.picklewalk import PickleError, looks_like_pickle

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

class _ZlibFile(io.RawIOBase):
    """A read-only, forward-seeking view of a raw zlib stream (joblib's ``compress=``)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.z, self.pos, self.pending = fh, zlib.decompressobj(), 0, b""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        out = [self.pending]
        have = len(self.pending)
        while n < 0 or have < n:
            raw = self.fh.read(1 << 20)
            if not raw:
                out.append(self.z.flush())
                have += len(out[-1])
                break
            chunk = self.z.decompress(raw)
            out.append(chunk)
            have += len(chunk)
        data = b"".join(out)
        data, self.pending = (data, b"") if n < 0 else (data[:n], data[n:])
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self.pos + offset
        if target < self.pos:
            self.fh.seek(0)
            self.z, self.pos, self.pending = zlib.decompressobj(), 0, b""
        while self.pos < target:
            if not self.read(min(target - self.pos, 1 << 22)):
                break
        return self.pos


def _lz4(fh: BinaryIO):
    try:
        import lz4.frame
    except ImportError:
        raise PickleError("an lz4-compressed file: install the lz4 package to scan it") from None
    return lz4.frame.LZ4FrameFile(fh)


#: joblib's own prefixes (``joblib.compressor``): what it decompresses, the scan does too.
#: bz2's "BZh" and zlib's header check (below) are narrower than joblib's "BZ" and 0x78,
#: but the decompressor refuses any other stream before its first byte, so joblib loads nothing
COMPRESSED = (
    (b"\x1f\x8b", "gzip", lambda fh: gzip.GzipFile(fileobj=fh)),
    (b"BZh", "bz2", lambda fh: bz2.BZ2File(fh)),
    (b"\xfd\x37\x7a\x58\x5a", "xz", lambda fh: lzma.LZMAFile(fh)),
    (b"\x5d\x00", "lzma", lambda fh: lzma.LZMAFile(fh, format=lzma.FORMAT_ALONE)),   # any dictionary size
    (b"\x04\x22\x4d\x18", "lz4", _lz4),
)
#: joblib < 0.10's compressed pickle: "ZF", its length in hex (19 characters), a zlib stream
ZFILE = b"ZF"


def _zfile(head: bytes) -> bool:
    """joblib's ``read_zfile`` header: what else starts with "ZF" makes ``int(.., 16)`` fail
    there, before anything is unpickled."""
    if not head.startswith(ZFILE):
        return False
    try:
        int(head[2:21].decode("ascii"), 16)
    except (UnicodeDecodeError, ValueError):
        return False
    return True


def compression(head: bytes):
    """(name, opener) for a compressed stream joblib can write, or None."""
    for magic, name, opener in COMPRESSED:
        if head.startswith(magic):
            return name, opener
    if len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib", _ZlibFile
    return None


#: a decompressed stream's length is unknown until it ends
END_UNKNOWN = 1 << 62


def _looks_compressed(head: bytes, size: int, name: str) -> bool:
    return (compression(head) is not None or _zfile(head)) and not looks_like_pickle(head)


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    """A compressed stream (joblib's, or a gzipped pickle): walk the pickles inside."""
    head = fh.read(32)
    fh.seek(0)
    if _zfile(head):
        # joblib.load(path) reads it with its compatibility unpickler, which restricts
        # nothing; hpcml neither walks nor loads that format (safe_load refuses it too)
        fs.set_format("joblib (ZF, joblib < 0.10)")
        fs.error("joblib < 0.10's compressed format (ZF): joblib.load runs it with an unrestricted unpickler, "
                 "and hpcml does not read it: load and dump it again with a current joblib where it is trusted",
                 member)
        return
    found = compression(head)
    if found is None:
        return
    kind, opener = found
    try:
        if _holds_tar(opener, fh):          # a .tar.gz / .tgz: WebDataset shards are often these
            _scan_tar(fs, opener(fh), kind, member, depth, scan_content)
            return
        stream = opener(fh)
        fs.set_format(f"{kind}-compressed")
        pickles.scan_stream(fs, stream, 0, END_UNKNOWN, member)
    except (OSError, EOFError, ValueError) as exc:
        fs.error(f"cannot decompress the {kind} stream: {exc}", member)
    except Exception as exc:  # noqa: BLE001 - decompressors raise their own types (lz4, zlib.error)
        fs.error(f"cannot decompress the {kind} stream: {exc}", member)


def _holds_tar(opener, fh: BinaryIO) -> bool:
    """Whether the decompressed stream starts with a tar header (reads 512 bytes of it)."""
    from hpcml.scan.formats.tarred import looks_like
    try:
        head = opener(fh).read(512)
    except Exception:  # noqa: BLE001 - decompressors raise their own types; the pickle path reports it
        head = b""
    fh.seek(0)
    return looks_like(head)


def _scan_tar(fs: FileScan, stream: BinaryIO, kind: str, member: str, depth: int,
              scan_content: ScanContent) -> None:
    from hpcml.scan.formats.tarred import scan_tar
    if depth >= MAX_ARCHIVE_DEPTH:
        fs.error(f"archives nested more than {MAX_ARCHIVE_DEPTH} deep", member)
        return
    fs.set_format(f"tar ({kind}-compressed)")
    scan_tar(fs, stream, member, depth, scan_content, stream=True)


FORMAT = ScanFormat(_looks_compressed, _scan)
