"""The Checkpointer's object-storage tier: each committed checkpoint pushed to
``s3://bucket/prefix/step-NNNNNNNN/``, and fetched back when the shared tier lost it.

A push uploads every file of the committed step directory (large ones in parts, boto3's
multipart upload), read at no more than the Checkpointer's bytes/s cap, and the manifest
last: a step without ``manifest.json`` in the store is not a checkpoint, so a push cut
short (kill -9, a failing endpoint) is never taken for a whole one. Only rank 0 pushes,
after its commit, in the save's background thread. The store keeps the newest ``keep``
whole checkpoints: an older step's manifest is deleted first, then its files, so a prune
cut short leaves no whole-looking step either.

A fetch downloads a step's manifest (bounded) into a temporary directory beside the
checkpoints, then the files it names and no others, each refused unless it is the size the
manifest states, and renames the directory into place as ``step-NNNNNNNN``; the
Checkpointer then loads it as any other, checking every shard's size and crc32 against the
manifest.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from hpcml import logs, objstore
from hpcml.ckpt import layout
from hpcml.errors import HpcmlError

log = logs.get(__name__)

PART = 16 << 20               # multipart threshold and part size
_STEP = re.compile(r"^step-(\d{8,})/" + re.escape(layout.MANIFEST) + "$")


class _Paced:
    """A file read at no more than ``rate`` bytes/s (None: as fast as it goes), for the
    uploader's threads alike (one budget, under a lock)."""

    def __init__(self, fh: Any, rate: float | None) -> None:
        self.fh, self.rate = fh, rate
        self.start, self.done = time.monotonic(), 0
        self.lock = threading.Lock()

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        if self.rate:
            with self.lock:
                self.done += len(data)
                ahead = self.done / self.rate - (time.monotonic() - self.start)
            if ahead > 0:
                time.sleep(ahead)
        return data

    def seek(self, *args: Any) -> int:
        return self.fh.seek(*args)

    def tell(self) -> int:
        return self.fh.tell()

    def close(self) -> None:
        """The uploader closes what it read; the file is the caller's ``with`` block's."""


