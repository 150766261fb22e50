"""Zip archives: PyTorch checkpoints, ``.npz``, and any zip with pickles inside.

Every member is recognised by its content, not its name: loaders such as ``torch.load``
pick members by position or suffix, and a malicious member can hide behind an odd name
or extension. The only members skipped unread are PyTorch's tensor storages
(``<archive>/data/<n>``), which torch copies as raw bytes and never unpickles.
"""

from __future__ import annotations

import io
import re
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO, cast

from hpcml.scan.context import FileScan
from hpcml.scan.formats import ScanContent, ScanFormat, keras
from hpcml.scan.model import Verdict

_STORAGE = re.compile(r"(^|/)data/\d+$")
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
#: general-purpose flag bits Python's zipfile refuses and torch's reader (miniz) ignores
TRICK_FLAGS = {0x1: "the 'encrypted' flag", 0x20: "the 'patched data' flag (0x20)",
               0x40: "the 'strong encryption' flag (0x40)"}
#: the member whose presence makes torch.load a torch.jit.load (``_is_torchscript_zip``)
TORCHSCRIPT = "constants.pkl"
#: the finding's name (``hpcml.scan.report.advice`` says what to do about it)
TORCHSCRIPT_FINDING = "TorchScript archive"
#: the ZIP64 end-of-central-directory locator, and the ZIP64 end record torch writes
LOCATOR_SIZE, ZIP64_END_SIZE = 20, 56
#: members up to this size are read whole (CRC checked before the scan); larger ones stream
WHOLE = 64 * 2**20
#: the most a re-read deflated member is inflated to (on disk beyond WHOLE): a larger claim
#: is an error, not a disk filled by a zip bomb
MAX_INFLATE = 2**30


def looks_like(head: bytes) -> bool:
    return head[:4] in ZIP_MAGIC


def scan_zip(fs: FileScan, fh: BinaryIO, member: str, depth: int,
             scan_member: Callable[[FileScan, BinaryIO, int, str, str, int], None]) -> None:
    """Open the central directory and hand each member to ``scan_member``."""
    try:
        zf = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        fs.error(f"not a readable zip archive: {exc}", member)
        return
    with zf:
        end = _end_record(fh)           # read once: both checks below judge it
        shift = _prepended(zf, end)
        if shift:      # Python adds the shift to every offset; torch's reader (miniz) does not
            fs.error(f"the central directory is {shift} bytes from where the archive says: Python's "
                     "zipfile and torch.load would read different members (a scanner bypass)", member)
            return
        moved = _zip64_moved(end, fh)
        if moved:
            fs.error(moved, member)
            return
        infos = zf.infolist()
        doubled = next((i for i in infos if _zip64_fields(i.extra) > 1), None)
        if doubled is not None:
            fs.error(f"member {doubled.filename!r} has more than one ZIP64 extra field: Python's zipfile reads "
                     "the last one's sizes and offset, torch.load (miniz) the first's, so each would read other "
                     "bytes (a scanner bypass)", member)
            return
        names = [i.filename for i in infos]
        torch_zip = any(n.endswith("/data.pkl") or n == "data.pkl" for n in names)
        script = [n for n in names if n == TORCHSCRIPT or n.endswith("/" + TORCHSCRIPT)]
        if script:          # torch.load hands such an archive to torch.jit.load: no pickle module, no allowlist
            where = f"{member}!{script[0]}" if member else script[0]
            fs.add(Verdict.UNKNOWN, TORCHSCRIPT_FINDING, "torch.load hands an archive with constants.pkl to "
                   "torch.jit.load, which runs the archive's own code (its code/ classes' __setstate__) outside "
                   "any allowlist", where, opcode="constants.pkl")
        keras_zip = keras.scan_archive(fs, zf, member)      # a Keras 3 .keras: config.json judged
        if torch_zip:
            fs.set_format("pytorch-zip")
        elif keras_zip:
            fs.set_format("keras")
        elif names and all(n.endswith(".npy") for n in names):
            fs.set_format("numpy-npz")
        else:
            fs.set_format("zip")
        if len(set(names)) != len(names):
            fs.note("the archive holds duplicate member names; every copy was scanned")
        storages = 0
        for info in infos:
            where = f"{member}!{info.filename}" if member else info.filename
            if info.is_dir():
                continue
            if torch_zip and _STORAGE.search(info.filename):
                storages += 1
                continue
            tricks = [why for bit, why in TRICK_FLAGS.items() if info.flag_bits & bit]
            if not tricks:
                try:
                    with zf.open(info) as mf:
                        if info.file_size <= WHOLE:   # a bad CRC shows before the scan starts
                            mf = io.BytesIO(mf.read())
                        # typeshed types a member as IO[bytes]; the callback takes BinaryIO
                        scan_member(fs, cast(BinaryIO, mf), info.file_size, where, info.filename,
                                    depth + 1)
                    continue
                except (zipfile.BadZipFile, NotImplementedError, RuntimeError) as exc:
                    tricks = [f"Python's zipfile refuses it ({exc})"]
                except (OSError, EOFError, ValueError) as exc:
                    fs.error(f"cannot read member: {exc}", where)
                    continue
            _scan_as_torch(fs, fh, info, where, depth, tricks, scan_member)
        if storages:
            fs.note(f"{storages} tensor storages (raw bytes, never unpickled)")


