"""Packing a directory of small files into WebDataset tar shards with an index and a manifest.

The tar members are written by hand (headers from ``tarfile.TarInfo.tobuf``, data copied
into one large buffer) rather than through ``tarfile.TarFile.addfile`` because the packer
needs each member's offset for the index and the shard's sha256 in the same single pass.

Resumable: the plan (which files go to which shard) is a pure function of the sorted
listing and the target size, each shard's index records a fingerprint of its planned
members, and a shard is renamed into place only after its index is written, so a rerun
keeps every finished shard whose fingerprint still matches and rewrites the others.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from hpcml import scratch
from hpcml.data.index import BLOCK, index_name, padded, read_index_doc, write_index
from hpcml.data.manifest import MANIFEST, Manifest, ShardEntry, dataset_id, write_manifest
from hpcml.data.sources import Listing, SourceFile, list_files, sample_key
from hpcml.errors import UsageError
from hpcml.files import JSON_MAX, load_json_bounded

DEFAULT_SHARD_BYTES = 256 * 10**6
FLUSH = 8 << 20
UNREADABLE = "unreadable.txt"
SHARD_RE = re.compile(r"^shard-\d{6}\.(tar|idx\.json)$")


@dataclass
class ShardPlan:
    number: int
    samples: list[tuple[str, list[tuple[str, SourceFile]]]]   # (key, [(ext, file)])
    bytes: int

    @property
    def name(self) -> str:
        return f"shard-{self.number:06d}.tar"

    def fingerprint(self) -> str:
        h = hashlib.sha256(b"hpcml-pack-1\n")
        for _key, members in self.samples:
            for _ext, f in members:
                h.update(f"{f.rel}\0{f.size}\0{f.mtime_ns}\n".encode())
        return h.hexdigest()


@dataclass
class PackResult:
    manifest: Manifest
    written: int = 0
    reused: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    skipped: list[dict] = field(default_factory=list)


def group_samples(listing: Listing) -> tuple[list[tuple[str, list[tuple[str, SourceFile]]]], list[dict]]:
    """Files grouped into samples by WebDataset's rule, in key order; ungroupable files listed."""
    samples: dict[str, list[tuple[str, SourceFile]]] = {}
    skipped = []
    for f in listing.files:
        kv = sample_key(f.rel)
        if kv is None:
            skipped.append({"path": f.rel, "reason": "no extension: WebDataset cannot group it into a sample"})
            continue
        samples.setdefault(kv[0], []).append((kv[1], f))
    return [(k, sorted(samples[k], key=lambda m: m[0])) for k in sorted(samples)], skipped


def plan_shards(samples, target_bytes: int) -> list[ShardPlan]:
    """Fill shards in key order up to the target; a sample never straddles two shards."""
    shards: list[ShardPlan] = []
    cur: list = []
    size = 0
    for key, members in samples:
        s = sum(BLOCK + padded(f.size) for _e, f in members)
        if cur and size + s > target_bytes:
            shards.append(ShardPlan(len(shards), cur, size))
            cur, size = [], 0
        cur.append((key, members))
        size += s
    if cur:
        shards.append(ShardPlan(len(shards), cur, size))
    return shards


def _header(f: SourceFile) -> bytes:
    ti = tarfile.TarInfo(f.rel)
    ti.size, ti.mtime, ti.mode = f.size, f.mtime_ns // 10**9, 0o644
    ti.uname = ti.gname = ""
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class _SourceError(Exception):
    def __init__(self, rel: str, reason: str) -> None:
        super().__init__(rel, reason)
        self.rel, self.reason = rel, reason


def _read_source(root: Path, f: SourceFile) -> bytes:
    try:
        with open(root / f.rel, "rb") as fh:
            data = fh.read(f.size + 1)
    except OSError as exc:
        raise _SourceError(f.rel, exc.strerror or str(exc)) from None
    if len(data) != f.size:
        raise _SourceError(f.rel, f"changed while packing: {len(data)} bytes, listed with {f.size}")
    return data


def write_shard(root: Path, dst: Path, plan: ShardPlan, advance: Callable[[int], None]) -> ShardEntry:
    """One shard: tar + index, renamed into place last."""
    part = dst / f".{plan.name}.part"
    sha = hashlib.sha256()
    rows, buf, pos = [], bytearray(), 0
    # nameless (``scratch``): a pack killed mid-shard leaves no partial shard behind;
    # where the filesystem cannot, under ``part``, which the next pack of this shard rewrites
    part.unlink(missing_ok=True)                  # a killed pack's (between its link and its rename)
    nameless = scratch.anonymous(dst, 0o666, to_publish=True)   # as open(): the umask narrows
    with (os.fdopen(nameless, "wb", closefd=False) if nameless is not None else open(part, "wb")) as out:
        def flush() -> None:
            out.write(buf)
            sha.update(buf)
            advance(len(buf))
            buf.clear()
        try:
            for key, members in plan.samples:
                start, fields = pos, []
                for ext, f in members:
                    hdr = _header(f)
                    data = _read_source(root, f)
                    buf += hdr
                    fields.append([ext, pos + len(hdr), f.size])
                    buf += data
                    buf += bytes(padded(f.size) - f.size)
                    pos += len(hdr) + padded(f.size)
                rows.append([key, start, pos, fields])
                if len(buf) >= FLUSH:
                    flush()
            buf += bytes(2 * BLOCK)
            pos += 2 * BLOCK
            flush()
        except BaseException:
            out.close()
            if nameless is not None:
                os.close(nameless)
            part.unlink(missing_ok=True)
            raise
    digest = sha.hexdigest()
    try:
        write_index(dst / index_name(plan.name), plan.name, rows, plan.fingerprint(), digest, pos)
        if nameless is not None:
            scratch.replace_with(nameless, dst / plan.name, part, mode=0o666, exact=False)
        else:
            os.replace(part, dst / plan.name)
    finally:
        if nameless is not None:
            os.close(nameless)
    return ShardEntry(name=plan.name, index=index_name(plan.name), bytes=pos, sha256=digest, samples=len(rows))


