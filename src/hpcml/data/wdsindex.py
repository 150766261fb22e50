"""Indexing WebDataset shards that someone else wrote, so hpcml reads, stages and resumes
them as they are: ``hpcml data index SPEC [--out DIR]``.

The shards are only read, never rewritten: one pass per shard computes its sha256 (what
staging verifies copies against) and walks its tar headers with ``tarfile`` in stream
mode (``r|*`` as webdataset reads, so gzip, bzip2 and xz shards work too), each member's
size checked against what the shard holds (``hpcml.tarbounds``: a header claiming 10**20
bytes is one line naming the member, not a walk that never ends). Members are
grouped into samples by webdataset's own rules (``tariterators.tar_file_iterator`` and
``group_by_keys``), so a sample here is the sample ``webdataset.WebDataset`` yields:

- only regular files count (directories, links are skipped);
- ``__name__`` at the top level and names matching ``__[^/]*__($|/)`` are metadata, skipped;
- the key is the path up to the first dot of the basename, the field the rest, lower-cased
  (``a/b.c/x.JPG`` is key ``a/b.c/x``, field ``jpg``); a name without a dot is skipped;
- a new sample starts whenever the key changes: members of one key that are not adjacent
  are two samples with the same key, as in webdataset;
- a field twice in one sample is refused, as webdataset raises.

The index and ``manifest.json`` go to ``--out`` (default: beside the shards; a read-only
shard directory needs ``--out``). The manifest names a shard by its file name when it lies
beside the manifest, else by its absolute path.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from hpcml import objstore, progress
from hpcml.data import index as shard_index
from hpcml.data.index import index_bytes, index_name, padded, write_index
from hpcml.data.manifest import (
    MANIFEST,
    Manifest,
    ShardEntry,
    dataset_id,
    is_shard_name,
    manifest_bytes,
    write_manifest,
)
from hpcml.errors import UsageError
from hpcml.files import JSON_MAX, load_json_bounded, write_atomic
from hpcml.tarbounds import checked_members, open_tar

COMPRESSION = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"))
SKIP_META = re.compile(r"__[^/]*__($|/)")
KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
BRACE_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
MAX_EXPANDED = 1_000_000
SKIPPED_LISTED = 100          # members skipped, listed in the manifest (the rest counted)
CHUNK = 4 << 20


def base_plus_ext(name: str) -> tuple[str, str] | None:
    """webdataset's key rule: ``(key, field)`` or None for a name it skips."""
    m = KEY_RE.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


def is_meta(name: str) -> bool:
    """Members webdataset skips as metadata before grouping."""
    return ("/" not in name and name.startswith("__") and name.endswith("__")) or bool(SKIP_META.match(name))


def compression_of(head: bytes) -> str:
    """'' for a plain tar, else the compression its magic bytes name."""
    return next((name for magic, name in COMPRESSION if head.startswith(magic)), "")


def open_decompressed(raw: BinaryIO, compression: str) -> io.BufferedIOBase:
    """A read-only stream of the tar inside a compressed shard."""
    import bz2
    import gzip
    import lzma
    openers = {"gzip": lambda: gzip.GzipFile(fileobj=raw), "bz2": lambda: bz2.BZ2File(raw),
               "xz": lambda: lzma.LZMAFile(raw)}
    if compression not in openers:
        raise ValueError(f"unknown compression {compression!r}")
    return openers[compression]()


def expand_braces(spec: str) -> list[str]:
    """webdataset's "url" notation (the braceexpand package): ``{000..009}`` keeps the
    zero padding of its bounds, ``{a,b}`` lists alternatives; several braces multiply."""
    m = BRACE_RANGE.search(spec)
    alt = re.search(r"\{([^{}]*,[^{}]*)\}", spec)
    if m and (alt is None or m.start() < alt.start()):
        lo, hi = int(m.group(1)), int(m.group(2))
        width = len(m.group(1)) if m.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        if abs(hi - lo) >= MAX_EXPANDED:
            raise UsageError(f"the range {m.group(0)} names more than {MAX_EXPANDED:,} shards", key="SPEC")
        out: list[str] = []
        for i in range(lo, hi + step, step):
            out += expand_braces(f"{spec[:m.start()]}{i:0{width}d}{spec[m.end():]}")
        return out
    if alt:
        return [x for part in alt.group(1).split(",") for x in expand_braces(spec[:alt.start()] + part + spec[alt.end():])]
    return [spec]


