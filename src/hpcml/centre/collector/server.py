"""The collector's HTTP endpoints: a WSGI application served by waitress.

Why waitress and not the standard library's ``ThreadingHTTPServer``: that server gives
each connection a thread for as long as it is open, with a per-read timeout only, so 600
idle half-sent requests starved ``/healthz`` and 800 unfinished 1 MiB bodies held 840 MB.
Waitress (Pylons, pure Python) reads every connection asynchronously and hands only
complete requests to a fixed pool of threads; a body above ``inbuf_overflow`` waits in a
temporary file, not in memory; a malformed Content-Length is a 400 and a body above the
limit a 413 before it is read. What waitress lacks, one overall deadline per request
(headers and body together, against a client that sends a byte every few seconds), and
room for new clients when every connection slot is held by an idle one, is added here in
its maintenance pass (``_Server.maintenance``).

Security: every endpoint but ``/healthz`` needs ``Authorization: Bearer TOKEN`` (compared
with ``hmac.compare_digest`` against every token); a read-only token opens the GET
endpoints only, a job token only the two POSTs. Who sent a job summary or a vetting report
is proven by ``proof.Verifier`` (MUNGE, a user's token, Slurm's records), never read from
it; a report only the write token backs is stored as unverified and never drains a node. No request
can crash the service: a failure in a handler is a 500 for that request only, and 503
while the database (or munged, or Slurm) cannot be reached.
"""

from __future__ import annotations

import hmac
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson

from hpcml import logs
from hpcml.centre.collector.proof import Forbidden, Sender, Unavailable, Unproven, Verifier
from hpcml.centre.collector.schema import Invalid, NodeReport, documents
from hpcml.centre.collector.store import BatchWriter, Store, StoreError
from hpcml.centre.summaries import parse_job_items

log = logs.get(__name__)

DEFAULT_PORT = 8787
DEFAULT_MAX_BODY = 1 << 20
TOKEN_ENV = "HPCML_VET_TOKEN"
THREADS = 16                  # requests handled at once (they share commits); the rest wait, read
CONNECTIONS = 1000            # open connections (poll, not select: no 1,024 descriptor cap)
REQUEST_DEADLINE = 10.0       # seconds from a request's first byte to its last
IDLE_TIMEOUT = 30             # seconds an idle keep-alive connection is kept
IN_MEMORY = 16 * 1024         # bytes of a body kept in memory; the rest in a temporary file
#: a body above ``IN_MEMORY`` is read and parsed by at most this many requests at once: a
#: 1 MiB body of the smallest reports is ~12 MB of objects, so memory stays bounded
#: however many arrive together (the others wait, their bodies in temporary files)
LARGE_AT_ONCE = 1
PLAN_RETRY = 60.0             # seconds before a plan that failed to build is tried again


@dataclass(frozen=True)
class Grant:
    role: str                  # write | read | job | trusted
    user: str | None = None    # a user's job token ("user:token" in --job-token-file)

    def may(self, write: bool, jobs: bool = False) -> bool:
        """``write``: a POST; ``jobs``: what job tokens may do too (POST summaries or reports,
        GET the plan their launcher vets by)."""
        if write:
            return self.role in ("write", "trusted") or (jobs and self.role == "job")
        return self.role in ("write", "read", "trusted") or (jobs and self.role == "job")


_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")    # a POSIX user name (useradd's rule, relaxed)


class Tokens:
    """Write tokens (POST and GET: vetting reports, queries), optional read-only tokens (GET
    only), job tokens (only ``POST /v1/jobs``: what every user's ``hpcml run`` needs, and
    nothing more) and trusted tokens (the write token's rights, and its job summaries are
    taken as they are: the centre's own tools). A job token line ``user:token`` is that
    user's token and proves the user where MUNGE cannot (a site without it); a line without
    a colon proves no one. A colon makes a line a user's token: the name is what precedes
    the first one and must be a user name."""

    def __init__(self, write: Iterable[str], read: Iterable[str] = (), jobs: Iterable[str] = (),
                 trusted: Iterable[str] = ()) -> None:
        self.grants: list[tuple[bytes, Grant]] = [(t.encode(), Grant("write")) for t in write if t]
        if not self.grants:
            raise ValueError("no token: the collector refuses to run without one")
        self.grants += [(t.encode(), Grant("read")) for t in read if t]
        self.grants += [(t.encode(), Grant("trusted")) for t in trusted if t]
        for line in jobs:
            user, sep, token = line.partition(":")
            if not sep:
                self.grants.append((line.encode(), Grant("job")))
            elif _USER.match(user.strip()) and token.strip():
                self.grants.append((token.strip().encode(), Grant("job", user.strip())))
            else:
                raise ValueError(f"a job token line with a colon must be USER:TOKEN, found {user[:40]!r} before it")

    def grant(self, header: str | None) -> Grant | None:
        """The grant of ``Authorization: Bearer TOKEN``, or None; the same time for every token."""
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return None
        given = value.strip().encode()
        found = None
        for token, g in self.grants:
            if hmac.compare_digest(given, token):   # no early exit
                found = g
        return found

    def allows(self, header: str | None, write: bool, jobs: bool = False) -> bool:
        g = self.grant(header)
        return g is not None and g.may(write, jobs)


