"""hpcml centre serve: a real collector over HTTP on SQLite and on PostgreSQL, and its client."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from hpcml.centre import client
from hpcml.centre.client import send
from tests.centre.conftest import READ_TOKEN, TOKEN, TRUSTED_TOKEN


def call(server, method: str, path: str, body=None, token: str | None = TOKEN,
         headers: dict | None = None) -> tuple[int, dict]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    conn.request(method, path, body=body, headers=hdrs)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, (json.loads(data) if data else {})


def raw(server, data: bytes, read: bool = True) -> bytes:
    """Bytes straight onto the socket; whatever comes back before the server closes."""
    host, port = server.server_address[:2]
    out = b""
    with socket.create_connection((host, port), timeout=10) as s:
        try:
            s.sendall(data)
            if not read:
                return b""
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server may already have answered and closed
            pass
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return out


def node_report(node="n1", job="100", t=None, verdict="good", outcomes=("pass", "pass")):
    return {"job_id": job, "node": node, "time": time.time() if t is None else t,
            "protocol": "cpu", "verdict": verdict,
            "results": [{"name": f"c{i}", "type": "memory", "outcome": o, "value": 1.5 * i,
                         "unit": "GB", "message": f"{o} {i}", "duration": 0.01}
                        for i, o in enumerate(outcomes)]}


def stored(server) -> dict:
    """Rows of the vetting tables (the job tables: test_jobs.py)."""
    return {k: v for k, v in server.store.count().items() if k in ("reports", "results")}


def test_store_and_query(collector):
    now = time.time()
    posts = [node_report("n1", "100", now - 30, "bad", ("fail", "pass", "error")),
             node_report("n2", "100", now - 30, "good"),
             [node_report("n1", "101", now - 10, "bad", ("fail", "pass")),
              node_report("n2", "101", now - 10, "bad", ("pass", "fail"))],
             node_report("n3", "old", now - 3 * 86400, "bad", ("fail",) * 4)]
    ids = []
    for body in posts:
        code, answer = call(collector, "POST", "/v1/reports", body, token=TRUSTED_TOKEN)
        assert code == 201, answer
        ids += answer["ids"]
    assert len(ids) == len(set(ids)) == 5
    assert stored(collector) == {"reports": 5, "results": 13}
    # a write token's reports prove nothing: stored, shown in a node's history, never counted as failing
    code, answer = call(collector, "POST", "/v1/reports", node_report("n4", "102", now - 5, "bad", ("fail",) * 5))
    assert code == 201 and answer["unverified"] == 1, answer

    code, hist = call(collector, "GET", "/v1/nodes/n1/history?limit=10")
    assert code == 200
    assert [r["job_id"] for r in hist["reports"]] == ["101", "100"]  # newest first
    first = hist["reports"][1]
    assert [c["name"] for c in first["results"]] == ["c0", "c1", "c2"]
    assert first["results"][0] == {"name": "c0", "type": "memory", "outcome": "fail",
                                   "value": 0.0, "unit": "GB", "message": "fail 0",
                                   "duration": 0.01}
    assert call(collector, "GET", "/v1/nodes/n1/history?limit=1")[1]["reports"][0]["job_id"] == "101"
    assert call(collector, "GET", "/v1/nodes/nobody/history")[1]["reports"] == []

    code, failing = call(collector, "GET", "/v1/nodes/failing?since=24h")
    assert code == 200
    assert [(n["node"], n["failures"], n["reports"]) for n in failing["nodes"]] == [
        ("n1", 3, 2), ("n2", 1, 1)]  # n3's failures are older than 24 h
    week = call(collector, "GET", "/v1/nodes/failing?since=7d&limit=1")[1]["nodes"]
    assert [n["node"] for n in week] == ["n3"]

    code, job = call(collector, "GET", "/v1/jobs/101")
    assert code == 200 and [r["node"] for r in job["reports"]] == ["n1", "n2"]
    assert [c["outcome"] for c in job["reports"][1]["results"]] == ["pass", "fail"]
    assert call(collector, "GET", "/v1/jobs/999")[0] == 404
    assert call(collector, "GET", "/v1/nodes/failing?since=soon")[0] == 400
    assert call(collector, "GET", "/v1/nodes/n1/history?limit=0")[0] == 400
    assert call(collector, "GET", "/healthz", token=None)[0] == 200


def test_whole_vet_report_is_split_by_node(collector):
    """The JSON of `hpcml vet run` (report.to_json of a real run) is accepted as it is."""
    from hpcml.vet.engine import VetRun
    from hpcml.vet.model import CheckResult, NodeReport, Outcome
    from hpcml.vet.protocol import loads
    from hpcml.vet.report import to_json
    from hpcml.vet.verdict import decide
    proto = loads("name: p\nevals:\n  - {name: mem, type: memory}\n  - {name: env, type: env}\n")
    nodes = ["n1", "n2", "n3"]
    reports = {n: NodeReport(node=n, results=[
        CheckResult(node=n, check="mem", type="memory", unit="B", value=1e9,
                    outcome=Outcome.FAIL if n == "n2" else Outcome.PASS),
        CheckResult(node=n, check="env", type="env", outcome=Outcome.PASS, value="ok")])
        for n in nodes[:2]}
    reports["n3"] = NodeReport(node="n3", reachable=False, message="no result")
    verdict = decide(nodes, reports, {"mem": True, "env": True}, min_nodes=1)
    run = VetRun(protocol=proto, nodes=nodes, reports=reports, verdict=verdict,
                 started_at=time.time(), duration=1.0, job_id="777")
    code, answer = call(collector, "POST", "/v1/reports", json.loads(json.dumps(to_json(run))))
    assert code == 201, answer
    assert answer["stored"] == 3
    job = call(collector, "GET", "/v1/jobs/777")[1]["reports"]
    assert {r["node"]: r["verdict"] for r in job} == {"n1": "good", "n2": "bad", "n3": "bad"}
    assert job[0]["protocol"] == "p" and job[0]["results"][0]["name"] == "mem"
    assert job[0]["results"][1]["value"] == "ok" and job[2]["results"] == []


def test_tokens(collector):
    body = node_report()
    assert call(collector, "POST", "/v1/reports", body, token=None)[0] == 401
    assert call(collector, "POST", "/v1/reports", body, token="wrong")[0] == 401
    assert call(collector, "POST", "/v1/reports", body, token=TOKEN + "x")[0] == 401
    assert call(collector, "POST", "/v1/reports", body, token=None,
                headers={"Authorization": f"Basic {TOKEN}"})[0] == 401
    assert call(collector, "POST", "/v1/reports", body, token=READ_TOKEN)[0] == 401
    assert stored(collector) == {"reports": 0, "results": 0}
    for path in ("/v1/nodes/n1/history", "/v1/nodes/failing", "/v1/jobs/100"):
        assert call(collector, "GET", path, token=None)[0] == 401
        assert call(collector, "GET", path, token="wrong")[0] == 401
    assert call(collector, "GET", "/v1/nodes/n1/history", token=READ_TOKEN)[0] == 200


@pytest.mark.parametrize("body, field", [
    (b"{not json", "invalid JSON"),
    (b"\xff\xfe\x00garbage", "invalid JSON"),
    ({**node_report(), "node": 5}, "node"),
    ({**node_report(), "time": "yesterday"}, "time"),
    ({k: v for k, v in node_report().items() if k != "verdict"}, "verdict"),
    ({**node_report(), "verdict": "maybe"}, "verdict"),
    ({**node_report(), "results": [{"name": "x", "outcome": "exploded"}]}, "results.0.outcome"),
    ({**node_report(), "results": [{"outcome": "pass"}]}, "results.0.name"),
    ({**node_report(), "results": {"a": 1}}, "results"),
    ({**node_report(), "node": "n\x001"}, "node"),
    ([node_report(), 3], "1"),
    ("just a string", "body"),
    ({"schema": "hpcml.vet/1", "nodes": []}, "nodes"),
    ({"schema": "hpcml.vet/2", "nodes": {}}, "schema: written by a newer hpcml"),
    ({"schema": "hpcml.scan/1", "nodes": {}}, "schema: not an hpcml.vet document"),
])
def test_malformed_refused_with_reason(collector, body, field):
    code, answer = call(collector, "POST", "/v1/reports", body)
    assert code == 400
    assert answer["error"].startswith(field) and "\n" not in answer["error"]
    assert stored(collector)["reports"] == 0


def test_size_limits(collector):
    big = node_report(outcomes=("pass",) * 2000)  # > 64 KiB, the fixture's --max-body
    code, answer = call(collector, "POST", "/v1/reports", big)
    assert code == 413 and "limit" in answer["error"]
    # refused from Content-Length alone: the server answers before any body is sent
    head = (f"POST /v1/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Length: 1000000000\r\n\r\n").encode()
    assert raw(collector, head).startswith(b"HTTP/1.1 413")
    no_length = f"POST /v1/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    assert raw(collector, no_length.encode()).startswith(b"HTTP/1.1 411")
    # a chunked body is read (bounded by the same limit) and judged like any other
    chunked = no_length.replace("\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert raw(collector, chunked.encode()).startswith(b"HTTP/1.1 400")
    big_chunks = no_length.replace("\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n") + \
        "10000\r\n" + "x" * 65536 + "\r\n0\r\n\r\n"
    assert raw(collector, big_chunks.encode()).startswith(b"HTTP/1.1 413")
    assert stored(collector)["reports"] == 0


def test_survives_garbage(collector):
    rng = random.Random(8)
    for _ in range(20):
        raw(collector, rng.randbytes(rng.randint(1, 4000)))
    raw(collector, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n")
    raw(collector, b"POST /v1/reports HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n")
    raw(collector, f"POST /v1/reports HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                   "Content-Length: 500\r\n\r\n{\"node\"".encode(), read=False)  # hangs up early
    raw(collector, f"POST /v1/reports HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                   "Content-Length: -5\r\n\r\n".encode())
    code, answer = call(collector, "POST", "/v1/reports", node_report())
    assert code == 201, answer
    assert stored(collector)["reports"] == 1


def test_keep_alive_many_requests(collector):
    host, port = collector.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    for i in range(50):
        conn.request("POST", "/v1/reports", body=json.dumps(node_report(f"k{i}")).encode(),
                     headers={"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        assert resp.status == 201
        resp.read()
    conn.close()
    assert stored(collector)["reports"] == 50


def test_client_send(collector, monkeypatch, capsys):
    assert send(node_report("c1"), collector.url, TOKEN) is None
    assert send(json.dumps(node_report("c2")), collector.url + "/v1/reports", TOKEN) is None
    # a large vet report goes in pieces of node reports
    monkeypatch.setattr(client, "PIECE", 2000)
    whole = {"schema": "hpcml.vet/1", "job_id": "55", "started_at": time.time(),
             "protocol": {"name": "p"}, "verdict": {"bad": "b[1-3]", "good": "g[1-20]"},
             "nodes": {n: {"node": n, "reachable": True, "results": [
                 {"check": "mem", "type": "memory", "outcome": "pass", "value": 1.0}]}
                 for n in [f"g{i}" for i in range(1, 21)] + ["b1", "b2", "b3"]}}
    assert send(whole, collector.url, TOKEN) is None
    job = call(collector, "GET", "/v1/jobs/55")[1]["reports"]
    assert len(job) == 23 and sum(r["verdict"] == "bad" for r in job) == 3
    warning = send(node_report(), collector.url, "wrong")
    assert warning and "401" in warning
    assert send(node_report(), collector.url, None)
    assert capsys.readouterr().err.count("warning") == 2


def test_send_to_dead_url_warns(capsys):
    from hpcml.ports import free_port
    port = free_port("127.0.0.1")
    t0 = time.monotonic()
    warning = send(node_report(), f"http://127.0.0.1:{port}", TOKEN, timeout=2)
    assert warning and "not sent" in warning
    assert send(node_report(), "not a url", TOKEN)
    assert send(node_report(), "http://[::1", TOKEN)
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("hpcml vet: warning:") for line in err)


SERVE = "import sys; from hpcml.centre.cli import app; app(['serve', *sys.argv[1:]])"


def test_serve_command(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# writers\n{TOKEN}\n")
    env = {k: v for k, v in os.environ.items() if k != "HPCML_VET_TOKEN"}
    # --slurm-check off: what is proven of the report depends on whether this host runs
    # Slurm and munged now (tests/centre/collector/test_report_proof*.py test that); here the command
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "--db", f"sqlite:///{tmp_path}/v.db",
                             "--port", "0", "--token-file", str(tokens), "--slurm-check", "off"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:"), proc.stderr.read()
        url = line.split()[-1]
        assert send(node_report("s1"), url, TOKEN) is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
    import sqlite3
    with sqlite3.connect(tmp_path / "v.db") as conn:
        assert conn.execute("SELECT node FROM reports").fetchall() == [("s1",)]
    # no token anywhere: refuses to start, exit 2
    r = subprocess.run([sys.executable, "-c", SERVE, "--port", "0"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no token" in r.stderr
    # from the environment; 0.0.0.0 warns
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "--db", f"sqlite:///{tmp_path}/v.db",
                             "--port", "0", "--bind", "0.0.0.0"], cwd=tmp_path,
                            env={**env, "HPCML_VET_TOKEN": TOKEN},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("listening on http://0.0.0.0:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        assert "hpcml centre serve: warning: listening on every interface" in proc.stderr.read()
    finally:
        proc.kill()


def test_bad_database_url():
    from hpcml.centre.collector.store import StoreError, open_store
    for url in ("mysql://x/y", "sqlite:///", "sqlite:///:memory:"):
        with pytest.raises(StoreError):
            open_store(url)
