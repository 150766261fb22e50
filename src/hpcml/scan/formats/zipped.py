"""Zip archives: PyTorch checkpoints, ``.npz``, and any zip with pickles inside.

Every member is recognised by its content, not its name: loaders such as ``torch.load``
pick members by position or suffix, and a malicious member can hide behind an odd name
or extension. The only members skipped unread are PyTorch's tensor storages
(``<archive>/data/<n>``), which torch copies as raw bytes and never unpickles.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from typing import BinaryIO, cast

from hpcml.scan.context import FileScan
from hpcml.scan.formats import ScanContent, ScanFormat

_STORAGE = re.compile(r"(^|/)data/\d+$")
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


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
        infos = zf.infolist()
        names = [i.filename for i in infos]
        torch_zip = any(n.endswith("/data.pkl") or n == "data.pkl" for n in names)
        if torch_zip:
            fs.set_format("pytorch-zip")
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
            if info.flag_bits & 0x1:
                fs.error("encrypted member: cannot be scanned", where)
                continue
            try:
                with zf.open(info) as mf:
                    # typeshed types a member as IO[bytes]; the scanner's callback takes BinaryIO
                    scan_member(fs, cast(BinaryIO, mf), info.file_size, where, info.filename, depth + 1)
            except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError,
                    RuntimeError, ValueError) as exc:
                fs.error(f"cannot read member: {exc}", where)
        if storages:
            fs.note(f"{storages} tensor storages (raw bytes, never unpickled)")


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    scan_zip(fs, fh, member, depth, scan_content)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head), _scan, archive=True)