def shard_paths(specs: list[str]) -> list[Path]:
    """Shards named by ``specs``: a directory (its tar shards, not recursive), a glob, a
    brace pattern, or a file; in the order given, each directory and glob sorted."""
    out: list[Path] = []
    for spec in specs:
        for one in expand_braces(spec):
            p = Path(one)
            if p.is_dir():
                found = sorted(c for c in p.iterdir() if is_shard_name(c.name) and c.is_file())
                if not found:
                    raise UsageError("no tar shards here (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz)", file=str(p))
                out += found
            elif any(c in one for c in "*?["):
                import glob
                found = sorted(Path(x) for x in glob.glob(one) if os.path.isfile(x))
                if not found:
                    raise UsageError("no file matches this pattern", file=one)
                out += found
            elif p.is_file():
                out.append(p)
            else:
                raise UsageError("no such shard", file=one)
    seen: set[Path] = set()
    unique = [p for p in (x.absolute() for x in out) if not (p in seen or seen.add(p))]   # type: ignore[func-returns-value]
    names: dict[str, Path] = {}
    for p in unique:
        if p.name in names:
            raise UsageError(f"two shards are named {p.name} ({names[p.name]} and {p}): their indexes would "
                             "collide; index each directory on its own", file=str(p))
        names[p.name] = p
    return unique


class _Hashing:
    """A read-only file view that hashes what it hands out, so the tar walk and the
    sha256 share one read of the shard."""

    def __init__(self, fh: BinaryIO | Any) -> None:
        self.fh, self.sha, self.bytes = fh, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.sha.update(data)
        self.bytes += len(data)
        return data

    def finish(self) -> None:
        while self.read(CHUNK):
            pass


@dataclass
class ShardScan:
    path: Path
    rows: list[list]
    sha256: str
    bytes: int
    compression: str
    tar_bytes: int                                   # the tar's length, decompressed
    fields: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)  # members webdataset skips too
    split_keys: int = 0                               # keys whose members are not adjacent


class _Peeked:
    """A stream whose first bytes were read to tell its compression, handed out again."""

    def __init__(self, head: bytes, fh: Any) -> None:
        self.head, self.fh = head, fh

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self.fh.read(n)
        if n < 0:
            out, self.head = self.head, b""
            return out + self.fh.read()
        out, self.head = self.head[:n], self.head[n:]
        return out if len(out) == n else out + self.fh.read(n - len(out))


def index_shard(path: Path) -> ShardScan:
    """One read of ``path``: its sha256 and its samples by webdataset's rules."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", file=str(path)) from None
    with fh:
        return _index_stream(fh, os.fstat(fh.fileno()).st_size, path)


def index_object(s3: Any, bucket: str, key: str, size: int) -> ShardScan:
    """One streamed GET of an object: its sha256 and its samples, as ``index_shard``."""
    url = objstore.url_of(bucket, key)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    except objstore.errors() as exc:
        raise objstore.problem(exc, url) from None
    try:
        return _index_stream(body, size, Path(key), url)
    except objstore.errors() as exc:
        raise objstore.problem(exc, url) from None
    finally:
        body.close()


def _inflated_problem(member: str, size: int, end: int) -> str:
    """A compressed shard whose tar outgrows what the reader holds of one (``index.MAX_INFLATED_BYTES``):
    refused at the member that crosses it, before its data is decompressed, so a small file
    that inflates without end (a decompression bomb) costs this walk no more than the bound."""
    limit = shard_index.MAX_INFLATED_BYTES
    return (f"member {member[:200]!r} claims {size:,} bytes of data, ending at byte {end:,} of the decompressed tar, "
            f"past the {limit:,} bytes a compressed shard may hold: it is read whole, as one block; decompress it "
            "(gunzip, xz -d) and index the .tar")


def _index_stream(fh: Any, size: int, path: Path, where: str | None = None) -> ShardScan:
    where = where or str(path)
    head = fh.read(8)
    comp = compression_of(head)
    src = _Hashing(_Peeked(head, fh))
    rows: list[list] = []
    fields: set[str] = set()
    skipped: list[str] = []
    seen_keys: set[str] = set()
    split = 0
    cur: list | None = None
    try:
        tf = open_tar(src, "r|*" if comp else "r|")      # type: ignore[arg-type]
        for info in checked_members(tf, room=None if comp else size):
            tf.members = []   # type: ignore[attr-defined]  # stream mode: keep no member list
            end = info.offset_data + padded(info.size)
            name = info.name
            if comp and end > shard_index.MAX_INFLATED_BYTES:
                raise UsageError(_inflated_problem(name, info.size, end), file=where)
            kv = base_plus_ext(name) if info.isreg() and not is_meta(name) else None
            if kv is None:
                if info.isreg():
                    skipped.append(name)
                continue
            key, ext = kv
            if cur is None or cur[0] != key:
                if key in seen_keys:
                    split += 1
                seen_keys.add(key)
                cur = [key, info.offset, end, []]
                rows.append(cur)
            elif any(m[0] == ext for m in cur[3]):
                raise UsageError(f"member {name!r}: a second '{ext}' in sample {key!r} (webdataset refuses "
                                 "it too)", file=where)
            cur[2] = end
            cur[3].append([ext, info.offset_data, info.size])
            fields.add(ext)
        tar_bytes = tf.offset
        tf.close()
        src.finish()
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise UsageError(f"not a readable tar shard: {exc}", file=where) from None
    return ShardScan(path, rows, src.sha.hexdigest(), src.bytes, comp, tar_bytes, fields, skipped, split)


@dataclass
class IndexResult:
    manifest: Manifest
    out: Path
    skipped_members: int = 0
    split_keys: int = 0
    compressed: int = 0
    url: str | None = None            # the s3:// prefix the index was written to (then ``out`` is not a path)


def _read_only(directory: Path) -> bool:
    """Not writable for us, or marked read-only by its mode (no write bit for anyone): root
    may write there, but a directory so marked is someone's data set, not a place for ours."""
    return not os.access(directory, os.W_OK) or not directory.stat().st_mode & 0o222


