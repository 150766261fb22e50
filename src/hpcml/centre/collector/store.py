"""Where accepted reports go: a ``reports`` row per node report, a ``results`` row per check.

One interface, one module per backend, chosen by URL scheme (``STORES``, ``open_store``):
SQLite for one user or a small site, PostgreSQL when a site runs the collector for
everyone; a site package adds a backend (a ``Store`` class built from the URL) through the
``hpcml.stores`` entry-point group. The SQL for
queries is shared here; each backend brings its connection, its DDL and its bulk insert.
Results carry the node, job and time of their report (denormalised) so that a node's
history and a job's results are each one index range scan.

Writes go through one connection (SQLite allows one writer anyway); ``BatchWriter`` lets
concurrent requests share a transaction (group commit), which is what makes 1,000+
reports/s possible on PostgreSQL, where each commit waits for the WAL flush.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from hpcml.centre.collector.schema import NodeReport, measured
from hpcml.centre.jobstore import GPUS_NULL_DDL, JOBS_DDL, LEDGER_DDL, NOT_TRAINING_BOUND_DDL, PROOF_DDL, JobQueries
from hpcml.centre.summaries import Received as JobSummary
from hpcml.errors import HpcmlError, UsageError
from hpcml.registry import Registry, UnknownName

DEFAULT_URL = "sqlite:///./hpcml-vet.db"
MAX_CHECKS = 500                # checks a plan prices (the most run)
NODES_PER_QUERY = 400           # names bound in one query (SQLite's oldest limit is 999 parameters)
DURATION_USERS = 3              # people whose own jobs ran a check before their figures price it
REPORT_COLS = ("id", "job", "node", "time", "protocol", "verdict", "received", "evidence", "sender")
RESULT_COLS = ("report_id", "seq", "node", "job", "time", "name", "type", "outcome", "value_num",
               "value_text", "unit", "message", "duration")


#: the store's schema: 1 the vetting tables (no version row), 2 the job tables, 3 who
#: proved each summary and the jobs' own vetting, 4 each report's evidence and sender, 5 the
#: time each job did not train (its ledger), 6 GPUs and GPU-hours that may be unknown (NULL)
SCHEMA_VERSION = 7
#: a report stored before version 4 was believed on the write token alone: unverified now
EVIDENCE_DDL = """
ALTER TABLE reports ADD COLUMN evidence TEXT NOT NULL DEFAULT 'none';
ALTER TABLE reports ADD COLUMN sender TEXT
"""
#: the DDL that takes a database from the version before to this one (by ``SqlStore.DIALECT``
#: where the backends' SQL differs)
MIGRATIONS: dict[int, str | dict[str, str]] = {2: JOBS_DDL, 3: PROOF_DDL, 4: EVIDENCE_DDL, 5: LEDGER_DDL,
                                               6: GPUS_NULL_DDL, 7: NOT_TRAINING_BOUND_DDL}


class StoreError(HpcmlError, RuntimeError):
    """The database cannot be opened or written (exit 1)."""


def report_rows(reports: Sequence[NodeReport], ids: Sequence[int], received: float
                ) -> tuple[list[tuple], list[tuple]]:
    """Node reports -> rows for ``reports`` and ``results`` (column order as above)."""
    reps, res = [], []
    for rid, r in zip(ids, reports):
        reps.append((rid, r.job_id, r.node, r.time, r.protocol, r.verdict, received, r.evidence, r.sender))
        for seq, c in enumerate(r.results):
            num, text = (c.value, None) if isinstance(c.value, float) else (None, c.value)
            res.append((rid, seq, r.node, r.job_id, r.time, c.name, c.type, c.outcome, num, text,
                        c.unit, c.message, c.duration))
    return reps, res


class Store(JobQueries, ABC):
    """The collector's storage; every method is safe to call from many threads. The job
    summaries' reads are SQL over ``_all`` (``JobQueries``)."""

    url: str

    @abstractmethod
    def add(self, reports: Sequence[NodeReport]) -> list[int]:
        """Store the reports in one transaction; their ids in order."""

    @abstractmethod
    def add_jobs(self, summaries: Sequence[JobSummary]) -> list[bool]:
        """Store job summaries in one transaction; for each, True if stored now, False if
        that (cluster, job, attempt) was stored before (sent twice)."""

    @abstractmethod
    def history(self, node: str, limit: int = 20) -> list[dict[str, Any]]:
        """The node's latest reports, newest first, each with its results."""

    @abstractmethod
    def failing(self, since: float, limit: int = 20) -> list[dict[str, Any]]:
        """Nodes with the most fail/error results since ``since`` (epoch seconds)."""

    @abstractmethod
    def job(self, job_id: str) -> list[dict[str, Any]]:
        """Every node report of the job, by node."""

    @abstractmethod
    def results_since(self, since: float, nodes: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every check result since ``since`` (epoch seconds), oldest first, of ``nodes``
        only when given: what the node handler's rules are evaluated on."""

    @abstractmethod
    def ping(self) -> None:
        """Raise unless the database answers now (``GET /readyz``)."""

    @abstractmethod
    def check_durations(self, since: float, limit: int = MAX_CHECKS) -> list[dict[str, Any]]:
        """Per check (name, type) of the nodes' own reports (``node`` evidence) since ``since``:
        how many results and their mean duration in seconds: what ``hpcml run --vet auto``
        prices a check at, for every job. A user's report of their own job is proven, yet what
        it says a check took is still theirs to say: a check no node's report measured is priced
        from users' reports only where ``DURATION_USERS`` people ran it, at the median of each
        person's mean (one person, or their made-up check names, moves nothing alone)."""

    @abstractmethod
    def results_of(self, nodes: Sequence[str], since: float) -> list[dict[str, Any]]:
        """Every check result of ``nodes`` since ``since`` (node, time, name, type, outcome,
        evidence, sender): the few bad nodes' histories a check's recall is measured on."""

    @abstractmethod
    def count(self) -> dict[str, int]:
        """Rows in ``reports`` and ``results``."""

    @abstractmethod
    def close(self) -> None: ...


def _result(row: tuple) -> dict[str, Any]:
    _rid, name, type_, outcome, num, text, unit, message, duration = row
    return {"name": name, "type": type_, "outcome": outcome,
            "value": num if num is not None else text, "unit": unit, "message": message,
            "duration": duration}


def _report(row: tuple) -> dict[str, Any]:
    rid, job, node, t, protocol, verdict, received, evidence, sender = row
    return {"id": rid, "job_id": job, "node": node, "time": t, "protocol": protocol,
            "verdict": verdict, "received": received, "evidence": evidence, "sender": sender, "results": []}


class SqlStore(Store):
    """Queries shared by the SQL backends; subclasses set ``P`` (placeholder) and connect."""

    P = "?"
    #: the SQL dialect a migration's backend-specific DDL is chosen by (``MIGRATIONS``)
    DIALECT = "sqlite"
    POOL = 8
    #: FROM clause of ``failing``: a backend may pin the partial index of bad results
    FAILING_FROM = "results r"

    def __init__(self, url: str) -> None:
        self.url = url
        self._wlock = threading.Lock()
        self._readers: queue.LifoQueue = queue.LifoQueue()
        self._closed = False
        self._writer = self._connect(write=True)
        self._create(self._writer)
        self._migrate(self._writer)

    # --- backend hooks
    @abstractmethod
    def _connect(self, write: bool): ...

    @abstractmethod
    def _create(self, conn) -> None: ...

    def _alive(self, conn) -> bool:
        return True

    @abstractmethod
    def _transaction(self, conn) -> Any:
        """A context manager: one write transaction on ``conn``, rolled back on error."""

    def _migrate(self, conn) -> None:
        """Bring an older database up to ``SCHEMA_VERSION`` in one transaction, under the
        creators' lock; a newer one is refused rather than misread or altered."""
        p = self.P
        with self._transaction(conn):
            self._lock_schema(conn)
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = conn.execute(f"SELECT value FROM meta WHERE key = {p}", ("schema_version",)).fetchone()
            try:
                version = int(row[0]) if row else 1
            except ValueError:
                raise StoreError(f"the database's schema version is {row[0]!r}, not a number: "
                                 "not a collector database hpcml can read") from None
            if version > SCHEMA_VERSION:
                raise StoreError(f"the database has schema version {version}, written by a newer hpcml; "
                                 f"this one knows up to {SCHEMA_VERSION}")
            for v in range(version + 1, SCHEMA_VERSION + 1):
                ddl = MIGRATIONS[v]
                for stmt in filter(str.strip, (ddl if isinstance(ddl, str) else ddl[self.DIALECT]).split(";")):
                    conn.execute(stmt)
            if version != SCHEMA_VERSION:
                conn.execute(f"DELETE FROM meta WHERE key = {p}", ("schema_version",))
                conn.execute(f"INSERT INTO meta (key, value) VALUES ({p}, {p})",
                             ("schema_version", str(SCHEMA_VERSION)))

    def _lock_schema(self, conn) -> None:
        """Inside ``_migrate``'s transaction: one migrating collector at a time."""

    @abstractmethod
    def _insert(self, conn, reports: Sequence[NodeReport], received: float) -> list[int]: ...

    # --- shared
    @contextmanager
    def _reader(self) -> Iterator[Any]:
        try:
            conn = self._readers.get_nowait()
        except queue.Empty:
            conn = self._connect(write=False)
        try:
            yield conn
        except BaseException:
            conn.close()  # may be broken (server restarted): do not hand it out again
            raise
        if self._closed or self._readers.qsize() >= self.POOL:
            conn.close()
        else:
            self._readers.put(conn)

    def _all(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with self._reader() as conn:
            cur = conn.cursor()
            try:
                cur.execute(sql.replace("?", self.P), args)
                return cur.fetchall()
            finally:
                cur.close()

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        """The one writer connection, held, reconnected if the server dropped it."""
        with self._wlock:
            if not self._alive(self._writer):
                self._writer = self._connect(write=True)
            yield self._writer

    def add(self, reports: Sequence[NodeReport]) -> list[int]:
        if not reports:
            return []
        with self._writing() as conn:
            return self._insert(conn, reports, time.time())

    def add_jobs(self, summaries: Sequence[JobSummary]) -> list[bool]:
        if not summaries:
            return []
        with self._writing() as conn, self._transaction(conn):
            return self._insert_jobs(conn, summaries, time.time())

    def _with_results(self, reports: list[dict], rows: list[tuple]) -> list[dict]:
        by_id = {r["id"]: r for r in reports}
        for row in rows:
            rep = by_id.get(row[0])
            if rep is not None:
                rep["results"].append(_result(row))
        for rep in reports:     # an older collector stored "good" for a report that measured nothing
            if rep["verdict"] == "good" and not measured(r["outcome"] for r in rep["results"]):
                rep["verdict"] = "unchecked"
        return reports

    def history(self, node: str, limit: int = 20) -> list[dict[str, Any]]:
        reps = [_report(r) for r in self._all(
            f"SELECT {','.join(REPORT_COLS)} FROM reports WHERE node = ? "
            "ORDER BY time DESC, id DESC LIMIT ?", (node, limit))]
        if not reps:
            return []
        # results of those reports: one range scan of the (node, time) index
        rows = self._all(
            "SELECT report_id, name, type, outcome, value_num, value_text, unit, message, duration "
            "FROM results WHERE node = ? AND time >= ? AND time <= ? ORDER BY report_id, seq",
            (node, min(r["time"] for r in reps), max(r["time"] for r in reps)))
        return self._with_results(reps, rows)

    def failing(self, since: float, limit: int = 20) -> list[dict[str, Any]]:
        rows = self._all(
            f"SELECT r.node, COUNT(*) AS bad, COUNT(DISTINCT r.report_id), MAX(r.time) FROM {self.FAILING_FROM} "
            "JOIN reports p ON p.id = r.report_id WHERE r.time >= ? AND r.outcome IN ('fail', 'error') "
            "AND p.evidence <> 'none' "         # a token's say-so is stored, never counted
            "GROUP BY r.node ORDER BY bad DESC, r.node LIMIT ?", (since, limit))
        return [{"node": n, "failures": bad, "reports": nrep, "last": last}
                for n, bad, nrep, last in rows]

    def job(self, job_id: str) -> list[dict[str, Any]]:
        reps = [_report(r) for r in self._all(
            f"SELECT {','.join(REPORT_COLS)} FROM reports WHERE job = ? ORDER BY node, time, id",
            (job_id,))]
        if not reps:
            return []
        rows = self._all(
            "SELECT report_id, name, type, outcome, value_num, value_text, unit, message, duration "
            "FROM results WHERE job = ? ORDER BY report_id, seq", (job_id,))
        return self._with_results(reps, rows)

    def results_since(self, since: float, nodes: Sequence[str] | None = None) -> list[dict[str, Any]]:
        sql = ("SELECT r.node, r.job, r.time, r.name, r.type, r.outcome, p.evidence, p.sender "
               "FROM results r JOIN reports p ON p.id = r.report_id WHERE r.time >= ?")
        if nodes is None:
            rows = self._all(sql + " ORDER BY r.time, r.report_id, r.seq", (since,))
        else:                       # a few hundred bound names a query: under any server's limit
            rows = []
            for i in range(0, len(nodes), NODES_PER_QUERY):
                part = list(nodes[i:i + NODES_PER_QUERY])
                rows += self._all(sql + f" AND r.node IN ({', '.join('?' * len(part))}) "
                                  "ORDER BY r.time, r.report_id, r.seq", (since, *part))
            rows.sort(key=lambda r: r[2])
        return [dict(zip(("node", "job", "time", "name", "type", "outcome", "evidence", "sender"), r)) for r in rows]

    def ping(self) -> None:
        self._all("SELECT 1")

    def check_durations(self, since: float, limit: int = MAX_CHECKS) -> list[dict[str, Any]]:
        # the nodes' own evidence first (root's, SlurmUser's on the node, a trusted token's), each
        # duration at most a day, the most run first
        capped = "AVG(CASE WHEN r.duration > 86400 THEN 86400 ELSE r.duration END)"
        rows = self._all(f"SELECT r.name, r.type, COUNT(*), {capped} FROM results r JOIN reports p ON p.id = r.report_id "
                         "WHERE r.time >= ? AND p.evidence = 'node' AND r.outcome <> 'skipped' "
                         "GROUP BY r.name, r.type ORDER BY COUNT(*) DESC, r.name, r.type LIMIT ?", (since, limit))
        out = {(n, t): {"name": n, "type": t, "runs": c, "mean_s": float(m or 0.0)} for n, t, c, m in rows}
        # else the users' own jobs' (hpcml run --vet), where DURATION_USERS people ran the check:
        # each person's mean, their median (one person's say-so moves it no further than the others')
        per_user = self._all(
            f"SELECT r.name, r.type, COUNT(*), {capped} FROM results r JOIN reports p ON p.id = r.report_id "
            "WHERE r.time >= ? AND p.evidence = 'job' AND r.outcome <> 'skipped' AND p.sender IS NOT NULL "
            "AND (r.name, r.type) IN (SELECT r2.name, r2.type FROM results r2 JOIN reports p2 ON p2.id = r2.report_id "
            "WHERE r2.time >= ? AND p2.evidence = 'job' AND r2.outcome <> 'skipped' GROUP BY r2.name, r2.type "
            "HAVING COUNT(DISTINCT p2.sender) >= ?) GROUP BY r.name, r.type, p.sender", (since, since, DURATION_USERS))
        users: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for n, t, c, m in per_user:
            users.setdefault((n, t), []).append((int(c), float(m or 0.0)))
        for key, each in users.items():
            if key not in out:
                out[key] = {"name": key[0], "type": key[1], "runs": sum(c for c, _ in each),
                            "mean_s": float(statistics.median(m for _, m in each))}
        return sorted(out.values(), key=lambda d: (-d["runs"], d["name"], d["type"]))[:limit]

    def results_of(self, nodes: Sequence[str], since: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(0, len(nodes), 500):
            part = list(nodes[i:i + 500])
            rows = self._all("SELECT r.node, r.time, r.name, r.type, r.outcome, p.evidence, p.sender FROM results r "
                             "JOIN reports p ON p.id = r.report_id WHERE r.time >= ? "
                             f"AND r.node IN ({','.join('?' * len(part))})", (since, *part))
            out += [dict(zip(("node", "time", "name", "type", "outcome", "evidence", "sender"), r)) for r in rows]
        return out

    def count(self) -> dict[str, int]:
        return {t: self._all(f"SELECT COUNT(*) FROM {t}")[0][0] for t in ("reports", "results", "jobs", "job_nodes")}

    def close(self) -> None:
        self._closed = True
        with self._wlock:
            self._writer.close()
        while True:
            try:
                self._readers.get_nowait().close()
            except queue.Empty:
                break


class BatchWriter:
    """Group commit: requests that arrive while a transaction runs share the next one.

    A batch that fails is retried report list by report list, so one bad request cannot
    fail the others that happened to share its transaction.
    """

    def __init__(self, store: Store, max_reports: int = 5000,
                 write: Callable[[list], list] | None = None) -> None:
        self.store = store
        self.max_reports = max_reports
        self._add = write or store.add       # one writer per kind: reports, or job summaries
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="collector-writer", daemon=True)
        self._thread.start()

    def add(self, reports: Sequence[Any], timeout: float = 60) -> list:
        fut: Future = Future()
        self._q.put((reports, fut))
        try:
            return fut.result(timeout)
        except TimeoutError:
            raise StoreError(f"the database did not take the write within {timeout:g} s") from None

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            batch, n, stop = [item], len(item[0]), False
            while n < self.max_reports:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
                n += len(nxt[0])
            self._write(batch)
            if stop:
                return

    def _write(self, batch: list[tuple[Sequence[Any], Future]]) -> None:
        try:
            ids = self._add([r for reps, _ in batch for r in reps])
        except Exception as exc:
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            for one in batch:
                self._write([one])
            return
        i = 0
        for reps, fut in batch:
            fut.set_result(ids[i:i + len(reps)])
            i += len(reps)


#: URL scheme -> the Store class, built with the URL
STORES: Registry[Callable[[str], Store]] = Registry("database URL scheme", "hpcml.stores", {
    "sqlite": "hpcml.centre.collector.sqlite:SqliteStore",
    "postgresql": "hpcml.centre.collector.postgres:PostgresStore",
    "postgres": "hpcml.centre.collector.postgres:PostgresStore",
})


def refuse_password(url: str) -> None:
    """A command line's database URL carries no password: argv is in every user's ``ps``.
    libpq reads it from ``PGPASSFILE`` or ``PGPASSWORD`` instead."""
    from urllib.parse import parse_qs, urlsplit
    if not url.lower().startswith(("postgresql://", "postgres://")):
        return
    try:
        parts = urlsplit(url)
        has = parts.password is not None or any(k.lower() in ("password", "sslpassword")
                                                for k in parse_qs(parts.query, keep_blank_values=True))
    except ValueError:
        raise UsageError("is not a URL hpcml can read (postgresql://USER@HOST[:PORT]/DB)", key="db") from None
    if has:
        raise UsageError("holds a password, which every user sees in ps: leave it out and set PGPASSFILE "
                         "(host:port:db:user:password, mode 0600) or PGPASSWORD in the service's environment",
                         key="db")


def open_store(url: str = DEFAULT_URL) -> Store:
    """``sqlite:///path.db`` or ``postgresql://user@host/db`` -> a ready store (tables made)."""
    scheme = url.split(":", 1)[0].lower()
    try:
        cls = STORES.get(scheme)
    except UnknownName:
        raise StoreError(f"unsupported database URL {url!r}: expected sqlite:///PATH or "
                         f"postgresql://USER@HOST/DB (schemes known: {', '.join(STORES.names())})") from None
    return cls(url)
