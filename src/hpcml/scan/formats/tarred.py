"""Tar archives: WebDataset shards (samples may be ``.pyd``/``.pickle``) and PyTorch's
oldest checkpoint format (a tar with ``pickle``, ``tensors`` and ``storages`` members).

Members are recognised by content like zip members; tar is read as a stream, so a
member is scanned from the archive file itself, bounded to its byte range.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from typing import BinaryIO, cast

from hpcml.scan.context import FileScan
from hpcml.scan.formats import ScanContent, ScanFormat


def looks_like(head: bytes) -> bool:
    """POSIX ustar or GNU tar magic at offset 257 (the head must hold 263 bytes)."""
    return head[257:262] == b"ustar"


def scan_tar(fs: FileScan, fh: BinaryIO, member: str, depth: int,
             scan_member: Callable[[FileScan, BinaryIO, int, str, str, int], None]) -> None:
    try:
        tf = tarfile.open(fileobj=fh, mode="r:")
    except (tarfile.TarError, OSError, EOFError) as exc:
        fs.error(f"not a readable tar archive: {exc}", member)
        return
    fs.set_format("tar")
    try:
        for info in tf:
            if not info.isfile():
                continue
            where = f"{member}!{info.name}" if member else info.name
            data = tf.extractfile(info)
            if data is None:
                continue
            with data:
                # typeshed types a member as IO[bytes]; the scanner's callback takes BinaryIO
                scan_member(fs, cast(BinaryIO, data), info.size, where, info.name, depth + 1)
    except (tarfile.TarError, OSError, EOFError) as exc:
        fs.error(f"cannot read the tar archive: {exc}", member)


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    scan_tar(fs, fh, member, depth, scan_content)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head), _scan, archive=True)
