"""HDF5, and the Keras models saved in it (``model.save("m.h5")``, Keras 2's default).

hpcml does not read HDF5 (no h5py): a file is recognised by its signature, at byte 0 or,
behind a user block, at 512, 1024, 2048, ... (the offsets the HDF5 library searches); its
superblock is checked against the file's size; and the Keras model config, a JSON string
attribute of the root group, is found in the bytes and judged (``keras.scan_bytes``): a
``Lambda`` layer is ``dangerous``. The datasets (weights) are never read, so the file is at
best ``not-scanned``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from hpcml.scan.formats import ScanContent, ScanFormat, keras
from hpcml.scan.formats.bounded import ByteReader, Truncated

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

SIGNATURE = b"\x89HDF\r\n\x1a\n"
_SIZES = (2, 4, 8, 16, 32)
_UNDEFINED = -1


def looks_like(head: bytes) -> bool:
    return head.startswith(SIGNATURE)


def user_block(path: Path) -> int | None:
    """The offset of the HDF5 signature behind a user block (512 * 2**n), or None."""
    try:
        with open(path, "rb") as fh:
            if fh.read(len(SIGNATURE)) == SIGNATURE:       # no user block: recognised by content
                return None
            size = fh.seek(0, 2)
            offset = 512
            while offset + len(SIGNATURE) <= size:
                fh.seek(offset)
                if fh.read(len(SIGNATURE)) == SIGNATURE:
                    return offset
                offset *= 2
    except OSError:
        return None
    return None


def check_superblock(reader: ByteReader, base: int) -> str | None:
    """Why the superblock at ``base`` is not one the HDF5 library opens, or None."""
    head = reader.read(base, 16, "the superblock")
    version = head[8]
    if version in (0, 1):
        offsets, lengths = head[13], head[14]
        first = base + (24 if version == 0 else 28)
        eof_index = 2                          # base, free-space, end of file, driver info
    elif version in (2, 3):
        offsets, lengths = head[9], head[10]
        first = base + 12
        eof_index = 2                          # base, superblock extension, end of file, root
    else:
        return f"superblock version {version} is not one HDF5 defines (0 to 3)"
    if offsets not in _SIZES or lengths not in _SIZES:
        return f"superblock says addresses are {offsets} bytes and lengths {lengths} (HDF5 allows {_SIZES})"
    raw = reader.read(first, offsets * (eof_index + 1), "the superblock")
    eof = int.from_bytes(raw[eof_index * offsets:], "little")
    if eof != (1 << (8 * offsets)) - 1 and base + eof > reader.size:
        return (f"truncated: the superblock says the file ends at byte {base + eof}, "
                f"it has {reader.size} (the HDF5 library refuses it)")
    return None


def scan_hdf5(fs: FileScan, fh: BinaryIO, size: int, member: str, base: int = 0) -> None:
    try:
        problem = check_superblock(ByteReader(fh, size), base)
    except Truncated as exc:
        problem = f"the superblock is cut short ({exc})"
    if problem:
        fs.error(f"HDF5: {problem}", member)
    if base:
        fs.note(f"{member + ': ' if member else ''}HDF5 behind a {base}-byte user block "
                "(h5py and Keras open it all the same)")
    try:
        found = keras.scan_bytes(fs, fh, size, member)
    except Truncated as exc:
        fs.error(f"HDF5: {exc}", member)
        found = False
    fs.set_format("keras-h5" if found else "hdf5")
    if found:
        fs.not_scanned("HDF5 weights", "a Keras .h5 model: hpcml judged its model config, not the "
                       "HDF5 datasets, which it does not read", member)
    else:
        fs.not_scanned("HDF5 datasets", "hpcml does not read HDF5, and found no Keras model config in it",
                       member)


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    scan_hdf5(fs, fh, size, member)


def _scan_claimed(fs: FileScan, fh: BinaryIO, size: int, base: int) -> None:
    scan_hdf5(fs, fh, size, "", base)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head), _scan,
                    claims=lambda path: user_block(path) if path.is_file() else None,
                    scan_claimed=_scan_claimed)
