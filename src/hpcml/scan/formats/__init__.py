"""One module per file format that a scan recognises by content.

Each module declares a ``FORMAT``: how to recognise the format from the first 512 bytes
(``looks_like(head, size, name)``) and how to scan it. ``FORMATS`` lists them in the
order they are tried; the first that recognises a file scans it, and a file none
recognises is walked as a pickle (hpcml.scan.scanner). Formats hpcml recognises but does
not read (HDF5, GGUF, ONNX, TF SavedModel) judge what they can (what runs code on load)
and add a ``not-scanned`` finding for the rest (``FileScan.not_scanned``). A site package adds a format
through the ``hpcml.scan_formats`` entry-point group (a ``ScanFormat``); plug-ins are
tried after the built-ins. A format recognised by what lies beside a file rather than by
its content (hpcml.ckpt's shards, by their index) sets ``claims``; it is asked first, and it
may also say how ``safe_load`` reads what it claims (``load``). hpcml.ckpt registers its own
this way (pyproject's entry point), so scan does not depend on ckpt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from hpcml.registry import Registry

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan
    from hpcml.scan.policy import Policy

#: scans an archive member by content: (fs, fh, size, member, name, depth)
#: archives inside archives are followed this deep, then the file is an error
MAX_ARCHIVE_DEPTH = 4
ScanContent = Callable[["FileScan", BinaryIO, int, str, str, int], None]


@dataclass(frozen=True)
class ScanFormat:
    """``looks_like(head, size, name)``; ``scan(fs, fh, size, member, name, depth, scan_content)``
    reads ``size`` bytes of ``fh`` from its start, naming findings under ``member``."""

    looks_like: Callable[[bytes, int, str], bool]
    scan: Callable[[FileScan, BinaryIO, int, str, str, int, ScanContent], None]
    #: holds members, each handed to ``scan_content`` one level deeper (nesting is bounded)
    archive: bool = False
    #: recognises a file or directory by what lies beside it, before any content is read:
    #: returns what ``scan_claimed`` and ``load`` need (the claim), or None
    claims: Callable[[Path], Any] | None = None
    #: ``(fs, fh, size, claim)``: scans a claimed regular file
    scan_claimed: Callable[[FileScan, BinaryIO, int, Any], None] | None = None
    #: ``(path, claim, policy, map_location, rank)`` -> the object ``safe_load`` returns
    load: Callable[[Path, Any, Policy, Any, int | None], Any] | None = None


def claimed(path: Path) -> tuple[ScanFormat, Any] | None:
    """The format that claims ``path`` by what lies beside it, with its claim, or None."""
    for name in FORMATS:
        fmt = FORMATS.get(name)
        if fmt.claims is not None:
            claim = fmt.claims(path)
            if claim is not None:
                return fmt, claim
    return None


FORMATS: Registry[ScanFormat] = Registry("scan format", "hpcml.scan_formats", {
    "zip": f"{__name__}.zipped:FORMAT",
    "tar": f"{__name__}.tarred:FORMAT",
    "numpy-npy": f"{__name__}.npy:FORMAT",
    "safetensors": f"{__name__}.safetensors:FORMAT",
    "7z": f"{__name__}.sevenzip:FORMAT",
    "compressed": f"{__name__}.joblib:FORMAT",          # gzip, bz2, xz, lzma, lz4, zlib streams
    # recognised, judged for what runs code on load, never "safe": hpcml does not read them
    "hdf5": f"{__name__}.hdf5:FORMAT",                  # Keras .h5 (its model config judged)
    "gguf": f"{__name__}.gguf:FORMAT",                  # its chat templates judged
    "onnx": f"{__name__}.onnx:FORMAT",                  # external-data paths, custom domains
    "tf-savedmodel": f"{__name__}.savedmodel:FORMAT",   # by name: saved_model.pb, keras_metadata.pb
    "mds": f"{__name__}.mds:FORMAT",                    # MosaicML streaming, by its index.json: encodings judged
})
