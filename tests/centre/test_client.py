"""``hpcml vet --report-to``'s sender against a collector of the release before the
``unchecked`` verdict. That collector is played by a small HTTP server here (the old release
is not installed in the test venv): it takes node reports whose verdicts are good or bad,
refuses a request holding any other with 400, as the old ``NodeReport`` model did, and
stores nothing of a refused request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hpcml.centre import client


class _OldCollector(BaseHTTPRequestHandler):
    stored: list[dict[str, Any]] = []
    refuse_node: str | None = None

    def do_POST(self) -> None:                         # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        items = body if isinstance(body, list) else [body]
        bad = [i for i in items if i.get("verdict") not in ("good", "bad") or i.get("node") == self.refuse_node]
        self.send_response(400 if bad else 200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if bad:
            self.wfile.write(json.dumps({"error": "0.verdict: Input should be 'good' or 'bad'"}).encode())
            return
        type(self).stored += items
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def old_collector():
    _OldCollector.stored, _OldCollector.refuse_node = [], None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OldCollector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _OldCollector
    server.shutdown()
    server.server_close()


def _report(n: int) -> dict[str, Any]:
    """A vet report over 512 KiB (sent in pieces): node s0 skipped its only check, b1 failed."""
    nodes = {f"n{i}": {"reachable": True, "results": [{"check": "mem", "type": "memory", "outcome": "pass",
                                                        "message": "x" * 400}]} for i in range(n)}
    nodes["s0"] = {"reachable": True, "results": [{"check": "gpu", "type": "gpu", "outcome": "skipped"}]}
    nodes["b1"] = {"reachable": True, "results": [{"check": "mem", "type": "memory", "outcome": "fail"}]}
    return {"schema": "hpcml.vet/1", "job_id": "55", "started_at": 1.0, "protocol": {"name": "p"},
            "verdict": {"bad": "b1", "reasons": {"b1": ["mem"]}}, "nodes": nodes}


def test_a_large_report_loses_no_bad_node_at_a_collector_older_than_unchecked(old_collector):
    """The pieces of a large report said ``unchecked`` for a node that measured nothing; an
    older collector refused the whole piece, the bad node beside it was lost, and no piece
    after it was sent. The pieces keep the vocabulary every collector reads (a newer one
    stores a good without a measured result as unchecked)."""
    url, seen = old_collector
    report = _report(2000)
    assert len(json.dumps(report)) > client.PIECE
    assert client.send(report, url, "token", timeout=30) is None
    verdicts = {i["node"]: i["verdict"] for i in seen.stored}
    assert len(verdicts) == 2002 and verdicts["b1"] == "bad" and verdicts["s0"] == "good"


def test_a_refused_piece_does_not_stop_the_pieces_after_it(old_collector):
    """One piece refused (400) used to end the sending: every node after it was lost. The
    rest are sent, and the warning says how many pieces were refused."""
    url, seen = old_collector
    seen.refuse_node = "n0"                            # in the first piece
    warning = client.send(_report(2000), url, "token", timeout=30)
    assert warning is not None and "1 of " in warning and "pieces refused" in warning, warning
    nodes = {i["node"] for i in seen.stored}
    assert "n0" not in nodes and {"b1", "s0", "n1999"} <= nodes
