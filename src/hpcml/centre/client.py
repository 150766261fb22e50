"""Send to a collector: a vetting report (``hpcml vet run --report-to URL``), a job summary
(``hpcml run --collector URL``).

Reporting is a side effect of vetting and must never change its outcome: every failure
becomes one warning line on stderr and a returned string, never an exception. The
standard library's urllib is enough for a few POSTs. A large allocation's report is split
into node reports and sent in pieces under the collector's default body limit, all within
one overall timeout.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hpcml import logs

log = logs.get(__name__)

PIECE = 512 * 1024  # bytes per request when a report must be split (collector limit: 1 MiB)


def _endpoint(url: str, path: str = "/v1/reports") -> str:
    url = url.rstrip("/")
    return url if url.endswith(path) else url + path


def _signed(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with a MUNGE credential of this process's uid over it (``auth.munge``), which
    is what lets the collector count it as evidence: root's or SlurmUser's on the node it is
    about (a prolog) as the node's, a user's as their job's. Unchanged without MUNGE."""
    from hpcml.centre.collector.proof import AUTH_KEY, credential
    plain = orjson.loads(orjson.dumps({k: v for k, v in doc.items() if k != AUTH_KEY}, default=str))
    auth = credential(plain)
    return {**plain, AUTH_KEY: auth} if auth else plain


def _pieces(report: Any, body: bytes) -> list[bytes]:
    """The requests a report goes in, each document signed: a whole vet report over 512 KiB
    is sent as lists of node reports."""
    if not isinstance(report, dict):
        return [body]
    if "nodes" not in report or len(body) <= PIECE:
        return [orjson.dumps(_signed(report), default=str)]
    from hpcml.centre.collector.schema import split_vet_report
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 2
    for node in split_vet_report(report):
        if node["verdict"] == "unchecked":
            # a piece mixes nodes: one a collector before 'unchecked' refuses loses the bad nodes beside it.
            # 'good' with no measured result is what it was sent as then; a newer collector stores it as
            # unchecked (``NodeReport``), an older one as before
            node = {**node, "verdict": "good"}
        one = orjson.dumps(_signed(node), default=str)
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


def _why(exc: Exception) -> str:
    """One line for a failed POST: the collector's own reason where it gave one."""
    if isinstance(exc, urllib.error.HTTPError):
        try:
            reason = json.loads(exc.read()).get("error", "")
        except Exception:
            reason = ""
        return f"HTTP {exc.code}{': ' + reason if reason else ''}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Refusal:
    """Why a POST did not land: ``status`` is the HTTP status (None: no answer). ``final``:
    the collector refused this document for good (sending it again gets the same answer)."""

    why: str
    status: int | None = None

    @property
    def final(self) -> bool:
        return self.status is not None and 400 <= self.status < 500 and self.status not in (401, 403, 408, 429)


def post(url: str, path: str, doc: Any, token: str | None, timeout: float) -> Refusal | None:
    """POST one JSON document to the collector at ``url`` + ``path``; None when it was
    taken (stored now or before). Never raises, and never takes longer than ``timeout``
    in all (a collector that answers a byte at a time is given up on, not waited for)."""
    if not token:
        return Refusal("no token ($HPCML_COLLECTOR_TOKEN or $HPCML_VET_TOKEN)")
    if timeout <= 0:
        return Refusal("timed out")
    try:
        body = orjson.dumps(doc, default=str)
    except (TypeError, orjson.JSONEncodeError) as exc:
        return Refusal(f"not JSON: {exc}", 400)
    out: list[Refusal | None] = []

    def attempt() -> None:
        try:
            _post(_endpoint(url, path), body, token.strip(), timeout)
            out.append(None)
        except urllib.error.HTTPError as exc:
            out.append(Refusal(_why(exc), exc.code))
        except Exception as exc:  # never fail the job that sends
            out.append(Refusal(_why(exc)))

    worker = threading.Thread(target=attempt, name="hpcml-collector-post", daemon=True)
    worker.start()
    worker.join(timeout)
    return out[0] if out else Refusal(f"no answer within {timeout:.1f} s")


def read_token(token_file: Path | None) -> tuple[str | None, str | None]:
    """The collector token from ``token_file`` (else ``$HPCML_VET_TOKEN``): (token, None) or
    (None, why not). Never raises: a token file that is unreadable, not text or a FIFO must
    not turn a verdict already reached into a traceback (a prolog's "Prolog error")."""
    tokens, why = tokens_of(token_file)
    if why is not None:
        return None, f"token file {token_file}: {why}"
    return (tokens[0], None) if tokens and tokens[0] else (None, "no token ($HPCML_VET_TOKEN or --report-token-file)")