#: bytes of a token file read at most (a job-token file of tens of thousands of USER:TOKEN lines fits)
TOKEN_FILE_MAX = 4 << 20


def read_tokens(path: Path | None, env_var: str | None = TOKEN_ENV) -> list[str]:
    """Tokens from a file (one per line, ``#`` comments) or else from ``$HPCML_VET_TOKEN``.

    The file is read with ``read_bounded``: a FIFO put there must not hang a prolog past its
    budget, nor a huge file fill the memory. OSError when it cannot be opened; ValueError
    (UnicodeDecodeError among them) when it is not a regular file of UTF-8 text."""
    if path is not None:
        from hpcml.files import read_bounded
        lines = read_bounded(path, TOKEN_FILE_MAX).decode("utf-8-sig").splitlines()
        return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    value = os.environ.get(env_var or "", "").strip()
    return [value] if value else []


def parse_since(value: str) -> float:
    """``24h``, ``7d``, ``90 min``, ``3600`` -> seconds back from now."""
    from hpcml.units import parse_seconds
    try:
        return parse_seconds(value)
    except ValueError:
        raise ValueError(f"since: expected a duration such as 24h or 7d, found {value!r}") from None


def _int(query: dict, key: str, default: int, top: int) -> int:
    raw = query.get(key, [str(default)])[-1]
    if not raw.isdigit() or not 1 <= int(raw) <= top:
        raise ValueError(f"{key}: expected an integer from 1 to {top}, found {raw!r}")
    return int(raw)


def _transient(exc: BaseException) -> bool:
    """The database is down or busy (any backend's OperationalError or InterfaceError,
    psycopg's AdminShutdown among them): 503, try again."""
    return isinstance(exc, (StoreError, Unavailable)) or any(
        c.__name__ in ("OperationalError", "InterfaceError") for c in type(exc).__mro__)


SPOOL_NODES_MAX = 100_000    # nodes whose spool depth the gauge keeps, at most

#: why a request was refused, for the metrics: a fixed set, whatever a sender does
REFUSALS = {400: "invalid", 401: "token", 403: "proof", 404: "not_found", 405: "method", 411: "length",
            413: "too_large"}


class _Reply(Exception):
    def __init__(self, code: int, body: Any, headers: dict[str, str] | None = None, why: str | None = None) -> None:
        self.code, self.body, self.headers = code, body, headers or {}
        self.why = why or REFUSALS.get(code)


def _error(code: int, reason: str, why: str | None = None, **headers: str) -> _Reply:
    return _Reply(code, {"error": reason}, headers, why)


@contextmanager
def _proof_refusals() -> Iterator[None]:
    """A proof that failed, as the sender must take it: 403 the cluster denies the claim (set
    it aside), 401 a credential used before (make a new one), 503 (``Unavailable``, via
    ``_transient``) munged or Slurm cannot be asked now (try again)."""
    try:
        yield
    except Forbidden as exc:
        raise _error(403, str(exc)[:500], "proof") from None
    except Unproven as exc:
        raise _error(401, str(exc)[:500], "proof") from None


_ROUTES = {"/healthz", "/readyz", "/metrics", "/v1/plan", "/v1/reports", "/v1/jobs", "/v1/fleet", "/v1/nodes/failing"}


def route(path: str) -> str:
    """A request's route for the metrics' labels: a fixed set, whatever paths clients send."""
    p = path.rstrip("/") or "/"
    if p in _ROUTES:
        return p
    if p.startswith("/v1/nodes/") and p.endswith("/history"):
        return "/v1/nodes/NODE/history"
    if p.startswith("/v1/jobs/"):
        return "/v1/jobs/JOB"
    return "other"


