"""MosaicML streaming (MDS) shards: recognised by the ``index.json`` beside them, judged by
its column encodings, never read. Streaming's ``pkl`` encoding unpickles a column on
read, so a shard with one (or with an encoding not known here) is ``not-scanned``; a shard
whose columns are all data (``str``, ``int32``, ``ndarray:...``, ``jpeg``, ``json``, ...)
runs no code on load and is ``safe`` once its bytes, read whole as ``torch.load`` or
``pickle.load`` would read them, are no pickle either.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from hpcml.files import load_json_bounded
from hpcml.scan.context import FileScan
from hpcml.scan.formats import ScanFormat

INDEX_MAX = 64 << 20
#: streaming's encodings that decode without running code (ints, floats, text, images, JSON,
#: raw arrays); ``pkl`` unpickles, and one not named here may be a site's own: not-scanned
DATA_ENCODINGS = {"bytes", "str", "int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                  "uint64", "float16", "float32", "float64", "str_int", "str_float", "str_decimal", "pil",
                  "jpeg", "jpegarray", "jpeg_array", "png", "json", "ndarray"}


def claims(path: Path) -> dict | None:
    """The shard's entry in an ``index.json`` of its directory or the two above, or None."""
    if ".mds" not in path.name:
        return None
    for up in range(3):
        root = path.parents[up] if up < len(path.parents) else None
        if root is None or not (root / "index.json").is_file():
            continue
        try:
            doc = load_json_bounded(root / "index.json", INDEX_MAX)
        except (OSError, ValueError):
            continue
        rel = path.relative_to(root).as_posix()
        for shard in doc.get("shards") or [] if isinstance(doc, dict) else []:
            if not isinstance(shard, dict) or shard.get("format") != "mds":
                continue
            names = {(shard.get(k) or {}).get("basename") for k in ("raw_data", "zip_data")
                     if isinstance(shard.get(k), dict)}
            if rel in names:
                return shard
    return None


def _scan_claimed(fs: FileScan, fh: BinaryIO, size: int, shard: dict) -> None:
    fs.set_format("mds")
    names = shard.get("column_names") or []
    encodings = shard.get("column_encodings") or []
    cols = [f"{n}: {e}" for n, e in zip(names, encodings)]
    pickled = [f"{n} ({e})" for n, e in zip(names, encodings) if str(e).split(":")[0] not in DATA_ENCODINGS]
    if pickled or len(names) != len(encodings):
        fs.not_scanned(f"MDS column(s) {', '.join(pickled) or '(names and encodings differ)'}",
                       "pickle-encoded (pkl: mosaicml-streaming unpickles it on read) or an encoding hpcml does "
                       "not know; hpcml does not read MDS samples")
        return
    fs.note(f"MosaicML MDS shard (index.json beside it): columns {', '.join(cols) or '-'}; every encoding decodes "
            "as data, none unpickles")
    from hpcml.scan.scanner import scan_as_loaders_read_it
    scan_as_loaders_read_it(fs, fh, size)        # a pickle named like a shard is still a pickle to torch.load


FORMAT = ScanFormat(lambda head, size, name: False, lambda *a: None, claims=claims, scan_claimed=_scan_claimed)