def _zip64_fields(extra: bytes) -> int:
    """How many ZIP64 extended-information fields (id 0x0001) a central directory entry has."""
    count, at = 0, 0
    while at + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, at)
        count += kind == 1
        at += 4 + length
    return count


def _end_record(fh: BinaryIO) -> list | None:
    """The end of central directory record as Python's zipfile reads it (its stated offset,
    unshifted; the ZIP64 record's values where there is one), or None."""
    try:
        return zipfile._EndRecData(fh) or None  # type: ignore[attr-defined]
    except (OSError, AttributeError, struct.error):
        return None


def _zip64_moved(end: list | None, fh: BinaryIO) -> str:
    """A reason to refuse where the ZIP64 locator points at another ZIP64 end record than
    the one right before it: Python's zipfile reads the one before the locator and ignores
    its offset, torch's reader (miniz) follows the offset, so each would read its own
    central directory (a scanner bypass). torch writes the record right before the locator."""
    if not end:
        return ""
    at = int(end[zipfile._ECD_LOCATION]) - LOCATOR_SIZE  # type: ignore[attr-defined]
    if at < 0:
        return ""
    try:
        fh.seek(at)
        locator = fh.read(LOCATOR_SIZE)
    except OSError:
        return ""
    if len(locator) < LOCATOR_SIZE or locator[:4] != b"PK\x06\x07":
        return ""
    _sig, _disk, offset, _disks = struct.unpack("<4sIQI", locator)
    if offset != at - ZIP64_END_SIZE:
        return (f"the ZIP64 locator points at byte {offset}, not at the ZIP64 end record before it (byte "
                f"{at - ZIP64_END_SIZE}): Python's zipfile and torch.load would read different central "
                "directories (a scanner bypass)")
    return ""


def _prepended(zf: zipfile.ZipFile, end: list | None) -> int:
    """How far the central directory lies from the offset the end record states: bytes
    prepended to the archive, by Python's reckoning (it shifts every member by that much)."""
    if not end:
        return 0
    return int(zf.start_dir) - int(end[zipfile._ECD_OFFSET])  # type: ignore[attr-defined]


