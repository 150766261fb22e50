"""Object storage, S3-compatible (Ceph RGW, MinIO, AWS): ``s3://bucket/prefix`` URLs, a
client, and one line for each way it fails.

The client is boto3's, because it is the AWS SDK's own reading of the standard setup:
credentials from the environment (``AWS_ACCESS_KEY_ID``...), ``~/.aws/credentials`` and
``~/.aws/config`` profiles (``AWS_PROFILE``), the endpoint from ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``, or ``endpoint_url`` in the profile) as a Ceph or MinIO site sets
it; its ``standard`` retry mode retries 500/502/503/504, SlowDown and connection errors with
exponential backoff and jitter; its transfer manager uploads large files in parts
(multipart). obstore was the other choice (faster, Rust): it reads the environment only,
not the config files' profiles. boto3 is an optional dependency (``hpcml[s3]``): imported
only where an ``s3://`` URL is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hpcml.errors import HpcmlError, UsageError

SCHEME = "s3://"
RETRIES = 6                 # attempts in all, boto3's standard mode (backoff with jitter, at most 20 s)
TIMEOUT_S = 60.0            # connect and read timeouts of one request
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_BAD_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
                    "ExpiredToken", "403")


def is_url(text: str | object) -> bool:
    return isinstance(text, str) and text.startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    """``s3://bucket/prefix``: the prefix without a leading or trailing ``/`` ("" for the
    bucket's root); ``key(name)`` is ``prefix/name``."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, text: str, key: str = "url") -> S3Url:
        if not is_url(text):
            raise UsageError(f"expected s3://bucket/prefix, found {text!r}", key=key)
        bucket, _, prefix = text[len(SCHEME):].partition("/")
        if not _BUCKET.match(bucket):
            raise UsageError(f"{text}: not a bucket name (3-63 lower-case letters, digits, '.', '-')", key=key)
        prefix = prefix.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise UsageError(f"{text}: the prefix has an empty, '.' or '..' part", key=key)
        return cls(bucket, prefix)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"


_clients: dict[tuple, Any] = {}


def client() -> Any:
    """A boto3 S3 client from the standard environment and config files, retrying with
    backoff: one per process (boto3's clients are thread-safe, not fork-safe: a DataLoader
    worker makes its own), so a stage of many files pays for one (~150 ms). A changed AWS_*
    variable (another profile, endpoint or key) makes a new one."""
    import os
    pid = (os.getpid(), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    if pid in _clients:
        return _clients[pid]
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise UsageError("s3:// needs boto3: pip install 'hpcml[s3]'") from None
    try:
        made = boto3.session.Session().client(
            "s3", config=Config(retries={"max_attempts": RETRIES, "mode": "standard"}, connect_timeout=TIMEOUT_S,
                                read_timeout=TIMEOUT_S))
    except BotoCoreError as exc:                 # a profile that is not there, a malformed config file
        raise UsageError(f"the S3 client: {exc}") from None
    _clients.clear()
    _clients[pid] = made
    return made


def problem(exc: BaseException, where: str) -> HpcmlError:
    """One line naming the object (``where``: an s3:// URL) and what went wrong: bad input
    (no bucket, credentials refused or missing) is a ``UsageError``; an endpoint that kept
    failing after the retries, an ``HpcmlError``."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    if isinstance(exc, NoCredentialsError):
        return UsageError(f"{where}: no credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in "
                          "~/.aws/credentials)")
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
        code = str(err.get("Code", ""))
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") \
            if isinstance(exc.response, dict) else None
        if code == "NoSuchBucket":
            return UsageError(f"{where}: no such bucket")
        if code in ("NoSuchKey", "404"):
            return UsageError(f"{where}: no such object")
        if code in _BAD_CREDENTIALS or status == 403:
            return UsageError(f"{where}: the credentials were refused ({code or status}): check AWS_ACCESS_KEY_ID, "
                              "AWS_SECRET_ACCESS_KEY or the profile")
        return HpcmlError(f"{where}: the endpoint answered {code or status} after {RETRIES} tries: "
                          f"{err.get('Message') or exc}")
    if isinstance(exc, BotoCoreError):
        return HpcmlError(f"{where}: the endpoint did not answer after {RETRIES} tries: {exc}")
    return HpcmlError(f"{where}: {type(exc).__name__}: {exc}")


def errors() -> tuple[type[BaseException], ...]:
    """The exceptions ``problem`` turns into a line: botocore's, s3transfer's (a transfer
    whose retries ran out), and urllib3's from a body read that broke off."""
    from botocore.exceptions import BotoCoreError, ClientError
    from s3transfer.exceptions import RetriesExceededError, S3UploadFailedError
    from urllib3.exceptions import HTTPError
    return (BotoCoreError, ClientError, RetriesExceededError, S3UploadFailedError, HTTPError)


def locate(base: S3Url, name: str) -> tuple[str, str]:
    """(bucket, key) of ``name`` as a manifest names it: an ``s3://`` URL, or a plain name
    beside the manifest under ``base``'s prefix (never ``..`` out of it)."""
    if is_url(name):
        u = S3Url.parse(name, key="name")
        return u.bucket, u.prefix
    if not name or "/" in name or name in (".", ".."):
        raise UsageError(f"{base}: not a plain object name beside the manifest: {name!r}")
    return base.bucket, base.key(name)


def url_of(bucket: str, key: str) -> str:
    return f"{SCHEME}{bucket}/{key}"


def read_object(s3: Any, bucket: str, key: str, max_bytes: int) -> bytes:
    """A whole object, refused beyond ``max_bytes`` (read that far and no further)."""
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        data = body.read(max_bytes + 1)
        body.close()
    except errors() as exc:
        raise problem(exc, url_of(bucket, key)) from None
    if len(data) > max_bytes:
        raise UsageError(f"{url_of(bucket, key)}: larger than {max_bytes} bytes")
    return data


def read_range(s3: Any, bucket: str, key: str, start: int, end: int, into: memoryview) -> int:
    """Bytes ``start`` to ``end`` (exclusive) of an object into ``into``: one ranged GET; a
    range past the object's end (a shard cut short) is a short read, as ``pread``'s."""
    if end <= start:
        return 0
    try:
        try:
            resp = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        except Exception as exc:
            if str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")) == "InvalidRange":
                return 0
            raise
        if not str(resp.get("ContentRange", "")).startswith(f"bytes {start}-"):
            raise UsageError(f"{url_of(bucket, key)}: the server ignored the byte range (answered "
                             f"{resp.get('ContentRange') or 'the whole object'})")
        body = resp["Body"]
        got = 0
        while got < end - start:
            chunk = body.read(min(1 << 20, end - start - got))
            if not chunk:
                break
            into[got:got + len(chunk)] = chunk
            got += len(chunk)
        body.close()
    except errors() as exc:
        raise problem(exc, url_of(bucket, key)) from None
    return got


def list_objects(s3: Any, url: S3Url) -> list[tuple[str, int, str]]:
    """(key, size, ETag) of every object directly under ``url``'s prefix (not deeper), by key."""
    prefix = url.key("") if url.prefix else ""
    out: list[tuple[str, int, str]] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=prefix, Delimiter="/"):
            out += [(o["Key"], int(o["Size"]), str(o.get("ETag", ""))) for o in page.get("Contents", [])]
    except errors() as exc:
        raise problem(exc, str(url)) from None
    return sorted(out)


def put_bytes(s3: Any, bucket: str, key: str, data: bytes) -> None:
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    except errors() as exc:
        raise problem(exc, url_of(bucket, key)) from None
