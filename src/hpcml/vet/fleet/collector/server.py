"""The collector's HTTP endpoints, on the standard library's ``ThreadingHTTPServer``.

Why the standard library: measured on 2 cores with the load generator on the same host
(benchmarks/bench_collector.py) it takes ~2,000 reports/s on SQLite and ~1,400/s on
PostgreSQL, above the 1,000/s goal, and no ASGI/WSGI server (uvicorn, gunicorn) is a
dependency of hpcml; Werkzeug/Flask in the environment would only add a layer over the
same model. HTTP/1.1 keep-alive, one thread per connection.

Security: every endpoint but ``/healthz`` needs ``Authorization: Bearer TOKEN`` (compared
with ``hmac.compare_digest``); a read-only token opens the GET endpoints only. The size is
checked from Content-Length before a byte of the body is read; a refused request closes
its connection so its body is never read. No request can crash the service: a failure in
a handler is a 500 for that request only.
"""

from __future__ import annotations

import hmac
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from hpcml.vet.fleet.collector.jobschema import parse_jobs
from hpcml.vet.fleet.collector.schema import Invalid, parse
from hpcml.vet.fleet.collector.store import BatchWriter, Store, StoreError

DEFAULT_PORT = 8787
DEFAULT_MAX_BODY = 1 << 20
TOKEN_ENV = "HPCML_VET_TOKEN"
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d|w)?\s*$")
_SCALE = {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class Tokens:
    """Write tokens (POST and GET), optional read-only tokens (GET only) and optional job
    tokens (only ``POST /v1/jobs``: what every user's ``hpcml run`` needs, and nothing more;
    it can neither send vetting results nor read anything)."""

    def __init__(self, write: Iterable[str], read: Iterable[str] = (), jobs: Iterable[str] = ()) -> None:
        self.write = [t.encode() for t in write if t]
        self.read = [t.encode() for t in read if t]
        self.jobs = [t.encode() for t in jobs if t]
        if not self.write:
            raise ValueError("no token: the collector refuses to run without one")

    def allows(self, header: str | None, write: bool, jobs: bool = False) -> bool:
        """``write``: a POST; ``jobs``: a POST of job summaries, which job tokens may make."""
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return False
        given = value.strip().encode()
        ok = False
        for t in (self.write + self.jobs if jobs else self.write) if write else self.write + self.read:
            ok |= hmac.compare_digest(given, t)  # no early exit: same time for every token
        return ok


def read_tokens(path: Path | None, env_var: str | None = TOKEN_ENV) -> list[str]:
    """Tokens from a file (one per line, ``#`` comments) or else from ``$HPCML_VET_TOKEN``."""
    if path is not None:
        lines = Path(path).read_text().splitlines()
        return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    value = os.environ.get(env_var or "", "").strip()
    return [value] if value else []


def parse_since(value: str) -> float:
    """``24h``, ``7d``, ``90 min``, ``3600`` -> seconds back from now."""
    m = _DURATION.match(value)
    if not m:
        raise ValueError(f"since: expected a duration such as 24h or 7d, found {value!r}")
    return float(m.group(1)) * _SCALE[m.group(2)]


def _int(query: dict, key: str, default: int, top: int) -> int:
    raw = query.get(key, [str(default)])[-1]
    if not raw.isdigit() or not 1 <= int(raw) <= top:
        raise ValueError(f"{key}: expected an integer from 1 to {top}, found {raw!r}")
    return int(raw)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hpcml-vet-collector"
    sys_version = ""
    timeout = 60  # an idle keep-alive connection is dropped after this
    disable_nagle_algorithm = True
    server: CollectorServer
    _headers_buffer: list[bytes]  # BaseHTTPRequestHandler's, filled by send_header

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, code: int, body: Any, close: bool = False, headers: dict | None = None) -> None:
        data = orjson.dumps(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        # head and body in one write: two small writes meet delayed ACKs (40 ms a request)
        self._headers_buffer.append(b"\r\n" + data)
        self.flush_headers()

    def _error(self, code: int, reason: str, close: bool = False, **headers: str) -> None:
        self._refused = close
        self._send(code, {"error": reason}, close=close, headers=headers)

    def finish(self) -> None:
        super().finish()
        if getattr(self, "_refused", False):
            self._linger()

    def _linger(self) -> None:
        """Read (and drop) what the client still sends, briefly, before closing: closing
        with unread data resets the connection and the client may lose our answer."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(1)
            left = self.server.max_body
            while left > 0 and (chunk := self.connection.recv(65536)):
                left -= len(chunk)
        except OSError:
            pass

    def _authorised(self, write: bool, jobs: bool = False) -> bool:
        if self.server.tokens.allows(self.headers.get("Authorization"), write, jobs):
            return True
        self._error(401, "missing or invalid token", close=True,
                    **{"WWW-Authenticate": 'Bearer realm="hpcml-vet"'})
        return False

    def _guard(self, fn) -> None:
        try:
            fn()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # a bug or a database outage: this request only
            self.server.log(f"{self.command} {self.path}: {type(exc).__name__}: {exc}")
            db_down = isinstance(exc, StoreError) or type(exc).__name__ == "OperationalError"
            try:
                self._error(503 if db_down else 500, f"internal error: {type(exc).__name__}",
                            close=True)
            except OSError:
                self.close_connection = True

    def do_POST(self) -> None:
        self._guard(self._post)

    def do_GET(self) -> None:
        self._guard(self._get)

    def _post(self) -> None:
        kind = urlsplit(self.path).path.rstrip("/")
        if kind not in ("/v1/reports", "/v1/jobs"):
            return self._error(404, "not found; POST /v1/reports or /v1/jobs", close=True)
        if not self._authorised(write=True, jobs=kind == "/v1/jobs"):
            return
        if self.headers.get("Transfer-Encoding"):
            return self._error(411, "send Content-Length, not a chunked body", close=True)
        length = self.headers.get("Content-Length")
        if length is None:
            return self._error(411, "Content-Length required", close=True)
        if not length.strip().isdigit():
            return self._error(400, f"Content-Length: not a number: {length[:40]!r}", close=True)
        n = int(length)
        if n > self.server.max_body:
            return self._error(413, f"body of {n} bytes is above the limit of "
                               f"{self.server.max_body} bytes", close=True)
        body = self.rfile.read(n)
        if len(body) < n:
            self.close_connection = True
            return
        try:
            items = parse(body) if kind == "/v1/reports" else parse_jobs(body)
        except Invalid as exc:
            return self._error(400, str(exc)[:500])
        if kind == "/v1/jobs":                 # idempotent: a summary sent again is not stored again
            stored = self.server.job_writer.add(items)
            return self._send(201 if any(stored) else 200,
                              {"stored": sum(stored), "duplicates": len(stored) - sum(stored)})
        ids = self.server.writer.add(items)
        self._send(201, {"ids": ids, "stored": len(ids)})

    def _get(self) -> None:
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        if path == "/healthz":
            return self._send(200, {"status": "ok"})
        if not self._authorised(write=False):
            return
        store = self.server.store
        parts = [unquote(p) for p in path.strip("/").split("/")]
        try:
            if parts == ["v1", "nodes", "failing"]:
                since = parse_since(query.get("since", ["24h"])[-1])
                limit = _int(query, "limit", 20, 10_000)
                return self._send(200, {"since": time.time() - since,
                                        "nodes": store.failing(time.time() - since, limit)})
            if len(parts) == 4 and parts[:2] == ["v1", "nodes"] and parts[3] == "history":
                limit = _int(query, "limit", 20, 1000)
                return self._send(200, {"node": parts[2], "reports": store.history(parts[2], limit)})
            if len(parts) == 3 and parts[:2] == ["v1", "jobs"]:
                reps, summaries = store.job(parts[2]), store.job_summaries(parts[2])
                if not reps and not summaries:
                    return self._error(404, f"no reports or summaries for job {parts[2]!r}")
                return self._send(200, {"job_id": parts[2], "reports": reps, "summaries": summaries})
            if parts == ["v1", "fleet"]:
                from hpcml.vet.fleet.centre import build
                since = parse_since(query.get("since", ["30d"])[-1])
                return self._send(200, build(store, since, top=_int(query, "top", 20, 10_000)))
        except ValueError as exc:
            return self._error(400, str(exc))
        self._error(404, "not found")


class CollectorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], store: Store, tokens: Tokens,
                 max_body: int = DEFAULT_MAX_BODY, verbose: bool = False) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, Handler)
        self.store, self.tokens, self.max_body, self.verbose = store, tokens, max_body, verbose
        self.writer = BatchWriter(store)
        self.job_writer = BatchWriter(store, write=store.add_jobs)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # getsockname() of an AF_INET(6) socket
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def log(self, line: str) -> None:
        print(f"hpcml vet serve: {line}", file=sys.stderr, flush=True)

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        self.log(f"{client_address[0]}: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Stop serving (if serving), finish pending writes, close the database."""
        self.shutdown()
        self.server_close()
        self.writer.close()
        self.job_writer.close()
        self.store.close()


def start(store: Store, tokens: Tokens, bind: str = "127.0.0.1", port: int = 0,
          max_body: int = DEFAULT_MAX_BODY, verbose: bool = False) -> CollectorServer:
    """A collector serving from a background thread; ``close()`` stops it."""
    server = CollectorServer((bind, port), store, tokens, max_body, verbose)
    threading.Thread(target=server.serve_forever, args=(0.1,), name="collector",
                     daemon=True).start()
    return server
