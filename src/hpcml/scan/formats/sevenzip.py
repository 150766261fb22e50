"""7z archives: recognised so that they are refused by name, not scanned as junk."""

from __future__ import annotations

from typing import BinaryIO

from hpcml.scan.context import FileScan
from hpcml.scan.formats import ScanContent, ScanFormat

SEVEN_ZIP = b"7z\xbc\xaf\x27\x1c"


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    fs.set_format("7z")
    fs.error("7z archives are not supported: unpack and scan the contents", member)


FORMAT = ScanFormat(lambda head, size, name: head.startswith(SEVEN_ZIP), _scan)