def _scan_as_torch(fs: FileScan, fh: BinaryIO, info: zipfile.ZipInfo, where: str, depth: int,
                   tricks: list[str], scan_member: Callable[[FileScan, BinaryIO, int, str, str, int], None]) -> None:
    """A member Python's zipfile will not read, read the way torch's reader (miniz) does:
    where the central directory points, ignoring the CRC and the local header's name, which
    torch.load does too (torch 2.13 refuses the encryption and patch flag bits; other
    readers and versions need not), so the scan judges the pickle inside. Only a member
    whose bytes are not what they claim (encrypted, really) stays an error."""
    try:
        data = member_as_torch_reads(fh, info)
    except (OSError, ValueError, EOFError, NotImplementedError, zlib.error) as exc:
        fs.error(f"cannot read member: {exc}", where)
        return
    with data:
        head = data.read(8)
        data.seek(0)
        crc_ok = _crc_matches(data, info)
        if info.flag_bits & 0x1 and crc_ok is False and not _content(head):
            fs.error("encrypted member: cannot be scanned", where)
            return
        if crc_ok is False:
            tricks.append("a CRC that does not match its bytes")
        fs.note(f"{where}: scanned despite {' and '.join(tricks)}, a zip trick: Python's zipfile "
                "(and scanners built on it) refuses the member; torch.load ignores a CRC and the "
                "local header's name")
        scan_member(fs, data, info.file_size, where, info.filename, depth + 1)


def member_as_torch_reads(fh: BinaryIO, info: zipfile.ZipInfo) -> BinaryIO:
    """The member's bytes as miniz extracts them: from the local header the central
    directory names (its own name and extra fields skipped), stored or deflated; flags,
    CRC and the local header's name are not looked at."""
    fh.seek(info.header_offset)
    head = fh.read(30)
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise ValueError("no local header where the central directory points")
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    start = info.header_offset + 30 + name_len + extra_len
    if info.compress_type == zipfile.ZIP_STORED:
        fh.seek(start)
        return io.BytesIO(_read_exactly(fh, info.compress_size)) if info.compress_size <= WHOLE \
            else cast(BinaryIO, Window(fh, start, info.compress_size))
    if info.compress_type != zipfile.ZIP_DEFLATED:
        raise NotImplementedError(f"compression method {info.compress_type}, which torch cannot read either")
    out = tempfile.SpooledTemporaryFile(max_size=WHOLE)
    inflate = zlib.decompressobj(-15)
    fh.seek(start)
    left, made = info.compress_size, 0
    if info.file_size > MAX_INFLATE:
        raise ValueError(f"it claims {info.file_size} bytes inflated, more than the "
                         f"{MAX_INFLATE >> 30} GiB the scan inflates")
    while left and made <= info.file_size:
        chunk = fh.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the archive ends inside the member")
        left -= len(chunk)
        part = inflate.decompress(chunk, info.file_size + 1 - made)   # no zip bomb
        made += len(part)
        out.write(part)
    out.seek(0)
    return cast(BinaryIO, out)


def _read_exactly(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) < n:
        raise EOFError("the archive ends inside the member")
    return data


def _crc_matches(data: BinaryIO, info: zipfile.ZipInfo) -> bool | None:
    """Whether the member's bytes have the CRC it states; None when too large to check."""
    if info.file_size > WHOLE:
        return None
    crc = zlib.crc32(data.read())
    data.seek(0)
    return crc == info.CRC


def _content(head: bytes) -> bool:
    """Whether bytes start like something a loader reads: a pickle's PROTO, a zip, a .npy."""
    return (len(head) > 1 and head[0] == 0x80 and 0 < head[1] <= 5) or looks_like(head) \
        or head.startswith(b"\x93NUMPY")


class Window(io.RawIOBase):
    """A seekable read-only view of ``size`` bytes of ``fh`` from ``start`` (a large
    stored member, scanned in place)."""

    def __init__(self, fh: BinaryIO, start: int, size: int) -> None:
        self._fh, self._start, self._size, self._pos = fh, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buf: Any) -> int:   # io's writable buffer
        n = max(0, min(len(buf), self._size - self._pos))
        if not n:
            return 0
        self._fh.seek(self._start + self._pos)
        got = self._fh.readinto(memoryview(buf)[:n])  # type: ignore[attr-defined]
        self._pos += got or 0
        return got or 0


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    scan_zip(fs, fh, member, depth, scan_content)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head), _scan, archive=True)