class ObjectTier:
    """``url``: ``s3://bucket/prefix``; ``rate``: bytes/s of the pushes (the Checkpointer's cap)."""

    def __init__(self, url: str, rate: float | None = None) -> None:
        self.url = objstore.S3Url.parse(url, key="object_store")
        self.rate = rate
        self.client = objstore.client()
        try:
            self.client.head_bucket(Bucket=self.url.bucket)        # a missing bucket, refused credentials: now
        except objstore.errors() as exc:
            raise objstore.problem(_no_bucket(exc), str(self.url)) from None

    def _where(self, key: str) -> str:
        return f"{objstore.SCHEME}{self.url.bucket}/{key}"

    def push(self, step_dir: Path, step: int) -> int:
        """Upload a committed step directory, the manifest last; the bytes sent."""
        from boto3.s3.transfer import TransferConfig
        config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=4)
        base = self.url.key(layout.step_name(step))
        names = sorted(p.name for p in step_dir.iterdir() if p.is_file() and not p.name.startswith("."))
        if layout.MANIFEST not in names:
            raise HpcmlError(f"{step_dir}: not committed (no {layout.MANIFEST}); not pushed")
        try:                                      # the step pushed again: never whole while its files change
            self.client.delete_object(Bucket=self.url.bucket, Key=f"{base}/{layout.MANIFEST}")
        except objstore.errors() as exc:
            raise objstore.problem(exc, self._where(f"{base}/{layout.MANIFEST}")) from None
        sent = 0
        for name in [n for n in names if n != layout.MANIFEST] + [layout.MANIFEST]:
            key = f"{base}/{name}"
            try:
                with open(step_dir / name, "rb") as fh:
                    self.client.upload_fileobj(_Paced(fh, self.rate), self.url.bucket, key, Config=config)
            except objstore.errors() as exc:
                raise objstore.problem(exc, self._where(key)) from None
            sent += (step_dir / name).stat().st_size
        return sent

    def steps(self) -> list[int]:
        """The steps the store holds whole (a manifest), oldest first."""
        found: list[int] = []
        prefix = self.url.key("")
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    m = _STEP.match(obj["Key"][len(prefix):])
                    if m:
                        found.append(int(m.group(1)))
        except objstore.errors() as exc:
            raise objstore.problem(exc, str(self.url)) from None
        return sorted(found)

    def _keys(self, step: int) -> list[str]:
        base = self.url.key(layout.step_name(step)) + "/"
        keys: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket, Prefix=base):
                keys += [obj["Key"] for obj in page.get("Contents", [])]
        except objstore.errors() as exc:
            raise objstore.problem(exc, self._where(base)) from None
        return keys

    def fetch(self, step: int, into: Path, mode: int = layout.FILE_MODE, replace: bool = False) -> Path:
        """Download step ``step`` into ``into/step-NNNNNNNN`` (whole, or not at all); its path.
        ``replace``: a local copy of that step (one that did not load) is replaced once the
        store's copy is complete; otherwise it is kept. The manifest comes first (bounded),
        then only the files it names, each refused unless it is the size the manifest states:
        another object under the step's prefix is never downloaded, nor one that grew. Any
        failure, the local filesystem's too, is an ``HpcmlError`` (the caller tries the step
        before)."""
        final = into / layout.step_name(step)
        if final.exists() and not replace:
            return final
        _sweep(into)
        base = self.url.key(layout.step_name(step)) + "/"
        tmp = into / f".fetch-{layout.step_name(step)}-{uuid.uuid4().hex[:8]}"
        try:
            layout.make_dir(tmp, mode)
        except OSError as exc:
            raise HpcmlError(f"{tmp}: cannot be created ({exc.strerror or exc})") from None
        try:
            self._get(base + layout.MANIFEST, tmp / layout.MANIFEST, layout.JSON_MAX, mode, exact=False)
            found = layout.Found(step, tmp, True)
            layout.read_manifest(found)
            if found.problems or not found.manifest:
                raise HpcmlError(f"{self._where(base + layout.MANIFEST)}: not a whole checkpoint's manifest "
                                 f"({'; '.join(found.problems) or 'unreadable'})")
            for kind, r, rec in layout.shards(found.manifest):
                for name, size in zip(layout.shard_names(r, kind), (rec["size"], rec["json_size"])):
                    self._get(base + name, tmp / name, size, mode)
            try:
                if final.exists() and replace:       # the local copy that did not load: the store's replaces it
                    bad = into / f".bad-{layout.step_name(step)}-{uuid.uuid4().hex[:8]}"
                    os.rename(final, bad)
                    shutil.rmtree(bad, ignore_errors=True)
                try:
                    os.rename(tmp, final)
                except OSError:
                    if not final.exists():           # another rank renamed its copy first: that one stands
                        raise
            except OSError as exc:
                raise HpcmlError(f"{final}: the fetched step not put in place ({exc.strerror or exc})") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _get(self, key: str, path: Path, size: int, mode: int, *, exact: bool = True) -> None:
        """Download ``key`` to the new file ``path``: refused once it is larger than ``size``
        bytes (``exact``: unless it is exactly ``size``: a manifest's file of another size is
        not the checkpoint's, and would replace a local copy)."""
        where = self._where(key)
        try:
            fd = layout.create(path, mode)
        except OSError as exc:                   # a name too long, a full or read-only disk: one line
            raise HpcmlError(f"{path}: cannot be created for {where} ({exc.strerror or exc})") from None
        sink = _Bounded(fd, size)
        try:
            with sink:
                if self.client.head_object(Bucket=self.url.bucket, Key=key)["ContentLength"] > size:
                    raise _TooLarge()           # said before a byte of it is fetched
                self.client.download_fileobj(self.url.bucket, key, sink)
        except _TooLarge:
            raise HpcmlError(f"{where}: larger than the {size} bytes {'the manifest states' if exact else 'a manifest may be'}; "
                             "not fetched") from None
        except OSError as exc:
            raise HpcmlError(f"{path}: not written ({exc.strerror or exc})") from None
        except Exception as exc:  # noqa: BLE001 - botocore's, s3transfer's, urllib3's: one line
            raise objstore.problem(exc, where) from None
        if exact and sink.written != size:
            raise HpcmlError(f"{where}: {sink.written} bytes, the manifest states {size}; not fetched")

    def prune(self, keep: int) -> list[int]:
        """Keep the newest ``keep`` whole steps; each older one loses its manifest first."""
        whole = self.steps()
        gone = whole[:-keep] if keep > 0 else []
        for step in gone:
            base = self.url.key(layout.step_name(step)) + "/"
            try:
                self.client.delete_object(Bucket=self.url.bucket, Key=base + layout.MANIFEST)
                rest = self._keys(step)
                for i in range(0, len(rest), 1000):
                    self.client.delete_objects(Bucket=self.url.bucket,
                                               Delete={"Objects": [{"Key": k} for k in rest[i:i + 1000]]})
            except objstore.errors() as exc:
                log.warning("hpcml ckpt: %s", objstore.problem(exc, self._where(base)))
        return gone


class _TooLarge(Exception):
    """An object that ran past the bytes it may have."""


class _Bounded:
    """A download's file that refuses (``_TooLarge``) a byte past ``limit``: what a fetch
    writes is bounded by the manifest, whatever the store holds. Seekable, so that the
    downloader writes each part in its place, holding none in memory."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fh = os.fdopen(fd, "wb")
        self.limit, self.written = limit, 0

    def write(self, data: bytes) -> int:
        at = self.fh.tell()
        if at + len(data) > self.limit:
            raise _TooLarge()
        n = self.fh.write(data)
        self.written = max(self.written, at + n)
        return n

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.fh.seek(offset, whence)

    def tell(self) -> int:
        return self.fh.tell()

    def __enter__(self) -> _Bounded:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.fh.close()


STALE_S = 3600.0           # a fetch's temporary directory this old belongs to a process that died


def _sweep(into: Path) -> None:
    """Temporary directories of fetches killed before their rename."""
    now = time.time()
    for p in into.glob(".fetch-step-*"):
        try:
            if now - p.stat().st_mtime > STALE_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            continue


def _no_bucket(exc: Any) -> Any:
    """head_bucket's 404 has no body to name it: the same error, named NoSuchBucket."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and str(response.get("Error", {}).get("Code", "")) == "404":
        response["Error"]["Code"] = "NoSuchBucket"
    return exc
