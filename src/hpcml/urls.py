"""The one check of a URL hpcml sends to (the results collector, a remote-write receiver):
flags and environment variables name them, so a bad one is refused at the start, not when
the job ends."""

from __future__ import annotations

from urllib.parse import urlsplit


def is_http_url(url: str) -> bool:
    """``http(s)://HOST[:PORT]...`` with a host and, if given, a port that is one."""
    try:
        parts = urlsplit(url.strip())
        return parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
    except ValueError:                        # '[::1' or a port above 65535
        return False