class Metrics:
    """The collector's Prometheus metrics (``GET /metrics``, no token: counts only), in a
    registry of its own: requests by route, method and status with their latency, documents
    stored, duplicate, unverified by kind, database errors."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = CollectorRegistry()
        self.requests = Counter("hpcml_collector_requests", "Requests answered, by route, method and status.",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("hpcml_collector_request_seconds", "Seconds to answer a request, by route.",
                                 ["route"], registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.stored = Counter("hpcml_collector_documents", "Documents received, by kind (report, summary) and "
                              "what became of them (stored, duplicate, unverified).", ["kind", "result"],
                              registry=self.registry)
        self.database_errors = Counter("hpcml_collector_database_errors", "Requests the database failed (503).",
                                       registry=self.registry)
        self.refused = Counter("hpcml_collector_refused", "Requests refused, by reason (invalid, token, proof, "
                               "not_found, method, length, too_large).", ["reason"], registry=self.registry)
        for why in sorted(set(REFUSALS.values())):
            self.refused.labels(why)      # every reason shown from the start, at 0
        self.spooled = Gauge("hpcml_collector_sender_spool_reports", "Reports waiting in the senders' spools, as "
                             "each node's newest report told (prologs; since this collector started).",
                             registry=self.registry)
        self._spools: dict[str, tuple[float, int]] = {}     # node -> (its newest report's time, waiting)
        self._lock = threading.Lock()

    def spools(self, reports: Sequence[NodeReport]) -> None:
        """Each node's newest told spool depth, summed: what senders could not deliver yet."""
        with self._lock:
            for r in reports:
                if r.spool_waiting is not None and r.evidence == "node" and \
                        r.time >= self._spools.get(r.node, (float("-inf"), 0))[0] and \
                        (r.node in self._spools or len(self._spools) < SPOOL_NODES_MAX):
                    self._spools[r.node] = (r.time, r.spool_waiting)
            self.spooled.set(sum(n for _, n in self._spools.values()))

    def request(self, route_: str, method: str, status: int, seconds: float) -> None:
        method = method if method in ("GET", "HEAD", "POST") else "other"
        self.requests.labels(route_, method, str(status)).inc()
        self.latency.labels(route_).observe(seconds)

    def documents(self, kind: str, **counts: int) -> None:
        for result, n in counts.items():
            if n:
                self.stored.labels(kind, result).inc(n)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class App:
    """The collector as a WSGI application (any WSGI server can run it; ``start`` uses waitress)."""

    def __init__(self, store: Store, tokens: Tokens, max_body: int = DEFAULT_MAX_BODY,
                 verifier: Verifier | None = None, verbose: bool = False) -> None:
        self.store, self.tokens, self.max_body, self.verbose = store, tokens, max_body, verbose
        self.verifier = verifier or Verifier(slurm=None)
        self.writer = BatchWriter(store)
        self.job_writer = BatchWriter(store, write=store.add_jobs)
        self._large = threading.BoundedSemaphore(LARGE_AT_ONCE)
        self.metrics = Metrics()
        self._plan_build = threading.Lock()
        self._plan_doc: tuple[float, dict[str, Any]] | None = None

    def log(self, line: str) -> None:
        log.info(f"hpcml centre serve: {line}")

    def __call__(self, environ: dict, start_response) -> list[bytes]:
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        began = time.monotonic()
        if path == "/metrics" and method in ("GET", "HEAD"):
            data, ctype = self.metrics.exposition()
            start_response("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(data)))])
            self.metrics.request("/metrics", method, 200, time.monotonic() - began)
            return [data]
        try:
            if method == "POST":
                reply = self._post(environ, path)
            elif method in ("GET", "HEAD"):
                reply = self._get(environ, path)
            else:
                reply = _error(405, f"method {method[:20]!r} not allowed", Allow="GET, POST")
        except _Reply as r:
            reply = r
        except Exception as exc:  # a bug or an outage: this request only
            self.log(f"{method} {path[:200]}: {type(exc).__name__}: {exc}")
            transient = _transient(exc)
            if transient:
                self.metrics.database_errors.inc()
            reply = _error(503 if transient else 500, f"internal error: {type(exc).__name__}")
        data = orjson.dumps(reply.body)
        self.metrics.request(route(path), method, reply.code, time.monotonic() - began)
        if 400 <= reply.code < 500 and reply.why:
            self.metrics.refused.labels(reply.why).inc()
        status = f"{reply.code} {HTTPStatus(reply.code).phrase}"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                                *reply.headers.items()])
        if self.verbose:
            self.log(f"{environ.get('REMOTE_ADDR')} {method} {path[:200]} {reply.code}")
        return [data]

    def _grant(self, environ: dict, write: bool, jobs: bool = False) -> Grant:
        g = self.tokens.grant(environ.get("HTTP_AUTHORIZATION"))
        if g is not None and g.may(write, jobs):
            return g
        raise _error(401, "missing or invalid token", **{"WWW-Authenticate": 'Bearer realm="hpcml-vet"'})

    def _body(self, environ: dict) -> bytes:
        length = str(environ.get("CONTENT_LENGTH") or "")   # a chunked body: waitress counted it, bounded
        if not length:
            raise _error(411, "Content-Length required")
        if not length.isdigit() or not length.isascii():
            raise _error(400, f"Content-Length: not a number: {length[:40]!r}")
        n = int(length)
        if n > self.max_body:
            raise _error(413, f"body of {n} bytes is above the limit of {self.max_body} bytes")
        body = environ["wsgi.input"].read(n)
        if len(body) < n:
            raise _error(400, "body shorter than its Content-Length")
        return body

    def _post(self, environ: dict, path: str) -> _Reply:
        kind = path.rstrip("/")
        if kind not in ("/v1/reports", "/v1/jobs"):
            raise _error(404, "not found; POST /v1/reports or /v1/jobs")
        g = self._grant(environ, write=True, jobs=True)   # what a job token sends is proven, not believed
        large = str(environ.get("CONTENT_LENGTH") or "").isdigit() and int(environ["CONTENT_LENGTH"]) > IN_MEMORY
        if not large:
            return self._take(environ, kind, g)
        with self._large:
            return self._take(environ, kind, g)

    def _take(self, environ: dict, kind: str, g: Grant) -> _Reply:
        body = self._body(environ)
        sender = Sender(trusted=g.role == "trusted", user=g.user)
        try:
            if kind == "/v1/reports":
                docs = documents(body)
            else:
                raw, summaries = parse_job_items(body)
        except Invalid as exc:
            raise _error(400, str(exc)[:500]) from None
        with _proof_refusals():
            if kind == "/v1/reports":
                return self._reports(docs, sender)
            self.verifier.verify(raw, summaries, sender)
        stored = self.job_writer.add(summaries)   # idempotent: a summary sent again is not stored again
        unverified = sum(not s.proof.verified for s in summaries)
        self.metrics.documents("summary", stored=sum(stored), duplicate=len(stored) - sum(stored),
                               unverified=unverified)
        return _Reply(201 if any(stored) else 200, {"stored": sum(stored), "duplicates": len(stored) - sum(stored),
                                                    "unverified": unverified})

    def _reports(self, docs: list, sender: Sender) -> _Reply:
        """Vetting reports, each document proven (``prove_report``) and stored with its
        evidence: only the cluster's proof lets a report drain or resume a node."""
        reports = []
        for item, reps in docs:
            proof = self.verifier.prove_report(item, reps, sender)
            for r in reps:
                r.proven(proof.evidence, proof.sender)
            reports += reps
        ids = self.writer.add(reports)
        self.metrics.spools(reports)
        self.metrics.documents("report", stored=len(ids), unverified=sum(r.evidence == "none" for r in reports))
        return _Reply(201, {"ids": ids, "stored": len(ids),
                            "unverified": sum(r.evidence == "none" for r in reports)})

    def _get(self, environ: dict, path: str) -> _Reply:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        if path == "/healthz":                          # the process answers
            return _Reply(200, {"status": "ok"})
        if path == "/readyz":                           # and can do its work: the database answers
            try:
                self.store.ping()
            except Exception as exc:                    # noqa: BLE001 - any failure is "not ready", said
                self.metrics.database_errors.inc()
                why = f"database: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                log.warning(f"hpcml centre serve: not ready: {why}")
                raise _error(503, why) from None
            return _Reply(200, {"status": "ready"})
        if path.rstrip("/") == "/v1/plan":               # every job's launcher asks: job tokens may read it
            self._grant(environ, write=False, jobs=True)
            return _Reply(200, self._plan())
        self._grant(environ, write=False)
        store = self.store
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if any(not p.isprintable() for p in parts):
            raise _error(400, "path: control characters are refused")
        try:
            if parts == ["v1", "nodes", "failing"]:
                since = parse_since(query.get("since", ["24h"])[-1])
                limit = _int(query, "limit", 20, 10_000)
                return _Reply(200, {"since": time.time() - since, "nodes": store.failing(time.time() - since, limit)})
            if len(parts) == 4 and parts[:2] == ["v1", "nodes"] and parts[3] == "history":
                limit = _int(query, "limit", 20, 1000)
                return _Reply(200, {"node": parts[2], "reports": store.history(parts[2], limit)})
            if len(parts) == 3 and parts[:2] == ["v1", "jobs"]:
                reps, summaries = store.job(parts[2]), store.job_summaries(parts[2])
                if not reps and not summaries:
                    raise _error(404, f"no reports or summaries for job {parts[2]!r}")
                return _Reply(200, {"job_id": parts[2], "reports": reps, "summaries": summaries})
            if parts == ["v1", "fleet"]:
                from hpcml.centre.report import build
                since = parse_since(query.get("since", ["30d"])[-1])
                return _Reply(200, build(store, since, top=_int(query, "top", 20, 10_000), with_verdicts=False))
        except ValueError as exc:
            raise _error(400, str(exc)) from None
        raise _error(404, "not found")

    def _plan(self) -> dict[str, Any]:
        """The centre's plan (``hpcml.centre.plan``), rebuilt at most once every ``TTL``
        seconds by one request at a time: while it builds, and when a build fails (the
        database down), the others get the last good plan; only the first ever waits."""
        from hpcml.centre.plan import TTL, build
        held = self._plan_doc
        if held is not None and time.time() - held[0] < TTL:
            return held[1]
        if not self._plan_build.acquire(blocking=held is None):
            return held[1] if held is not None else {}       # unreachable: without a plan it waits
        try:
            held = self._plan_doc                     # built meanwhile by the request it waited for
            if held is not None and time.time() - held[0] < TTL:
                return held[1]
            now = time.time()
            try:
                self._plan_doc = (now, build(self.store, now).to_json())
            except Exception as exc:                  # noqa: BLE001 - the last good plan stands
                if held is None:
                    raise
                log.warning(f"hpcml centre serve: the plan was not rebuilt ({type(exc).__name__}: {exc}); "
                            f"serving the last good one for {PLAN_RETRY:g} s more")
                self._plan_doc = (time.time() - TTL + PLAN_RETRY, held[1])
                return held[1]
            return self._plan_doc[1]
        finally:
            self._plan_build.release()

    def close(self) -> None:
        self.writer.close()
        self.job_writer.close()