def finished(dst: Path, plan: ShardPlan) -> ShardEntry | None:
    """The entry of an already written shard whose planned members are unchanged."""
    tar, idx = dst / plan.name, dst / index_name(plan.name)
    try:
        if not tar.is_file() or not idx.is_file():
            return None
        doc = read_index_doc(idx)
        if doc.get("fingerprint") != plan.fingerprint() or tar.stat().st_size != doc.get("bytes"):
            return None
    except (UsageError, OSError):
        return None
    return ShardEntry(name=plan.name, index=idx.name, bytes=doc["bytes"], sha256=doc["sha256"],
                      samples=len(doc["samples"]))


def _check_paths(src: Path, dst: Path) -> None:
    if not src.is_dir():
        raise UsageError("not a directory" if src.exists() else "does not exist", file=str(src))
    if dst.exists() and not dst.is_dir():
        raise UsageError("destination exists and is not a directory", file=str(dst))
    if dst.resolve().is_relative_to(src.resolve()):
        raise UsageError("destination is inside the source: it would pack itself", file=str(dst))


def refuse_unreadable(listing: Path, bad: list[tuple[str, str]], resume: bool = True) -> None:
    """Never drop a file silently: list every unreadable one in ``listing`` and stop."""
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text("".join(f"{p}\t{why}\n" for p, why in bad))
    shown = ", ".join(f"{p} ({why})" for p, why in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    hint = " (finished shards are kept: rerun to resume)" if resume else ""
    raise UsageError(f"{len(bad)} unreadable source file(s): {shown}{more}; all listed in {listing}; "
                     f"fix them or pass --skip-unreadable{hint}", file=str(listing.parent))


def _refuse_foreign(src: Path, dst: Path) -> None:
    """A manifest in ``dst`` from another source: someone's dataset, not ours to replace."""
    if not (dst / MANIFEST).is_file():
        return
    try:
        old = load_json_bounded(dst / MANIFEST, JSON_MAX)
    except (OSError, ValueError):
        return                                   # unreadable: the reader will say so; a rerun may fix it
    source = old.get("source") if isinstance(old, dict) else None
    if isinstance(source, str) and source != str(src.resolve()):
        n = len(old.get("shards") or [])
        raise UsageError(f"holds a dataset packed from {source} ({n} shards); pack into another directory, "
                         "or give --overwrite to replace it", file=str(dst))


def pack(src: str | Path, dst: str | Path, *, target_bytes: int = DEFAULT_SHARD_BYTES, jobs: int = 8,
         skip_unreadable: bool = False, on_plan: Callable[[int, int], None] | None = None,
         advance: Callable[[int], None] = lambda n: None, overwrite: bool = False) -> PackResult:
    """Pack ``src`` into shards in ``dst``; ``on_plan(total_bytes, already_done)`` starts a progress bar.

    ``dst`` holding a dataset packed from another source is refused (its shards would be
    replaced or deleted) unless ``overwrite``."""
    src, dst = Path(src), Path(dst)
    _check_paths(src, dst)
    if not overwrite:
        _refuse_foreign(src, dst)
    if target_bytes < 10 * BLOCK:
        raise UsageError(f"shard size {target_bytes} B is too small", key="shard-size")
    t0 = time.monotonic()
    listing = list_files(src, jobs=jobs)
    if listing.unreadable and not skip_unreadable:
        refuse_unreadable(dst / UNREADABLE, listing.unreadable)
    samples, skipped = group_samples(listing)
    skipped += [{"path": p, "reason": why} for p, why in listing.unreadable]
    if not samples:
        raise UsageError("no files to pack", file=str(src))
    plans = plan_shards(samples, target_bytes)
    dst.mkdir(parents=True, exist_ok=True)
    planned = {p.name for p in plans} | {index_name(p.name) for p in plans}
    for stale in dst.iterdir():
        if SHARD_RE.match(stale.name) and stale.name not in planned:
            stale.unlink()
    done = {p.number: e for p in plans if (e := finished(dst, p))}
    if on_plan:
        on_plan(sum(p.bytes for p in plans), sum(e.bytes for e in done.values()))
    result = PackResult(Manifest(), reused=len(done), skipped=skipped)
    bad: list[tuple[str, str]] = []

    def one(plan: ShardPlan) -> ShardEntry | None:
        try:
            return write_shard(src, dst, plan, advance)
        except _SourceError as exc:
            bad.append((str(src / exc.rel), exc.reason))
            return None
        except OSError as exc:
            raise UsageError(f"cannot write shard: {exc.strerror}", file=str(dst / plan.name)) from None

    todo = [p for p in plans if p.number not in done]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for plan, entry in zip(todo, pool.map(one, todo)):
            if entry is not None:
                done[plan.number] = entry
                result.written += 1
                result.bytes_written += entry.bytes
    if bad:
        refuse_unreadable(dst / UNREADABLE, sorted(bad))
    shards = [done[p.number] for p in plans]
    fields = sorted({ext for _k, members in samples for ext, _f in members})
    result.manifest = Manifest(
        dataset=dataset_id(shards), source=str(src.resolve()), target_shard_bytes=target_bytes,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        samples=sum(s.samples for s in shards), bytes=sum(s.bytes for s in shards), fields=fields,
        shards=shards, skipped=skipped)
    write_manifest(result.manifest, dst)
    (dst / UNREADABLE).unlink(missing_ok=True)
    result.seconds = time.monotonic() - t0
    return result