def _refuse_packed(out: Path) -> None:
    """``hpcml data pack``'s own manifest: its indexes exist and its resume needs them."""
    try:
        old = load_json_bounded(out / MANIFEST, JSON_MAX)
    except (OSError, ValueError):
        return
    _refuse_if_packed(old, str(out))


def _refuse_if_packed(old: Any, where: str) -> None:
    if isinstance(old, dict) and old.get("target_shard_bytes"):
        raise UsageError("holds a shard set made by 'hpcml data pack': it is indexed already", file=where)


def index_shards(specs: list[str], out: str | Path | None = None, *, jobs: int = 8) -> IndexResult:
    """Index the shards ``specs`` name and write their indexes and a manifest to ``out``
    (default: the directory of the first shard). The shards are never written. An
    ``s3://bucket/prefix`` spec: the shards directly under that prefix, each read by one
    streamed GET; the indexes and the manifest go beside them (default) or to ``out`` (a
    directory, the manifest then naming each shard by its URL)."""
    if any(objstore.is_url(s) for s in specs):
        return _index_objects(specs, out, jobs)
    paths = shard_paths(specs)
    dst = Path(out).absolute() if out is not None else paths[0].parent
    if dst.exists() and not dst.is_dir():
        raise UsageError("exists and is not a directory", file=str(dst))
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the index directory: {exc.strerror}", file=str(dst)) from None
    if _read_only(dst):
        raise UsageError("cannot write the index here (read-only): give --out DIR", file=str(dst))
    _refuse_packed(dst)
    count = progress.Counter("indexing shards", len(paths))

    def one(path: Path) -> ShardScan:
        scan = index_shard(path)
        count.step()
        return scan
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(paths)))) as pool:
        scans = list(pool.map(one, paths))
    entries = []
    for s in scans:
        name = s.path.name if s.path.parent == dst else str(s.path)
        idx = index_name(s.path.name)
        try:
            write_index(dst / idx, name, s.rows, "", s.sha256, s.bytes, compression=s.compression,
                        tar_bytes=s.tar_bytes)
        except OSError as exc:
            raise UsageError(f"cannot write the index: {exc.strerror}", file=str(dst / idx)) from None
        entries.append(ShardEntry(name=name, index=idx, bytes=s.bytes, sha256=s.sha256, samples=len(s.rows),
                                  compression=s.compression))
    manifest = _manifest(specs, entries, scans)
    try:
        write_manifest(manifest, dst)
    except OSError as exc:
        raise UsageError(f"cannot write the manifest: {exc.strerror}", file=str(dst / MANIFEST)) from None
    return IndexResult(manifest, dst, sum(len(s.skipped) for s in scans), sum(s.split_keys for s in scans),
                       sum(bool(s.compression) for s in scans))


