"""The live exporter's door (``hpcml.observe.export``): the node's other ranks send their
rows to local rank 0's endpoint on a Unix socket only the user can reach; what a datagram
holds never breaks ``/metrics`` or stops the receiver. The endpoint is scraped over HTTP as
Prometheus scrapes it (tests/observe/test_prometheus.py runs the real Prometheus)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
import urllib.request

import pytest

from hpcml.observe.export import PromExporter, PromForwarder, socket_path
from hpcml.ports import free_port


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        return r.read().decode()


def wait_for(port: int, text: str) -> str:
    end, got = time.monotonic() + 30, ""
    while time.monotonic() < end:
        got = scrape(port)
        if text in got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never came: {got[-2000:]}")


@pytest.fixture
def endpoint():
    port = free_port("127.0.0.1")
    e = PromExporter(port, "127.0.0.1", job="7", rank=0, node="n1")
    try:
        yield port
    finally:
        e.close()


def test_another_rank_s_rows_reach_the_endpoint_through_a_socket_only_the_user_can_reach(endpoint):
    d = socket_path(endpoint).parent
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0
    fwd = PromForwarder(endpoint, rank=5)
    fwd.update([(0, "metric", "loss", 0.25, 3, None), (0, "gpu", "sm_active", 0.5, None, 2)])
    got = wait_for(endpoint, 'rank="5"')
    assert 'hpcml_metric{name="loss",node="n1",rank="5",slurm_job="7"} 0.25' in got, got
    assert 'gpu="2"' in got
    fwd.close()


HOSTILE = [
    b'{"rank": 3, "rows": [[0, "metric", "x\\udc80", 1.0, null, null]]}',     # a lone surrogate
    b'{"rank": 1e400, "rows": []}',                                            # inf: int() overflows
    b'{"rank": 3, "rows": [[0, "metric", "big", 1e400, null, null]]}',
    b'{"rank": 3, "rows": [[0, "metric", "huge", ' + b"9" * 400 + b', null, null]]}',
    b'{"rank": 3, "rows": [[0, "metric", "step", 1.0, ' + b"9" * 400 + b', null]]}',
    b'{"rank": 3, "rows": [[0, "metric", "nan", NaN, null, null]]}',
    b'{"rank": 3, "rows": [[0, "metric", "line\\nfake 1", 1.0, null, null]]}',
    b'{"rank": 3, "rows": [[0, "metric", {"a": 1}, 1.0, null, null]]}',
    b'{"rank": 3, "rows": "not a list"}', b'{"rank": true, "rows": []}', b"[1, 2]", b"\xff\xfe", b"",
    b'{"rank": 3, "rows": [[0, "gpu", "g", 1.0, null, {"x": 1}]]}',
]


def test_no_datagram_breaks_the_scrape_or_stops_the_receiver(endpoint):
    """Each of these once ended the receiver thread or made every later scrape fail (500)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for data in HOSTILE:
        s.sendto(data, str(socket_path(endpoint)))
    fwd = PromForwarder(endpoint, rank=2)
    fwd.update([(0, "metric", "after", 1.5, 1, None)])
    got = wait_for(endpoint, 'name="after"')
    for bad in ("huge", "x\\udc80"):                  # no float holds it; no scrape could encode it
        assert f'name="{bad}' not in got, got
    assert 'name="nan",node="n1",rank="3",slurm_job="7"} NaN' in got, got     # a diverged loss is shown as it is
    assert 'name="line\\nfake 1"' in got and not any(ln.startswith("fake") for ln in got.splitlines()), got
    s.close()
    fwd.close()


def test_another_user_cannot_send_rows(endpoint, tmp_path):
    """A real second Unix user (made here with useradd) is refused by the socket's directory."""
    if os.geteuid() != 0:
        pytest.fail("the multi-user test needs root (useradd): CI runs as root")
    name = "hpcmlexport"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], capture_output=True)
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            "try:\n    s.sendto(b'{\"rank\": 9, \"rows\": [[0, \"metric\", \"forged\", 1.0, null, null]]}', sys.argv[1])\n"
            "    print('sent')\nexcept PermissionError:\n    print('refused')\n")
    out = subprocess.run(["runuser", "-u", name, "--", "/usr/bin/python3", "-c", code, str(socket_path(endpoint))],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.stdout.strip() == "refused", (out.stdout, out.stderr)
    PromForwarder(endpoint, rank=1).update([(0, "metric", "ours", 1.0, None, None)])
    assert 'name="forged"' not in wait_for(endpoint, 'name="ours"')


def test_a_second_endpoint_of_the_user_on_the_port_is_refused_not_handed_the_rows(endpoint):
    """Another job of the same user asking for the same port at another address: refused as
    the port itself would be (it once unlinked the first job's socket and took its rows)."""
    with pytest.raises(OSError) as err:
        PromExporter(endpoint, "127.0.0.2", job="8", rank=0, node="n1")
    assert "another endpoint" in str(err.value)
    PromForwarder(endpoint, rank=1).update([(0, "metric", "still_ours", 1.0, None, None)])
    wait_for(endpoint, 'name="still_ours"')


def test_a_stalled_endpoint_drops_rows_and_never_stalls_the_sender(tmp_path, monkeypatch):
    """An endpoint that reads nothing (rank 0 stopped): the other ranks' sends drop their rows
    instead of blocking their recorders (a datagram socket's full queue blocks a sender)."""
    import threading
    port = free_port("127.0.0.1")
    path = socket_path(port)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.unlink(missing_ok=True)
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    deaf.bind(str(path))
    fwd = PromForwarder(port, rank=1)
    sender = threading.Thread(target=lambda: [fwd.update([(0, "metric", "m", float(i), i, None)]) for i in range(2000)])
    sender.start()
    sender.join(60)
    try:
        assert not sender.is_alive(), "a forwarder blocked on a full queue"
    finally:
        deaf.close()
        path.unlink(missing_ok=True)


def test_a_temporary_directory_too_long_for_a_socket_falls_back_to_tmp(tmp_path, monkeypatch):
    long = tmp_path / ("d" * 100)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    port = free_port("127.0.0.1")
    assert str(socket_path(port)).startswith("/tmp/hpcml-")
    e = PromExporter(port, "127.0.0.1", job="7", rank=0, node="n1")
    try:
        PromForwarder(port, rank=4).update([(0, "metric", "loss", 1.0, None, None)])
        wait_for(port, 'rank="4"')
    finally:
        e.close()
