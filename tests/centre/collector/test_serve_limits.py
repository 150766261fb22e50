"""``hpcml centre serve`` cannot be starved: slow and idle connections, floods of unfinished
bodies, malformed headers, a database that goes away, and several collector processes on
one PostgreSQL. Each collector is a real process; its memory is read from /proc."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcml.ports import free_port
from tests.centre.conftest import TOKEN
from tests.centre.jobdocs import event, summary
from tests.centre.pgcluster import PgCluster
from tests.vet.reports import vet_report

TRUSTED = "trusted-token-0123456789abcdef"   # the centre's own tool: its summaries count as sent


class Serve:
    """``hpcml centre serve`` in its own process."""

    def __init__(self, db: str, *args: str, trusted: Path | None = None) -> None:
        self.port = free_port("127.0.0.1")
        if trusted is not None:
            trusted.write_text(TRUSTED + "\n")
            args = (*args, "--trusted-token-file", str(trusted))
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcml", "centre", "serve", "--db", db, "--port",
                                      str(self.port), *args], env={**os.environ, "HPCML_VET_TOKEN": TOKEN},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, line

    def call(self, method: str, path: str, body=None, timeout: float = 10, token: str = TOKEN) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        out = resp.read()
        conn.close()
        return resp.status, json.loads(out) if out else {}

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture
def serve(tmp_path):
    started: list[Serve] = []

    def make(db: str | None = None, *args: str) -> Serve:
        s = Serve(db or f"sqlite:///{tmp_path}/c.db", *args, trusted=tmp_path / f"trusted-{len(started)}")
        started.append(s)
        return s
    try:
        yield make
    finally:
        for s in started:
            s.stop()


def _open(port: int, n: int, first: bytes) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(first)
        out.append(s)
    return out


def _closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_six_hundred_half_sent_requests_neither_starve_healthz_nor_outlive_the_deadline(serve):
    srv = serve(None, "--request-deadline", "2", "--max-connections", "1000")
    head = f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Le".encode()
    socks = _open(srv.port, 600, head)
    try:
        assert srv.call("GET", "/healthz", timeout=5) == (200, {"status": "ok"})     # not starved
        assert srv.call("POST", "/v1/jobs", summary("1"), timeout=5)[0] == 201
        # a byte every half second keeps no request alive past its deadline
        trickle = socks[0]
        for _ in range(4):
            try:
                trickle.sendall(b"n")
            except OSError:
                break
            time.sleep(0.5)
        assert all(_closed_by_server(s, 10) for s in socks[:50] + socks[-50:])
    finally:
        for s in socks:
            s.close()


def test_one_client_holding_every_connection_with_slow_bytes_cannot_keep_healthz_out(serve):
    """Three times --max-connections, each trickling header bytes (the backlog full too):
    when the slots fill up the oldest slow requests are dropped, so /healthz gets in long
    before the request deadline would free them."""
    srv = serve(None, "--max-connections", "100", "--request-deadline", "30")
    socks: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            for s in list(socks):
                try:
                    s.send(b"X")
                except OSError:
                    pass
            stop.wait(0.5)
    for _ in range(300):
        try:
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
            s.setblocking(False)
            s.send(b"POST /v1/jobs HTTP/1.1\r\nX-Slow: ")
            socks.append(s)
        except OSError:
            break
    t = threading.Thread(target=trickle)
    t.start()
    try:
        assert srv.call("GET", "/healthz", timeout=25)[0] == 200      # bounded: 30 s would be the deadline
    finally:
        stop.set()
        t.join(10)
        for s in socks:
            s.close()


def test_a_flood_of_unfinished_bodies_stays_out_of_memory(serve):
    """300 requests each send 1 MiB less a byte of a body they never finish: the collector
    keeps them on disk, its memory barely moves, and it still answers."""
    srv = serve(None, "--request-deadline", "3")
    base = srv.rss_mb()
    n, size = 300, (1 << 20) - 1
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    chunk = b"x" * (size - 1)
    socks: list[socket.socket] = []

    def flood(k: int) -> None:
        for s in _open(srv.port, k, head):
            socks.append(s)
            try:
                s.sendall(chunk)
            except OSError:
                pass
    threads = [threading.Thread(target=flood, args=(n // 4,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        peak = srv.rss_mb()
        assert peak - base < 64, (base, peak)            # 300 MiB sent, well under 64 MiB held
        assert srv.call("GET", "/healthz", timeout=5)[0] == 200
        assert all(_closed_by_server(s, 15) for s in socks[:20])
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("length", ["²", "-5", "1e3", "0x10", "1,2"])
def test_a_malformed_content_length_is_400(serve, length):
    srv = serve()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  f"Content-Length: {length}\r\n\r\n{{}}".encode())
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert srv.call("GET", "/healthz")[0] == 200


def test_control_characters_anywhere_in_a_summary_are_400(serve):
    srv = serve()
    for bad in (summary("1", culprits=[event("nid001", 0, detail="a\x1b[31mred")]),
                summary("2", user="al\nice"), summary("3", culprits=[event("nid\x07001", 0)])):
        code, answer = srv.call("POST", "/v1/jobs", bad)
        assert code == 400 and "control characters" in answer["error"], answer


def test_postgresql_down_is_503_and_the_collector_recovers(serve):
    cluster = PgCluster().start()
    try:
        url = cluster.create_db("down")
        srv = serve(url)
        assert srv.call("POST", "/v1/jobs", summary("1"))[0] == 201
        cluster.halt()
        code, answer = srv.call("POST", "/v1/jobs", summary("2"), timeout=60)
        assert code == 503, answer
        assert srv.call("GET", "/v1/jobs/1", timeout=60)[0] == 503
        assert srv.call("GET", "/healthz")[0] == 200
        cluster.start_again()
        deadline = time.monotonic() + 60
        while (code := srv.call("POST", "/v1/jobs", summary("2"), timeout=60)[0]) == 503 \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert code == 201
    finally:
        cluster.stop()


def test_several_collector_processes_on_one_postgresql(serve, pg_cluster):
    """Two collector processes behind one name (a load balancer's view): four senders post
    attempts 0 and 1 of the same jobs to either, interleaved; each attempt is stored once and
    each job keeps one latest attempt."""
    url = pg_cluster.create_db("several")
    a, b = serve(url), serve(url)

    def send(srv: Serve, attempt: int, jobs: range) -> None:
        for j in jobs:
            assert srv.call("POST", "/v1/jobs", summary(f"m{j}", attempt, hours=1.0 + attempt),
                            token=TRUSTED)[0] in (200, 201)
    threads = [threading.Thread(target=send, args=(srv, att, range(40)))
               for srv in (a, b) for att in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    import psycopg
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT job, attempt, latest FROM jobs ORDER BY job, attempt").fetchall()
    assert len(rows) == 80 and {(j, att) for j, att, _ in rows} == {(f"m{j}", att) for j in range(40) for att in (0, 1)}
    assert sorted(j for j, att, latest in rows if latest) == sorted(f"m{j}" for j in range(40))
    assert all(att == 1 for _, att, latest in rows if latest)


def _hostile_reports() -> list[bytes]:
    """Small requests that would cost much if expanded or held: a valid vet report of 656 bytes
    whose verdict names 16 x 65,536 hosts; a 1 MiB list of the smallest node reports; one
    node report with 10,000 results (the per-report cap)."""
    report = vet_report({"n1": []}, job_id="1")
    report["verdict"]["bad"] = ",".join(f"h{i}x[1-65536]" for i in range(16))
    bomb = json.dumps(report).encode()
    tiny = b'{"node":"n","time":1,"verdict":"bad"}'
    many = b"[" + b",".join([tiny] * ((1 << 20) // (len(tiny) + 1) - 1)) + b"]"
    result = b'{"name":"x","outcome":"fail"}'
    wide = (b'{"node":"n","time":1,"verdict":"bad","results":[' + b",".join([result] * 10_000) + b"]}")
    return [bomb, many, wide]


@pytest.mark.machine     # healthz answers within 1 s while 32 senders flood the server: the CPUs to itself
def test_thirty_two_hostile_reports_at_once_neither_grow_memory_nor_starve_healthz(serve):
    """Memory for the requests in flight is bounded before anything is expanded: 32
    concurrent hostile reports (each shape above, again and again) leave the collector less
    than 64 MB larger, and /healthz answers each probe within its 1 s timeout throughout."""
    srv = serve()
    for _ in range(3):                       # warm: the first of each shape loads its code
        for body in _hostile_reports():
            srv.call("POST", "/v1/reports", body, timeout=60)
    before = srv.rss_mb()
    bodies = _hostile_reports()
    codes: list[int] = []
    stop = threading.Event()

    def flood(i: int) -> None:
        while not stop.is_set():
            codes.append(srv.call("POST", "/v1/reports", bodies[i % len(bodies)], timeout=60)[0])

    workers = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(32)]
    for w in workers:
        w.start()
    peak, late = before, []
    try:
        for _ in range(20):
            t0 = time.monotonic()
            try:
                srv.call("GET", "/healthz", timeout=1.0)
            except (TimeoutError, OSError) as exc:
                late.append(f"{type(exc).__name__} after {time.monotonic() - t0:.2f} s")
            peak = max(peak, srv.rss_mb())
            time.sleep(0.25)
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    assert not late, late
    assert peak - before < 64, (before, peak)
    assert codes and set(codes) <= {201, 400}, sorted(set(codes))
    assert 400 in codes                      # the bomb is refused, not expanded
