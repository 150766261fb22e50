"""A real S3-compatible server for the tests, and faults in front of it.

The server is moto's (``moto_server``, from the test extra ``moto[server]``): a separate
process speaking S3's REST API over HTTP on 127.0.0.1 (SigV4-signed requests, buckets,
ranged GETs, multipart uploads with their ``-N`` ETags, paginated listings), the same
protocol boto3 speaks to Ceph RGW, MinIO or AWS. Why it and not MinIO: MinIO publishes no
package on the registries this project may use (PyPI, npm, Debian's), and moto's server is
a well-kept implementation of the API that the SDKs themselves are tested against. What
it does not model (consistency under concurrent writers, real throttling) the proxy below
injects: a ``503 SlowDown`` for the next N requests or all of them, a delay, and a 403
``InvalidAccessKeyId`` for requests signed with a given access key, as a server answers.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultProxy:
    """Forwards every request to ``upstream`` (host, port), unless told to fail it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.fail_next = 0                 # the next N requests: 503 SlowDown
        self.fail_all = False
        self.delay_s = 0.0
        self.refused_key: str | None = None
        self.requests = 0
        self.failed = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) \
                    if self.headers.get("Content-Length") else b""
                with proxy.lock:
                    proxy.requests += 1
                    fail = proxy.fail_all or proxy.fail_next > 0
                    if proxy.fail_next > 0:
                        proxy.fail_next -= 1
                    if fail:
                        proxy.failed += 1
                auth = self.headers.get("Authorization") or ""
                if proxy.refused_key and f"Credential={proxy.refused_key}/" in auth:
                    return self._error(403, "InvalidAccessKeyId",
                                       "The AWS Access Key Id you provided does not exist in our records.")
                if fail:
                    return self._error(503, "SlowDown", "Please reduce your request rate.")
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST") else None,
                             headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            def _error(self, status: int, code: str, message: str) -> None:
                body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f"<Message>{message}</Message><RequestId>hpcml-test</RequestId></Error>").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self) -> None:
        with self.lock:
            self.fail_next, self.fail_all, self.delay_s, self.refused_key = 0, False, 0.0, None
            self.requests = self.failed = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class S3:
    """One test's view: the endpoint (through the proxy), its own bucket, the proxy's knobs."""

    def __init__(self, endpoint: str, proxy: FaultProxy, bucket: str) -> None:
        self.endpoint, self.proxy, self.bucket = endpoint, proxy, bucket

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def client(self):
        import boto3
        return boto3.session.Session().client("s3")

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "hpcmltest",
                "AWS_SECRET_ACCESS_KEY": "hpcmltest-secret", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[tuple[str, FaultProxy]]:
    """moto_server on 127.0.0.1 for the session, stopped at its end; the proxy in front."""
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        pytest.fail(f"{exe}: moto[server] is not installed (the test extra installs it)")
    port = _free_port()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("moto_server did not start")
            time.sleep(0.1)
    proxy = FaultProxy(("127.0.0.1", port))
    try:
        yield f"http://127.0.0.1:{proxy.port}", proxy
    finally:
        proxy.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3(s3_server, monkeypatch) -> Iterator[S3]:
    """A fresh bucket and the standard AWS variables pointing at the server (no real config
    file read); the proxy's faults cleared after the test."""
    endpoint, proxy = s3_server
    proxy.reset()
    view = S3(endpoint, proxy, f"hpcml-{uuid.uuid4().hex[:12]}")
    for k, v in view.env().items():
        monkeypatch.setenv(k, v)
    view.client().create_bucket(Bucket=view.bucket)
    try:
        yield view
    finally:
        proxy.reset()
