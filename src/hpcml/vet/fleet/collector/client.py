"""Send a vetting report to a collector; used by ``hpcml vet run --report-to URL``.

Reporting is a side effect of vetting and must never change its outcome: every failure
becomes one warning line on stderr and a returned string, never an exception. The
standard library's urllib is enough for a few POSTs. A large allocation's report is split
into node reports and sent in pieces under the collector's default body limit, all within
one overall timeout.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import orjson

PIECE = 512 * 1024  # bytes per request when a report must be split (collector limit: 1 MiB)


def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1/reports") else url + "/v1/reports"


def _pieces(report: Any, body: bytes) -> list[bytes]:
    if len(body) <= PIECE or not (isinstance(report, dict) and "nodes" in report):
        return [body]
    from hpcml.vet.fleet.collector.schema import split_vet_report
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 2
    for node in split_vet_report(report):
        one = orjson.dumps(node, default=str)
        if chunk and size + len(one) + 1 > PIECE:
            out.append(b"[" + b",".join(chunk) + b"]")
            chunk, size = [], 2
        chunk.append(one)
        size += len(one) + 1
    if chunk:
        out.append(b"[" + b",".join(chunk) + b"]")
    return out


def _post(endpoint: str, body: bytes, token: str, timeout: float) -> dict:
    req = urllib.request.Request(endpoint, data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "User-Agent": "hpcml-vet"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def send(report_json: Any, url: str, token: str | None, timeout: float = 5) -> str | None:
    """POST a report (dict from ``report.to_json``, or JSON text/bytes) to the collector at URL.

    Returns None when it was stored, else the warning line it printed to stderr.
    """
    def warn(why: str) -> str:
        line = f"hpcml vet: warning: report not sent to {url}: {why}"
        print(line, file=sys.stderr, flush=True)
        return line

    try:
        if not token:
            return warn("no token ($HPCML_VET_TOKEN or --report-token-file)")
        if isinstance(report_json, (bytes, str)):
            body = report_json.encode() if isinstance(report_json, str) else report_json
            pieces = [body]
        else:
            body = orjson.dumps(report_json, default=str)
            pieces = _pieces(report_json, body)
        endpoint = _endpoint(url)
        deadline = time.monotonic() + timeout
        for piece in pieces:
            left = deadline - time.monotonic()
            if left <= 0:
                return warn(f"timed out after {timeout:g} s")
            _post(endpoint, piece, token.strip(), left)
        return None
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read()).get("error", "")
        except Exception:
            reason = ""
        return warn(f"HTTP {exc.code}{': ' + reason if reason else ''}")
    except urllib.error.URLError as exc:
        return warn(str(exc.reason))
    except Exception as exc:  # never fail the vetting run
        return warn(f"{type(exc).__name__}: {exc}")
