"""Tar archives: WebDataset shards (samples may be ``.pyd``/``.pickle``) and PyTorch's
oldest checkpoint format (a tar with ``pickle``, ``tensors`` and ``storages`` members).

A member is read as what its WebDataset field says it is, as webdataset's decoders read
it: ``.pyd``/``.pickle``/``.pth`` (and the other pickle names) as a pickle, ``.npy`` by
content, a ``.jpg`` as an image, ``.txt``/``.cls``/``.json`` as text, ``.mp``/``.ten``/
``.cbor`` and audio/video as data no decoder unpickles; ``x.gz`` as ``x``, decompressed.
A member whose bytes do not fit its field (a ``.jpg`` that is no image) and a field with no
known decoder are recognised by content, like zip members. A plain tar is read with
seeks, each member bounded to its byte range; a compressed one (``.tar.gz``, by
``hpcml.scan.formats.joblib``) is read as a stream, each member spooled (to disk past
``SPOOL_BYTES``), since a compressed stream cannot seek back. Either way a member's size
is checked against what the archive holds (``hpcml.tarbounds``), so a header claiming
10**20 bytes is an error naming the member, not a hang.

A shard with its index beside it (``hpcml data index``'s ``NAME.idx.json``, or the one a
manifest beside it names) is read by hpcml's shard reader through that index: each sample's fields by the index's names, at its offsets.
The scan compares the index with the members it walked, so that a field the scan judged as
data (``.mp``) cannot be handed out as another the loader decodes as a pickle (``.pyd``): an
index that names any member otherwise is an error, and the shard is not called safe.
"""

from __future__ import annotations

import gzip
import os
import re
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, cast

from hpcml import logs
from hpcml.scan.context import FileScan
from hpcml.scan.formats import ScanContent, ScanFormat, torchtar
from hpcml.tarbounds import checked_members, file_room, open_tar

log = logs.get(__name__)

SPOOL_BYTES = 64 << 20
KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")     # webdataset's base_plus_ext
IMAGE = {"jpg", "jpeg", "png", "gif", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "pbm", "pnm"}
TEXT = {"txt", "text", "transcript", "cls", "cls2", "class", "count", "index", "inx", "id", "json", "jsn",
        "jsonl", "csv", "tsv", "xml", "html", "caption", "md", "yaml", "yml"}
#: decoded by parsers that never run code (msgpack, tenbin, cbor, media decoders)
DATA = {"mp", "msgpack", "msg", "ten", "tb", "cbor", "wav", "flac", "mp3", "ogg", "opus", "m4a", "mp4",
        "webm", "avi", "mkv", "mov"}
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")


def looks_like(head: bytes) -> bool:
    """POSIX ustar or GNU tar magic at offset 257 (the head must hold 263 bytes)."""
    return head[257:262] == b"ustar"


def field_of(name: str) -> str:
    """The member's WebDataset field (``a/b.seg.png`` -> ``seg.png``), lower-cased; '' if none."""
    m = KEY_RE.match(name)
    return m.group(2).lower() if m else ""


def _is_image(head: bytes) -> bool:
    return head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP") or \
        (len(head) >= 2 and head[0:1] == b"P" and head[1:2] in b"123456")


def _is_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 4          # a character cut by the head's end
    return True


def data_kind(fh: BinaryIO, field: str) -> str | None:
    """'image', 'text' or 'data' when the member is what its field says, else None (then
    it is recognised by content). Reads at most 512 bytes (decompressed, for ``x.gz``)."""
    last = field.rsplit(".", 1)[-1]
    inner = field.rsplit(".", 2)[-2] if last == "gz" and "." in field else last
    if inner not in IMAGE | TEXT | DATA:
        return None
    fh.seek(0)
    try:
        head = gzip.GzipFile(fileobj=fh).read(512) if last == "gz" else fh.read(512)
    except (OSError, EOFError):
        return None
    finally:
        fh.seek(0)
    if inner in DATA:
        return "data"
    if inner in IMAGE:
        return "image" if _is_image(head) else None
    return "text" if _is_text(head) else None