def _server_class():
    """Waitress's TCP server with the two limits it lacks (imported late: the collector
    extra's dependency, and only the service needs it)."""
    from waitress.channel import HTTPChannel
    from waitress.server import TcpWSGIServer
    from waitress.task import ErrorTask

    class JsonErrorTask(ErrorTask):
        """Waitress's own refusals (a malformed request, a body over the limit) as one JSON
        line like every other answer of the collector."""

        def execute(self):               # unannotated: waitress's stubs do not know request.error
            e = self.request.error
            why = (f"body above the limit of {self.channel.server.adj.max_request_body_size - 1} bytes"
                   if e.code == 413 else f"{e.reason}: {e.body}")
            body = orjson.dumps({"error": why})
            self.status = f"{e.code} {e.reason}"
            self.response_headers.append(("Content-Type", "application/json"))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class Channel(HTTPChannel):
        began: float | None = None          # when the request being read sent its first byte
        error_task_class = JsonErrorTask

        def received(self, data: bytes) -> bool:
            if self.request is None and self.began is None:
                self.began = time.monotonic()
            try:
                return super().received(data)
            finally:
                if self.request is None:
                    self.began = None

    class Server(TcpWSGIServer):
        channel_class = Channel
        deadline = REQUEST_DEADLINE

        def add_task(self, task):        # unannotated: waitress's stubs
            """``GET /healthz`` is answered in the loop's own thread (a tiny reply, nothing
            waited on), never queued behind requests that fill the pool: a monitor sees the
            collector alive while it works. Run through the trigger: waitress calls this
            holding the channel's request lock, which answering takes."""
            reqs = getattr(task, "requests", None)
            if reqs and len(reqs) == 1 and not reqs[0].error and reqs[0].command in ("GET", "HEAD") \
                    and reqs[0].path == "/healthz":
                self.trigger.pull_trigger(task.service)
                return
            super().add_task(task)

        def maintenance(self, now):      # unannotated: waitress's stubs type active_channels wrong
            super().maintenance(now)
            mono = time.monotonic()
            channels = list(self.active_channels.values())
            for ch in channels:       # a request still being read past its deadline: dropped
                if getattr(ch, "began", None) is not None and mono - ch.began > self.deadline and not ch.requests:
                    ch.will_close = True
            if len(channels) >= self.adj.connection_limit * 0.9:
                # full: make room: idle connections and requests still arriving after a second
                # go (one client holding every slot with slow bytes loses them within seconds,
                # not at the deadline; what waits in the listen backlog then gets in)
                idle = [ch for ch in channels if getattr(ch, "began", None) is None and not ch.requests
                        and not ch.total_outbufs_len]
                slow = [ch for ch in channels if getattr(ch, "began", None) is not None and not ch.requests
                        and mono - ch.began > 1.0]
                for ch in idle + slow:
                    ch.will_close = True

    return Server