def _index_objects(specs: list[str], out: str | Path | None, jobs: int) -> IndexResult:
    if not all(objstore.is_url(s) for s in specs):
        raise UsageError("give s3:// shards alone, not with files", key="SPEC")
    s3 = objstore.client()
    found: list[tuple[str, str, int]] = []                 # bucket, key, size
    for spec in specs:
        url = objstore.S3Url.parse(spec, key="SPEC")
        if is_shard_name(url.prefix):
            head = _head(s3, url.bucket, url.prefix)
            found.append((url.bucket, url.prefix, head))
            continue
        shards = [(url.bucket, k, n) for k, n, _ in objstore.list_objects(s3, url) if is_shard_name(k)]
        if not shards:
            raise UsageError("no tar shards here (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz)", file=str(url))
        found += shards
    names = [k.rsplit("/", 1)[-1] for _, k, _ in found]
    if len(set(names)) != len(names):
        raise UsageError("two shards have one name: their indexes would collide; index each prefix on its own",
                         file=specs[0])
    first = objstore.S3Url(found[0][0], found[0][1].rsplit("/", 1)[0] if "/" in found[0][1] else "")
    remote_out = out is None or objstore.is_url(out)
    dst_url = objstore.S3Url.parse(str(out), key="out") if out is not None and objstore.is_url(out) else first
    dst = Path(out).absolute() if not remote_out and out is not None else None
    if dst is not None:
        try:
            dst.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create the index directory: {exc.strerror}", file=str(dst)) from None
        _refuse_packed(dst)
    if dst is None:
        _refuse_packed_object(s3, dst_url)
    count = progress.Counter("indexing shards", len(found))

    def one(item: tuple[str, str, int]) -> ShardScan:
        scan = index_object(s3, *item)
        count.step()
        return scan
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(found)))) as pool:
        scans = list(pool.map(one, found))
    entries = []
    for (bucket, key, _), sc in zip(found, scans):
        base = key.rsplit("/", 1)[-1]
        beside = dst is None and bucket == dst_url.bucket and key == dst_url.key(base)
        name = base if beside else objstore.url_of(bucket, key)
        idx = index_name(base)
        data = index_bytes(name, sc.rows, "", sc.sha256, sc.bytes, compression=sc.compression, tar_bytes=sc.tar_bytes)
        if dst is not None:
            write_atomic(dst / idx, data.decode())
        else:
            objstore.put_bytes(s3, dst_url.bucket, dst_url.key(idx), data)
        entries.append(ShardEntry(name=name, index=idx, bytes=sc.bytes, sha256=sc.sha256, samples=len(sc.rows),
                                  compression=sc.compression))
    manifest = _manifest(specs, entries, scans)
    if dst is not None:
        write_manifest(manifest, dst)
        where = dst
    else:
        objstore.put_bytes(s3, dst_url.bucket, dst_url.key(MANIFEST), manifest_bytes(manifest))
        where = Path(str(dst_url))
    return IndexResult(manifest, where, sum(len(sc.skipped) for sc in scans), sum(sc.split_keys for sc in scans),
                       sum(bool(sc.compression) for sc in scans), url=None if dst is not None else str(dst_url))


def _refuse_packed_object(s3: Any, url: objstore.S3Url) -> None:
    """As ``_refuse_packed``, for a manifest in the bucket: pack's own is not rewritten."""
    try:
        data = s3.get_object(Bucket=url.bucket, Key=url.key(MANIFEST))["Body"].read(JSON_MAX + 1)
    except objstore.errors():
        return                                           # none (or not readable): nothing to protect
    try:
        old = orjson.loads(data)
    except ValueError:
        return
    _refuse_if_packed(old, objstore.url_of(url.bucket, url.key(MANIFEST)))


def _manifest(specs: list[str], entries: list[ShardEntry], scans: list[ShardScan]) -> Manifest:
    """The manifest of shards indexed where they are (a file's path or an object's URL as
    its name; the dataset id from the base names, so a copy beside the manifest is the same set)."""
    skipped = [{"path": f"{s.path.name}!{m}", "reason": "webdataset skips it (metadata, or no extension)"}
               for s in scans for m in s.skipped][:SKIPPED_LISTED]
    return Manifest(
        dataset=dataset_id([e.model_copy(update={"name": e.name.rsplit("/", 1)[-1]}) for e in entries]),
        source=" ".join(specs), created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        samples=sum(e.samples for e in entries), bytes=sum(e.bytes for e in entries),
        fields=sorted(set().union(*(s.fields for s in scans))), shards=entries, skipped=skipped)


def _head(s3: Any, bucket: str, key: str) -> int:
    try:
        return int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except objstore.errors() as exc:
        raise objstore.problem(exc, objstore.url_of(bucket, key)) from None