def scan_tar(fs: FileScan, fh: BinaryIO, member: str, depth: int,
             scan_member: Callable[[FileScan, BinaryIO, int, str, str, int], None], *,
             stream: bool = False) -> None:
    """Scan each regular member; ``stream``: ``fh`` cannot seek back (a decompressed tar)."""
    try:
        tf = open_tar(fh, "r|" if stream else "r:")
    except (tarfile.TarError, OSError, EOFError) as exc:
        fs.error(f"not a readable tar archive: {exc}", member)
        return
    fs.set_format("tar")
    as_data: Counter[str] = Counter()
    walked: dict[int, tuple[str, int]] | None = {} if not member else None     # data offset -> (name, size)
    try:
        for info in checked_members(tf, room=None if stream else file_room(fh)):
            if stream:
                tf.members = []   # type: ignore[attr-defined]  # stream mode: keep no member list
            if not info.isfile():
                continue
            if walked is not None:
                walked[info.offset_data] = (info.name, info.size)
            where = f"{member}!{info.name}" if member else info.name
            data = tf.extractfile(info)
            if data is None:
                continue
            with data:
                # typeshed types a member as IO[bytes]; the scanner's callback takes BinaryIO
                body = cast(BinaryIO, data)
                if stream:
                    _spooled(fs, body, info, where, depth, scan_member, as_data)
                else:
                    _member(fs, body, info, where, depth, scan_member, as_data)
    except (tarfile.TarError, OSError, EOFError) as exc:
        fs.error(f"cannot read the tar archive: {exc}", member)
        walked = None
    if walked is not None:
        _check_index(fs, walked)
    if as_data:
        fields = ", ".join(f"{n} {f}" for f, n in sorted(as_data.items(), key=lambda kv: (-kv[1], kv[0]))[:8])
        more = f" and {len(as_data) - 8} more fields" if len(as_data) > 8 else ""
        fs.note(f"{member + ': ' if member else ''}{sum(as_data.values())} members read as the data their "
                f"WebDataset field names, no pickle: {fields}{more}")


def _indexes(shard: Path) -> list[Path]:
    """Every index hpcml's shard reader may take for ``shard``: the one ``hpcml data index``
    puts beside it, and the one a manifest beside it names for it (any plain name)."""
    from hpcml.data.index import index_name
    from hpcml.data.manifest import MANIFEST, load_manifest
    from hpcml.errors import UsageError
    found = [shard.with_name(index_name(shard.name))]
    if (shard.parent / MANIFEST).is_file():
        try:
            entries = load_manifest(shard.parent).shards
        except UsageError as exc:
            log.info("%s: the manifest beside it is not read: %s", shard, exc)
            entries = []
        for e in entries:
            named = Path(e.name) if Path(e.name).is_absolute() else shard.parent / e.name
            if named.name == shard.name and os.path.realpath(named) == os.path.realpath(shard):
                found.append(shard.parent / e.index)
    return [p for i, p in enumerate(found) if p.exists() and p not in found[:i]]


def _check_index(fs: FileScan, walked: dict[int, tuple[str, int]]) -> None:
    """The shard's indexes (``_indexes``) against the members the walk found: every field the
    reader would hand out must be the member the scan judged (webdataset's key and field of
    its name, its offset and size); else an error, naming the first that is not."""
    from hpcml.data.index import load_index
    from hpcml.data.wdsindex import base_plus_ext
    from hpcml.errors import UsageError
    for idx in _indexes(Path(fs.result.path)):
        try:
            index = load_index(idx)
        except UsageError as exc:
            fs.error(f"its index {idx.name} is not one the shard reader takes ({exc}): not compared")
            continue
        for key, fields in zip(index.keys, index.members):
            for ext, off, size in fields:
                name, held = walked.get(off, (None, None))
                if name is not None and held == size and base_plus_ext(name) == (key, ext):
                    continue
                what = f"member {name!r} ({held:,} bytes)" if name is not None else "no member's data"
                fs.error(f"its index {idx.name} does not match the tar: the '{ext}' of sample {key!r} ({size:,} bytes "
                         f"at offset {off:,}) is {what}; the shard reader would hand it out as '{ext}'")
                return


def _member(fs: FileScan, body: BinaryIO, info: tarfile.TarInfo, where: str, depth: int,
            scan_member: ScanContent, as_data: Counter[str]) -> None:
    if info.name in torchtar.MEMBERS:          # torch's legacy checkpoint: pickles between raw bytes
        torchtar.scan_member(fs, body, info.size, where, info.name)
        return
    field = field_of(info.name)
    if field and data_kind(body, field) is not None:
        as_data[field] += 1
        return
    scan_member(fs, body, info.size, where, info.name, depth + 1)


def _spooled(fs: FileScan, body: BinaryIO, info: tarfile.TarInfo, where: str, depth: int,
             scan_member: ScanContent, as_data: Counter[str]) -> None:
    """A member of a streamed tar, copied where it can seek (memory, or a temporary file
    past ``SPOOL_BYTES``): the scanners read heads and seek back."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        try:
            while chunk := body.read(1 << 20):
                spool.write(chunk)
        except tarfile.ReadError as exc:         # the stream ends before the size its header claims
            raise tarfile.ReadError(f"member {info.name!r} claims {info.size:,} bytes: {exc}") from None
        spool.seek(0)
        _member(fs, cast(BinaryIO, spool), info, where, depth, scan_member, as_data)


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    scan_tar(fs, fh, member, depth, scan_content)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head), _scan, archive=True)
