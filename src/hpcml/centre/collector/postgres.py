"""PostgreSQL backend, for a site's shared collector: ``postgresql://user@host/db``.

Through psycopg 3 (the maintained driver; ``pip install 'hpcml[collector]'``), imported
only when a PostgreSQL URL is used. Ids come from the sequence in one round trip and both
tables are filled with ``COPY``, the fastest way into PostgreSQL from a client.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcml.centre.collector.schema import NodeReport
from hpcml.centre.collector.store import REPORT_COLS, RESULT_COLS, SqlStore, StoreError, report_rows

DDL = """
CREATE TABLE IF NOT EXISTS reports (
  id BIGSERIAL PRIMARY KEY, job TEXT, node TEXT NOT NULL, time DOUBLE PRECISION NOT NULL,
  protocol TEXT NOT NULL, verdict TEXT NOT NULL, received DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS reports_node_time ON reports (node, time);
CREATE INDEX IF NOT EXISTS reports_job ON reports (job);
CREATE TABLE IF NOT EXISTS results (
  report_id BIGINT NOT NULL REFERENCES reports (id), seq INTEGER NOT NULL,
  node TEXT NOT NULL, job TEXT, time DOUBLE PRECISION NOT NULL, name TEXT NOT NULL,
  type TEXT NOT NULL, outcome TEXT NOT NULL, value_num DOUBLE PRECISION, value_text TEXT,
  unit TEXT, message TEXT NOT NULL, duration DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS results_node_time ON results (node, time);
CREATE INDEX IF NOT EXISTS results_job ON results (job);
CREATE INDEX IF NOT EXISTS results_bad ON results (time) WHERE outcome IN ('fail', 'error');
"""


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise StoreError("a PostgreSQL URL needs psycopg: pip install 'hpcml[collector]'") from None
    return psycopg


class PostgresStore(SqlStore):
    P = "%s"
    DIALECT = "postgresql"

    def _connect(self, write: bool):
        psycopg = _psycopg()
        try:
            return psycopg.connect(self.url, autocommit=not write, connect_timeout=10,
                                   application_name="hpcml-vet-collector")
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {str(exc).strip()}") from None

    def _alive(self, conn) -> bool:
        return not conn.closed

    def _create(self, conn) -> None:
        with conn.transaction():
            # one creator at a time when several collectors start together
            conn.execute("SELECT pg_advisory_xact_lock(8787)")
            for stmt in filter(str.strip, DDL.split(";")):
                conn.execute(stmt)

    def _lock_jobs(self, conn, keys: list[tuple[str, str]]) -> None:
        """Two collectors on one database: each job's attempts are written one transaction
        at a time, or both could see no later attempt and keep two ``latest`` rows.
        Locks taken in sorted order, so two batches never deadlock."""
        with conn.cursor() as cur:
            cur.executemany("SELECT pg_advisory_xact_lock(8788, hashtext(%s))", [(f"{c}\x1f{j}",) for c, j in keys])

    def _insert_new(self, conn, sql: str, rows: list[tuple]) -> list[bool]:
        """One pipelined ``executemany`` instead of a round trip per summary."""
        if not rows:
            return []
        out = []
        with conn.cursor() as cur:
            cur.executemany(sql + " RETURNING 1", rows, returning=True)
            while True:
                out.append(cur.fetchone() is not None)
                if not cur.nextset():
                    break
        return out

    def _transaction(self, conn):
        return conn.transaction()

    def _lock_schema(self, conn) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(8787)")

    def _insert(self, conn, reports: Sequence[NodeReport], received: float) -> list[int]:
        with conn.transaction():
            cur = conn.execute("SELECT nextval('reports_id_seq') FROM generate_series(1, %s)",
                               (len(reports),))
            ids = sorted(r[0] for r in cur.fetchall())
            reps, res = report_rows(reports, ids, received)
            with conn.cursor() as cur:
                with cur.copy(f"COPY reports ({','.join(REPORT_COLS)}) FROM STDIN") as copy:
                    for row in reps:
                        copy.write_row(row)
                with cur.copy(f"COPY results ({','.join(RESULT_COLS)}) FROM STDIN") as copy:
                    for row in res:
                        copy.write_row(row)
        return ids
