"""PyTorch's oldest checkpoint format (torch < 0.4): a tar whose ``storages`` and
``tensors`` members interleave pickles with raw bytes, read the way ``torch.load``'s
``legacy_load`` reads them (torch/serialization.py), so that every pickle torch unpickles
is one the scan judged: a pickle hidden after a storage's bytes is not "trailing bytes".

``storages``: a count, then per storage a pickle ``(key, location, storage_type)``, an
int64 element count and that many elements of the type's size; then the ``storage_views``
pickle. ``tensors``: a count, then per tensor a pickle ``(key, storage_id, type)``, an
int32 ndim, 4 bytes, ndim int64 sizes, ndim int64 strides and an int64 offset. Bytes the
layout cannot place are an error: never called safe.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from hpcml.scan.context import FileScan

#: the members torch's legacy_load reads this way
MEMBERS = ("storages", "tensors")
#: bytes per element of each storage type torch's legacy format names
ELEMENT = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
           "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
           "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "QUInt8Storage": 1, "QInt8Storage": 1,
           "QInt32Storage": 4, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "UntypedStorage": 1}
#: the most storages or tensors one member may claim (each costs a walk)
MAX_ITEMS = 1 << 20


class _Unplaced(ValueError):
    """Bytes the legacy layout cannot place."""


def scan_member(fs: FileScan, fh: BinaryIO, size: int, where: str, name: str) -> None:
    """Scan a legacy checkpoint's ``storages`` or ``tensors`` member as torch reads it."""
    try:
        offset = _layout(fs, fh, size, where, name)
    except _Unplaced as exc:
        fs.error(f"torch's legacy checkpoint member {name!r} does not read as torch reads it: {exc}", where)
        return
    if offset != size:
        fs.error(f"torch's legacy checkpoint member {name!r} has {size - offset} bytes after its layout ends", where)


def _layout(fs: FileScan, fh: BinaryIO, size: int, where: str, name: str) -> int:
    count, offset, _ = _pickle(fs, fh, 0, size, where)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_ITEMS:
        raise _Unplaced(f"its first pickle is not a count ({count!r})")
    for _ in range(count):
        _, offset, element = _pickle(fs, fh, offset, size, where, want_type=name == "storages")
        if name == "storages":
            numel = struct.unpack("<q", _read(fh, offset, 8, size))[0]
            if numel < 0:
                raise _Unplaced(f"a storage of {numel} elements")
            offset += 8 + numel * element
        else:
            ndim = struct.unpack("<i", _read(fh, offset, 4, size))[0]
            if ndim < 0:
                raise _Unplaced(f"a tensor of {ndim} dimensions")
            offset += 8 + 16 * ndim + 8
        if offset > size:
            raise _Unplaced("the member ends inside a storage or a tensor's shape")
    if name == "storages":                    # storage_views
        _, offset, _ = _pickle(fs, fh, offset, size, where)
    return offset


def _read(fh: BinaryIO, offset: int, n: int, size: int) -> bytes:
    fh.seek(offset)
    data = fh.read(n)
    if offset + n > size or len(data) < n:
        raise _Unplaced("the member ends inside a storage or a tensor's shape")
    return data


def _pickle(fs: FileScan, fh: BinaryIO, offset: int, size: int, where: str,
            want_type: bool = False) -> tuple[object, int, int]:
    """Judge the pickle at ``offset`` (as ``pickle.load`` reads it); its value, its end, and
    with ``want_type`` its storage type's element size (else 0)."""
    from hpcml.scan.pickles import scan_stream, walk_one
    res = walk_one(fh, offset, size, joblib=False)
    if res.error or not res.stopped:
        fs.events(res.events, where)
        raise _Unplaced(f"no pickle at byte {offset} ({res.error or 'no STOP'})")
    scan_stream(fs, fh, offset, res.end, where)          # judged as every pickle is, nested ones too
    if not want_type:
        return res.value, res.end, 0
    types = [ev.name for ev in res.events if ev.kind == "global" and ev.module == "torch" and ev.name in ELEMENT]
    if len(types) != 1:
        raise _Unplaced(f"the storage at byte {offset} names no storage type torch's legacy format has")
    return res.value, res.end, ELEMENT[types[0]]