def post_report(doc: dict[str, Any], url: str, token: str | None, deadline: float) -> Refusal | None:
    """One node report, signed now (``_signed``: MUNGE where there is one), to
    ``/v1/reports``, by ``deadline`` (``time.monotonic()``), signing included."""
    if not isinstance(doc, dict):
        return Refusal("not a report (a JSON object)", 400)
    try:
        signed = _signed(doc)
    except Exception as exc:  # noqa: BLE001 - a report that cannot even be signed is not sent
        return Refusal(_why(exc))
    left = deadline - time.monotonic()
    if left <= 0:
        return Refusal("no time left after signing")
    return post(url, "/v1/reports", signed, token, left)


def send_with_token_file(report_json: Any, url: str, token_file: Path | None, timeout: float = 5) -> str | None:
    """``send`` with the token read from ``token_file`` (else ``$HPCML_VET_TOKEN``): what
    ``hpcml vet --report-to`` and its prolog mode do. A file that cannot be read is a warning."""
    tokens, why = tokens_of(token_file)
    if why is not None:
        line = f"hpcml vet: warning: report not sent to {url}: token file {token_file}: {why}"
        log.warning(line)
        return line
    return send(report_json, url, tokens[0] if tokens else "", timeout)


def tokens_of(token_file: Path | None) -> tuple[list[str], str | None]:
    """The tokens of ``token_file`` (else ``$HPCML_VET_TOKEN``) and None, or [] and why it
    gives none: never an exception, whatever is at that path (a FIFO, binary, a directory)."""
    from hpcml.centre.collector.server import read_tokens
    try:
        return read_tokens(token_file), None
    except FileNotFoundError:
        return [], "file not found"
    except OSError as exc:
        return [], f"cannot read it: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        return [], f"not UTF-8 text (bad byte at offset {exc.start})"
    except ValueError as exc:                   # a FIFO, a directory, a device, too large
        return [], str(exc)


def send(report_json: Any, url: str, token: str | None, timeout: float = 5) -> str | None:
    """POST a report (dict from ``report.to_json``, or JSON text/bytes) to the collector at URL.

    Returns None when it was stored, else the warning line it printed to stderr.
    """
    def warn(why: str) -> str:
        line = f"hpcml vet: warning: report not sent to {url}: {why}"
        log.warning(line)
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
        refused: list[str] = []
        for piece in pieces:
            left = deadline - time.monotonic()
            if left <= 0:
                return warn(f"timed out after {timeout:g} s")
            try:
                _post(endpoint, piece, token.strip(), left)
            except urllib.error.HTTPError as exc:      # this piece's nodes: the others still go
                if len(pieces) == 1:
                    raise
                refused.append(_why(exc))
        if refused:
            return warn(f"{len(refused)} of {len(pieces)} pieces refused ({refused[0]})")
        return None
    except Exception as exc:  # never fail the vetting run
        return warn(_why(exc))


MAX_PLAN = 8 << 20              # bytes of a plan read from a collector (an avoid list of 10,000s of nodes)


def fetch_plan(url: str, token: str | None, timeout: float = 5.0) -> tuple[Any, str | None]:
    """``GET /v1/plan`` (``hpcml.centre.plan.Plan``): (the plan, None), or (None, one line why
    not), within ``timeout`` seconds in all. Like every send, a collector that is down, slow
    or wrong never fails the job: the launcher then uses its documented defaults and says so."""
    from hpcml.centre.plan import Plan
    from hpcml.errors import UsageError
    endpoint = _endpoint(url, "/v1/plan")
    req = urllib.request.Request(endpoint, method="GET", headers={
        "Authorization": f"Bearer {token or ''}", "User-Agent": "hpcml-run"})
    deadline = time.monotonic() + timeout
    try:
        chunks, size = [], 0
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            while chunk := resp.read(1 << 16):
                size += len(chunk)
                if size > MAX_PLAN:
                    return None, f"{endpoint}: answer above {MAX_PLAN} bytes"
                if time.monotonic() > deadline:
                    return None, f"{endpoint}: no whole answer within {timeout:g} s"
                chunks.append(chunk)
        return Plan.from_doc(orjson.loads(b"".join(chunks)), endpoint), None
    except UsageError as exc:
        return None, str(exc)
    except Exception as exc:          # noqa: BLE001 - a broken answer (bad status line, torn body) too
        return None, f"{endpoint}: {' '.join(_why(exc).split())[:300]}"   # what a server sent: one line
