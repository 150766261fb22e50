"""joblib files: array bytes inline in the pickle stream, optionally compressed.

``joblib.dump`` writes each numpy array as a ``NumpyArrayWrapper`` object followed by
the array's raw bytes (or, for object arrays, a nested pickle that ``joblib.load``
unpickles). To walk on after an array the scanner must know its byte size, which it
reads from the wrapper's state (shape and dtype) without importing numpy.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import math
import re
import zlib
from typing import TYPE_CHECKING, BinaryIO

from hpcml.scan import dtypes
from hpcml.scan.formats import ScanContent, ScanFormat
from hpcml.scan.picklewalk import Call, Event, NeedTracking, PickleError, PickleWalker, Ref, looks_like_pickle

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

WRAPPER = "joblib.numpy_pickle.NumpyArrayWrapper"
#: joblib < 0.10 kept each array in a file of its own beside the pickle, named in this wrapper
FILE_WRAPPER = "joblib.numpy_pickle_compat.NDArrayWrapper"
HOOKS = frozenset({WRAPPER, FILE_WRAPPER})
#: a tracked dict keeps its first 64 items: one that may hold more is not read whole
FULLY_TRACKED = 60
UNREADABLE = object()
_DESCR = re.compile(r"^[<>|=]?([a-zA-Z]+)(\d+)$")


def _dtype(dtype) -> tuple[int, bool]:
    """(itemsize, has objects) of a pickled ``numpy.dtype(descr, False, True)`` + state, as
    numpy and then joblib compute them: the state was checked at its BUILD to be one numpy
    writes for the description (``scan.dtypes``), so its flags and size are numpy's own."""
    if type(dtype) is not Call or type(dtype.func) is not Ref or dtype.func.dotted != "numpy.dtype" \
            or not dtype.args or type(dtype.args[0]) is not str:
        raise PickleError("joblib array wrapper: its dtype is not a numpy.dtype(...) call")
    descr, state = dtype.args[0], dtype.state
    has_object = dtypes.has_object(dtype)
    if has_object is None:
        raise PickleError(f"joblib array wrapper: cannot read dtype '{descr}'")
    elsize = state[5] if type(state) is tuple and len(state) > 5 and type(state[5]) is int else -1
    if elsize <= 0:
        m = _DESCR.match(descr)
        if not m:
            raise PickleError(f"joblib array wrapper: cannot size dtype '{descr}'")
        elsize = int(m.group(2))
    return elsize, has_object


def _opened_file(walker: PickleWalker, obj: Call, state) -> None:
    """``NDArrayWrapper.read`` runs ``np.load(join(dirname, filename), allow_pickle=True)``:
    the file it names is part of what the load runs (``pickles`` scans it)."""
    if not walker.track:
        raise NeedTracking
    parts = state if type(state) is tuple and len(state) == 2 else (state,)     # (__dict__, slots)
    name: object = None
    for part in parts:
        if part is None or part == {}:
            continue
        if type(part) is not dict or len(part) >= FULLY_TRACKED:   # built at load time, or not followed whole
            name = UNREADABLE
            break
        name = part.get("filename", name)
    if name is None and type(obj.func) is Ref and obj.func.dotted == FILE_WRAPPER and type(obj.args) is tuple \
            and obj.args:
        name = obj.args[0]                              # NDArrayWrapper(filename, subclass): __init__ set it
    here = walker.r.base + walker.r.pos - 1
    if type(name) is not str:
        walker.result.events.append(Event(
            "argument-dangerous", "joblib.numpy_pickle_compat", "NDArrayWrapper", here, "BUILD",
            "opens a file whose name hpcml cannot read from the pickle (np.load with allow_pickle=True)"))
        return
    walker.result.opened.append((name, here))


def on_build(walker: PickleWalker, obj, state) -> None:
    """After BUILD of a wrapper: skip its array bytes, or walk its nested object pickle;
    for the old file wrapper, name the file it opens."""
    if type(obj) is not Call:
        return
    if walker._built_class(obj) == FILE_WRAPPER:
        _opened_file(walker, obj, state)
        return
    if type(obj.func) is not Ref or obj.func.dotted != WRAPPER:
        return
    if not walker.track:
        raise NeedTracking
    if type(state) is not dict:
        raise PickleError("joblib array wrapper without a readable state")
    shape = state.get("shape")
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        raise PickleError(f"joblib array wrapper: bad shape {shape!r}")
    itemsize, has_object = _dtype(state.get("dtype"))
    r = walker.r
    here = r.base + r.pos
    if has_object:
        inner = PickleWalker(r.fh, here, r.end, on_build=on_build, track_containers=walker.track,
                             build_hooks=walker.build_hooks).walk()
        walker.result.events.extend(inner.events)
        walker.result.nested.extend(inner.nested)
        if inner.error:
            raise PickleError(f"object array pickle at offset {here}: {inner.error}")
        r.seek_to(inner.end)
        return
    if state.get("numpy_array_alignment_bytes") is not None:
        if not r.fill(1):
            raise PickleError("truncated in a joblib array's padding")
        pad = r.buf[r.pos]
        r.pos += 1
        r.skip(pad)
    r.skip(math.prod(shape) * itemsize)


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


COMPRESSED = (
    (b"\x1f\x8b", "gzip", lambda fh: gzip.GzipFile(fileobj=fh)),
    (b"BZh", "bz2", lambda fh: bz2.BZ2File(fh)),
    (b"\xfd7zXZ\x00", "xz", lambda fh: lzma.LZMAFile(fh)),
    (b"\x5d\x00\x00", "lzma", lambda fh: lzma.LZMAFile(fh, format=lzma.FORMAT_ALONE)),
    (b"\x04\x22\x4d\x18", "lz4", _lz4),
)


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
    return compression(head) is not None and not looks_like_pickle(head)


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    """A compressed stream (joblib's, or a gzipped pickle): walk the pickles inside."""
    from hpcml.scan import pickles  # which imports this module
    found = compression(fh.read(16))
    fh.seek(0)
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
    from hpcml.scan.scanner import MAX_ARCHIVE_DEPTH
    if depth >= MAX_ARCHIVE_DEPTH:
        fs.error(f"archives nested more than {MAX_ARCHIVE_DEPTH} deep", member)
        return
    fs.set_format(f"tar ({kind}-compressed)")
    scan_tar(fs, stream, member, depth, scan_content, stream=True)


FORMAT = ScanFormat(_looks_compressed, _scan)