#: glibc's mallopt(M_ARENA_MAX): malloc arenas the process's threads share
_M_ARENA_MAX, ARENAS = -8, 2


def _few_malloc_arenas() -> None:
    """Cap glibc's malloc arenas before the request threads start. By default each thread
    gets its own arena (up to 8 per core), and memory one thread freed is not reused by
    another: 32 concurrent 1 MiB requests grew the collector by 66 MB, 20 MB with two
    arenas. Called once, from the process that serves; a no-op off glibc."""
    import ctypes
    try:
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, ARENAS)
    except (OSError, AttributeError):
        pass


class CollectorServer:
    """The collector on waitress, serving from ``serve_forever`` until ``close``."""

    def __init__(self, addr: tuple[str, int], store: Store, tokens: Tokens, max_body: int = DEFAULT_MAX_BODY,
                 verbose: bool = False, verifier: Verifier | None = None, threads: int = THREADS,
                 connections: int = CONNECTIONS, deadline: float = REQUEST_DEADLINE) -> None:
        from waitress.adjustments import Adjustments
        _few_malloc_arenas()                 # before App's writer threads and waitress's start
        self.app = App(store, tokens, max_body, verifier, verbose)
        self.store, self.tokens, self.max_body = store, tokens, max_body
        adj = Adjustments(host=addr[0], port=addr[1], threads=threads, connection_limit=connections,
                          channel_timeout=IDLE_TIMEOUT, cleanup_interval=1, inbuf_overflow=IN_MEMORY,
                          max_request_body_size=max_body + 1, max_request_header_size=64 * 1024,
                          asyncore_use_poll=True, ident="hpcml-vet-collector", expose_tracebacks=False,
                          log_socket_errors=False, clear_untrusted_proxy_headers=True)
        import logging
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)   # "Task queue depth is 1": load, not news
        cls = _server_class()
        self._server = cls(self.app, adj=adj)
        self._server.deadline = deadline
        self._done = threading.Event()
        self._running = self._closed = False

    @property
    def server_address(self) -> tuple[str, int]:
        host, port = self._server.socket.getsockname()[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def serve_forever(self) -> None:
        self._running = True
        try:
            self._server.run()
        except (OSError, ValueError):   # closed under the loop
            pass
        finally:
            self._done.set()

    def close(self) -> None:
        """Stop serving, finish pending writes, close the database (once)."""
        if self._closed:
            return
        self._closed = True
        srv = self._server

        def stop() -> None:             # in the loop's own thread (waitress's trigger runs it there)
            for d in list(srv._map.values()):
                try:
                    d.close()
                except OSError:
                    pass

        if not self._running or self._done.is_set():
            stop()
        else:
            try:
                srv.trigger.pull_trigger(stop)
                self._done.wait(10)
            except OSError:             # the loop closed its trigger on its way out
                stop()
        srv.task_dispatcher.shutdown()
        self.app.close()
        self.store.close()


def start(store: Store, tokens: Tokens, bind: str = "127.0.0.1", port: int = 0,
          max_body: int = DEFAULT_MAX_BODY, verbose: bool = False, verifier: Verifier | None = None,
          **kw: Any) -> CollectorServer:
    """A collector serving from a background thread; ``close()`` stops it."""
    server = CollectorServer((bind, port), store, tokens, max_body, verbose, verifier, **kw)
    threading.Thread(target=server.serve_forever, name="collector", daemon=True).start()
    return server
