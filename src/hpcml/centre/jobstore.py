"""Job summaries in the collector's store, and the queries of the centre's report.

Two tables beside the vetting ones: ``jobs`` (one row per job attempt, keyed by cluster,
job id and attempt, so that a summary sent twice is stored once) and ``job_nodes`` (one
row per node a job names: excluded, straggler, hang culprit, lost), which is what lets one
query rank the nodes that hurt many jobs. The column types are written so that SQLite
(type affinity) and PostgreSQL read the same DDL. A job that Slurm requeued sends one
summary per attempt, each covering the attempts before it: totals use each job's latest
attempt, node counts count distinct jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from hpcml.centre.summaries import ROLES
from hpcml.centre.summaries import Received as JobSummary

#: schema version 2: the job tables (version 1, the vetting tables, had no version row)
JOBS_DDL = """
CREATE TABLE IF NOT EXISTS jobs (
  cluster TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL,
  user_name TEXT, account TEXT, partition_name TEXT, started DOUBLE PRECISION NOT NULL,
  ended DOUBLE PRECISION, time DOUBLE PRECISION NOT NULL, duration_s DOUBLE PRECISION,
  exit_code INTEGER, outcome TEXT NOT NULL, nodes INTEGER NOT NULL, gpus INTEGER NOT NULL,
  node_hours DOUBLE PRECISION NOT NULL, gpu_hours DOUBLE PRECISION NOT NULL,
  time_lost_s DOUBLE PRECISION, gpu_hours_lost DOUBLE PRECISION, gpu_score DOUBLE PRECISION,
  bound TEXT, throughput DOUBLE PRECISION, throughput_unit TEXT, attempts INTEGER NOT NULL,
  received DOUBLE PRECISION NOT NULL, body TEXT NOT NULL, latest INTEGER NOT NULL DEFAULT 1,
  PRIMARY KEY (cluster, job, attempt));
CREATE INDEX IF NOT EXISTS jobs_latest_time ON jobs (latest, time);
CREATE TABLE IF NOT EXISTS job_nodes (
  cluster TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL, node TEXT NOT NULL,
  role TEXT NOT NULL, rank INTEGER, detail TEXT NOT NULL, time DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS job_nodes_time ON job_nodes (time);
CREATE INDEX IF NOT EXISTS job_nodes_node_time ON job_nodes (node, time)
"""
#: schema version 3: who proved a summary (``proof``: munge, token, trusted, none), the
#: proven uid, whether it counts (``verified``), hangs over the attempts, and the vetting
#: ``hpcml run --vet`` did in the job. Rows of version 2 were never proven: unverified.
PROOF_DDL = """
ALTER TABLE jobs ADD COLUMN uid INTEGER;
ALTER TABLE jobs ADD COLUMN proof TEXT NOT NULL DEFAULT 'none';
ALTER TABLE jobs ADD COLUMN verified INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN hangs INTEGER NOT NULL DEFAULT 0;
ALTER TABLE job_nodes ADD COLUMN verified INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET latest = 0;
CREATE TABLE IF NOT EXISTS job_vetting (
  cluster TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL, node TEXT NOT NULL,
  time DOUBLE PRECISION NOT NULL, verdict TEXT NOT NULL, failing TEXT NOT NULL,
  verified INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS job_vetting_node_time ON job_vetting (node, time);
CREATE UNIQUE INDEX IF NOT EXISTS job_vetting_once ON job_vetting (cluster, job, node, time, verdict)
"""
#: schema version 5: the job's time that did not train, from its ledger (older rows: unknown)
LEDGER_DDL = """
ALTER TABLE jobs ADD COLUMN node_hours_not_training DOUBLE PRECISION;
ALTER TABLE jobs ADD COLUMN gpu_hours_not_training DOUBLE PRECISION;
ALTER TABLE jobs ADD COLUMN not_training_why TEXT
"""
#: schema version 6: a job's GPUs and GPU-hours may be unknown (NULL: no rank ran, nothing
#: counted them), never a 0 nobody counted. PostgreSQL drops the constraints; SQLite cannot,
#: so it rebuilds the table (sqlite.org/lang_altertable.html, "other kinds of table schema
#: changes"): the same columns, types and defaults, every row copied, in one transaction
GPUS_NULL_DDL = {
    "postgresql": """
ALTER TABLE jobs ALTER COLUMN gpus DROP NOT NULL;
ALTER TABLE jobs ALTER COLUMN gpu_hours DROP NOT NULL
""",
    "sqlite": """
CREATE TABLE jobs_v6 (
  cluster TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL,
  user_name TEXT, account TEXT, partition_name TEXT, started DOUBLE PRECISION NOT NULL,
  ended DOUBLE PRECISION, time DOUBLE PRECISION NOT NULL, duration_s DOUBLE PRECISION,
  exit_code INTEGER, outcome TEXT NOT NULL, nodes INTEGER NOT NULL, gpus INTEGER,
  node_hours DOUBLE PRECISION NOT NULL, gpu_hours DOUBLE PRECISION,
  time_lost_s DOUBLE PRECISION, gpu_hours_lost DOUBLE PRECISION, gpu_score DOUBLE PRECISION,
  bound TEXT, throughput DOUBLE PRECISION, throughput_unit TEXT, attempts INTEGER NOT NULL,
  received DOUBLE PRECISION NOT NULL, body TEXT NOT NULL, latest INTEGER NOT NULL DEFAULT 1,
  uid INTEGER, proof TEXT NOT NULL DEFAULT 'none', verified INTEGER NOT NULL DEFAULT 0,
  hangs INTEGER NOT NULL DEFAULT 0, node_hours_not_training DOUBLE PRECISION,
  gpu_hours_not_training DOUBLE PRECISION, not_training_why TEXT,
  PRIMARY KEY (cluster, job, attempt));
INSERT INTO jobs_v6 ({cols}) SELECT {cols} FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v6 RENAME TO jobs;
CREATE INDEX IF NOT EXISTS jobs_latest_time ON jobs (latest, time)
""",
}
#: the jobs table's columns at schema version 6 (its rebuild copies these)
JOB_COLS_V6 = ("cluster", "job", "attempt", "user_name", "account", "partition_name", "started", "ended",
               "time", "duration_s", "exit_code", "outcome", "nodes", "gpus", "node_hours", "gpu_hours",
               "time_lost_s", "gpu_hours_lost", "gpu_score", "bound", "throughput", "throughput_unit",
               "attempts", "received", "body", "uid", "proof", "verified", "hangs", "latest",
               "node_hours_not_training", "gpu_hours_not_training", "not_training_why")
GPUS_NULL_DDL["sqlite"] = GPUS_NULL_DDL["sqlite"].replace("{cols}", ", ".join(JOB_COLS_V6))
#: schema version 7: "at least" where the job's time that did not train is a lower bound (its
#: ledger counted steps done again that nobody measured as productive: ETTR "at most")
NOT_TRAINING_BOUND_DDL = "ALTER TABLE jobs ADD COLUMN not_training_bound TEXT"
JOB_COLS = (*JOB_COLS_V6, "not_training_bound")
NODE_COLS = ("cluster", "job", "attempt", "node", "role", "rank", "detail", "time", "verified")
VETTING_COLS = ("cluster", "job", "attempt", "node", "time", "verdict", "failing", "verified")
#: each job's latest verified attempt since a time (one row per job; ``latest`` is kept by
#: the insert, among verified summaries only: an unverified one never counts nor shadows)
LATEST = "SELECT * FROM jobs WHERE latest = 1 AND verified = 1 AND time >= ?"
#: roles a job names a node in for the node's sake; ``crashed`` is the ranks' code's
NODE_FAULTS = ("excluded", "straggler", "culprit", "lost")
PROLOG_DRAINS_MAX = 200       # nodes the report lists as drained by the prolog, at most (each one more query)
#: each proven vetting report of the nodes ``{marks}`` since a time, with the verdict it earned:
#: ``bad`` as stored, else ``good`` only where a result measured something (an older collector
#: stored ``good`` for a report whose every check was skipped: ``unchecked``, unknown is never good)
CHECKED = ("SELECT p.node, p.time, CASE WHEN p.verdict = 'bad' THEN 'bad' WHEN EXISTS (SELECT 1 FROM results r "
           "WHERE r.node = p.node AND r.time = p.time AND r.report_id = p.id AND r.outcome <> 'skipped') "
           "THEN 'good' ELSE 'unchecked' END AS verdict FROM reports p WHERE p.time >= ? AND p.node IN ({marks}) "
           "AND p.evidence <> 'none'")
#: outcomes of a job a fault stopped: its allocation counts as lost where nothing was measured
STOPPED = ("failed", "hung", "interrupted")

#: the jobs a fault stopped or restarted whose loss nobody measured (no resume step priced
#: it): their loss is unknown, not 0, and a total over them says so
UNMEASURED = ("COALESCE(SUM(CASE WHEN time_lost_s IS NULL AND (outcome IN ('failed', 'hung') OR hangs > 0 "
              "OR attempts > 1) THEN 1 ELSE 0 END), 0)")


#: the jobs whose GPUs nobody counted (no rank ran): their GPU-hours are unknown, not 0
UNCOUNTED = "COALESCE(SUM(CASE WHEN gpu_hours IS NULL THEN 1 ELSE 0 END), 0)"

#: the jobs whose loss was measured in time but whose GPUs nobody counted: their lost
#: GPU-hours are unknown, so a sum of lost GPU-hours over them is a lower bound
LOST_UNCOUNTED = "COALESCE(SUM(CASE WHEN time_lost_s > 0 AND gpu_hours_lost IS NULL THEN 1 ELSE 0 END), 0)"


#: the jobs whose time that did not train is a lower bound (``not_training_bound``)
BOUNDED = "COALESCE(SUM(CASE WHEN not_training_bound IS NOT NULL THEN 1 ELSE 0 END), 0)"


def _lost(total: float | None, unmeasured: int) -> float | None:
    """A sum of losses (or of GPU-hours): what was measured; None where nothing was and some
    job's went unmeasured (unknown, not 0); 0 where no job had any."""
    if total is not None:
        return total
    return None if unmeasured else 0.0


def job_row(s: JobSummary, received: float) -> tuple:
    tp, pr = s.throughput, s.proof
    user = pr.user if pr.verified and pr.user else s.user       # a proven user replaces the claimed one
    return (s.cluster, s.job_id, s.attempt, user, s.account, s.partition, s.started, s.ended, s.time,
            s.duration_s, s.exit_code, s.outcome, len(s.nodes), s.gpus, s.node_hours, s.gpu_hours,
            s.time_lost_s, s.gpu_hours_lost, s.gpu.score, s.gpu.bound, tp.median if tp else None,
            tp.unit if tp else None, s.attempts, received,
            orjson.dumps(s.model_dump(by_alias=True, exclude_none=True)).decode(),
            pr.uid, pr.how, int(pr.verified), max(s.hangs, int(s.outcome == "hung")), int(pr.verified),
            s.node_hours_not_training, s.gpu_hours_not_training, s.not_training_why,
            "at least" if s.ettr_bound and s.node_hours_not_training is not None else None)


def node_rows(s: JobSummary) -> list[tuple]:
    v = int(s.proof.verified)
    return [(s.cluster, s.job_id, s.attempt, e.node, role, e.rank, e.detail, s.time, v) for role, e in s.events()]


def vetting_rows(s: JobSummary) -> list[tuple]:
    v = int(s.proof.verified)
    return [(s.cluster, s.job_id, v_.attempt, v_.node, v_.time, v_.verdict, ",".join(v_.failing), v)
            for v_ in s.vetting]


class JobQueries:
    """The job-side SQL of every store (``Store`` derives from it): a backend brings
    ``_all`` (run a query) and ``P`` (its placeholder)."""

    P = "?"

    def _all(self, sql: str, args: Sequence = ()) -> list[tuple]:  # pragma: no cover - SqlStore's
        raise NotImplementedError

    def _insert_jobs(self, conn, summaries: Sequence[JobSummary], received: float) -> list[bool]:
        """Insert each summary unless its (cluster, job, attempt) is stored already; inside
        the caller's transaction. True for each one stored now."""
        p = self.P
        sql = (f"INSERT INTO jobs ({','.join(JOB_COLS)}) VALUES ({','.join([p] * len(JOB_COLS))}) "
               "ON CONFLICT (cluster, job, attempt) DO NOTHING")
        first: dict[tuple, int] = {}
        for i, s in enumerate(summaries):          # twice in one batch: the first verified one, else the first
            key = (s.cluster, s.job_id, s.attempt)
            if key not in first or (s.proof.verified and not summaries[first[key]].proof.verified):
                first[key] = i
        todo = sorted(first.values())
        self._lock_jobs(conn, sorted({(s.cluster, s.job_id) for s in summaries}))
        proven = [(summaries[i].cluster, summaries[i].job_id, summaries[i].attempt) for i in todo
                  if summaries[i].proof.verified]
        shadowed = self._unverified(conn, proven)
        if shadowed:           # a job's verified summary replaces an unverified one of its key (rare)
            for table in ("jobs", "job_nodes"):
                conn.cursor().executemany(f"DELETE FROM {table} WHERE cluster = {p} AND job = {p} AND attempt = {p} "
                                          "AND verified = 0", shadowed)
            conn.cursor().executemany(f"DELETE FROM job_vetting WHERE cluster = {p} AND job = {p} AND verified = 0",
                                      sorted({k[:2] for k in shadowed}))
        new = self._insert_new(conn, sql, [job_row(summaries[i], received) for i in todo])
        stored = [False] * len(summaries)
        for i, ok in zip(todo, new):
            stored[i] = ok
        kept = [s for s, ok in zip(summaries, stored) if ok]
        cur = conn.cursor()
        try:
            if kept:
                cur.executemany(f"INSERT INTO job_nodes ({','.join(NODE_COLS)}) VALUES "
                                f"({','.join([p] * len(NODE_COLS))})", [r for s in kept for r in node_rows(s)])
                vetting = [r for s in kept for r in vetting_rows(s)]
                if vetting:        # each attempt's summary repeats the vetting before it: stored once,
                    # and a proven summary's copy proves a row an unproven one stored first (which
                    # would otherwise keep the job's own vetting from ever counting)
                    cur.executemany(f"INSERT INTO job_vetting ({','.join(VETTING_COLS)}) VALUES "
                                    f"({','.join([p] * len(VETTING_COLS))}) "
                                    "ON CONFLICT (cluster, job, node, time, verdict) DO UPDATE SET verified = 1, "
                                    "attempt = excluded.attempt, failing = excluded.failing "
                                    "WHERE job_vetting.verified = 0 AND excluded.verified = 1", vetting)
                # only a job's highest verified attempt is its latest, whichever arrived last
                counted = [s for s in kept if s.proof.verified]
                cur.executemany(f"UPDATE jobs SET latest = 0 WHERE cluster = {p} AND job = {p} AND latest = 1 AND "
                                f"attempt < (SELECT MAX(attempt) FROM jobs WHERE cluster = {p} AND job = {p} "
                                "AND verified = 1)",
                                sorted({(s.cluster, s.job_id, s.cluster, s.job_id) for s in counted if s.attempt > 0}
                                       | self._late_first_attempts(conn, counted)))
        finally:
            cur.close()
        return stored

    def _unverified(self, conn, keys: list[tuple[str, str, int]]) -> list[tuple]:
        """Which of these (cluster, job, attempt) hold an unverified row."""
        return self._matching(conn, "SELECT cluster, job, attempt FROM jobs WHERE verified = 0 AND "
                                    "(cluster, job, attempt)", keys)

    def _matching(self, conn, select: str, keys: Sequence[tuple]) -> list[tuple]:
        """``select`` (ending in the key's columns) ``IN`` a VALUES list of ``keys``: one query
        per 500 keys."""
        out: list[tuple] = []
        p = self.P
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            row = "(" + ", ".join([p] * len(part[0])) + ")"
            out += [tuple(r) for r in conn.execute(f"{select} IN (VALUES {','.join([row] * len(part))})",
                                                    [v for k in part for v in k]).fetchall()]
        return out

    def _lock_jobs(self, conn, keys: list[tuple[str, str]]) -> None:
        """Inside the transaction: no other writer adds an attempt of these jobs until it
        ends (SQLite's BEGIN IMMEDIATE already holds the one write lock)."""

    def _insert_new(self, conn, sql: str, rows: list[tuple]) -> list[bool]:
        """Run the insert for each row; True where a row was added (a backend may batch it)."""
        return [conn.execute(sql, row).rowcount == 1 for row in rows]

    def _late_first_attempts(self, conn, kept: Sequence[JobSummary]) -> set[tuple]:
        """Jobs whose attempt 0 arrived after a later attempt (rare): their keys for the update.
        One query per 500 jobs; updating every stored job instead halves PostgreSQL's ingest."""
        keys = sorted({(s.cluster, s.job_id) for s in kept if s.attempt == 0})
        rows = self._matching(conn, "SELECT DISTINCT cluster, job FROM jobs WHERE attempt > 0 AND verified = 1 "
                                    "AND (cluster, job)", keys)
        return {(c, j, c, j) for c, j in rows}

    # --- reads

    def job_summaries(self, job_id: str) -> list[dict[str, Any]]:
        """Every stored attempt's summary of a job (any cluster), oldest attempt first, each
        with what the collector proved of its sender (``proof``), which the body never says."""
        return [{**orjson.loads(b), "proof": {"how": how, "verified": bool(v), "user": u if v else None}}
                for b, how, v, u in self._all("SELECT body, proof, verified, user_name FROM jobs WHERE job = ? "
                                              "ORDER BY cluster, attempt", (job_id,))]

    def job_events_since(self, since: float) -> list[dict[str, Any]]:
        """Every (node, job, role) a verified job named since ``since``, once per job, oldest
        first, with its proven owner (uid, else the user a token or the operator gave):
        what the node handler's job rules count. Unverified summaries never count."""
        rows = self._all("SELECT n.node, n.cluster, n.job, n.role, MIN(n.time), MAX(j.uid), MAX(j.user_name) "
                         "FROM job_nodes n JOIN jobs j ON j.cluster = n.cluster AND j.job = n.job "
                         "AND j.attempt = n.attempt WHERE n.time >= ? AND n.verified = 1 AND j.verified = 1 "
                         "GROUP BY n.node, n.cluster, n.job, n.role ORDER BY MIN(n.time)", (since,))
        return [{"node": n, "job": f"{c}:{j}" if c else j, "role": r, "time": t,
                 "user": f"uid:{uid}" if uid is not None else (f"user:{u}" if u else None)}
                for n, c, j, r, t, uid, u in rows]

    def node_harm(self, since: float, limit: int) -> list[dict[str, Any]]:
        """Nodes ranked by the distinct jobs that named them for the node's sake (excluded,
        straggler, culprit, lost: ``NODE_FAULTS``), with the count per role. A crashed rank
        is the code's until something else says otherwise (any user's exception or
        ``sys.exit`` crashes one): counted, never ranked on."""
        rows = self._all(
            "SELECT node, role, COUNT(*), MAX(t) FROM (SELECT node, role, cluster, job, MAX(time) AS t "
            "FROM job_nodes WHERE time >= ? AND verified = 1 GROUP BY node, role, cluster, job) x GROUP BY node, role",
            (since,))
        jobs = dict(self._all(
            "SELECT node, COUNT(*) FROM (SELECT DISTINCT node, cluster, job FROM job_nodes WHERE time >= ? "
            f"AND verified = 1 AND role IN ({','.join(repr(r) for r in NODE_FAULTS)})) y GROUP BY node", (since,)))
        out: dict[str, dict[str, Any]] = {}
        for node, role, n, last in rows:
            d = out.setdefault(node, {"node": node, "jobs": jobs.get(node, 0), "last": last,
                                      **{r: 0 for r in ROLES}})
            d[role] = n
            d["last"] = max(d["last"], last)
        ranked = sorted((d for d in out.values() if d["jobs"]),
                        key=lambda d: (-d["jobs"], -(d["straggler"] + d["culprit"] + d["lost"]), d["node"]))
        return ranked[:limit]

    def node_details(self, nodes: Sequence[str], since: float) -> dict[str, dict[str, Any]]:
        """Per node, what an operator acts on: the proven users and jobs that named it for a
        node fault, the hours those jobs lost (a recovered job's measured loss; a job that
        ended failed or hung by it, its whole allocation: what it did before its last
        checkpoint is not known, so an upper bound), and the prolog's drains of it."""
        # hours lost stay None (unknown) for a node whose jobs neither measured a loss nor were
        # stopped: a straggler's slowdown is not priced, and is not 0
        out: dict[str, dict[str, Any]] = {n: {"users": 0, "job_ids": [], "gpu_hours_lost": None, "node_hours_lost": None,
                                              "gpus_uncounted": 0, "stopped": 0, "unpriced": 0, "prolog_drains": 0,
                                              "last_prolog_drain": None} for n in nodes}
        faults = ",".join(repr(r) for r in NODE_FAULTS)
        for i in range(0, len(nodes), 500):
            part = list(nodes[i:i + 500])
            marks = ",".join("?" * len(part))
            rows = self._all(
                "SELECT DISTINCT n.node, n.cluster, n.job, j.time, COALESCE(CAST(j.uid AS TEXT), j.user_name), j.outcome, "
                "j.gpu_hours, j.node_hours, j.gpu_hours_lost, j.time_lost_s, j.nodes FROM job_nodes n JOIN jobs j ON "
                "j.cluster = n.cluster AND j.job = n.job AND j.attempt = n.attempt AND j.latest = 1 AND j.verified = 1 "
                f"WHERE n.time >= ? AND n.verified = 1 AND n.role IN ({faults}) AND n.node IN ({marks})",
                (since, *part))
            users: dict[str, set] = {n: set() for n in part}
            seen: set[tuple] = set()
            for node, cluster, job, t, user, outcome, gpu_h, node_h, gpu_lost, lost_s, width in rows:
                if (node, cluster, job) in seen:
                    continue
                seen.add((node, cluster, job))
                d = out[node]
                if user:
                    users[node].add(user)
                d["job_ids"].append((t, job))
                if gpu_lost or lost_s:
                    d["gpus_uncounted"] += gpu_lost is None     # a loss in time, its GPU-hours unknown
                    d["gpu_hours_lost"] = (d["gpu_hours_lost"] or 0.0) + (gpu_lost or 0.0)
                    d["node_hours_lost"] = (d["node_hours_lost"] or 0.0) + (lost_s or 0.0) * (width or 1) / 3600
                elif outcome in STOPPED:
                    d["stopped"] += 1
                    d["gpus_uncounted"] += gpu_h is None       # its allocation's GPU-hours: unknown
                    d["gpu_hours_lost"] = (d["gpu_hours_lost"] or 0.0) + (gpu_h or 0.0)
                    d["node_hours_lost"] = (d["node_hours_lost"] or 0.0) + (node_h or 0.0)
            stopped = ",".join(repr(o) for o in STOPPED)
            for node, unpriced in self._all(       # a slowdown or a recovery whose loss nobody priced
                    "SELECT n.node, COUNT(DISTINCT n.cluster || '/' || n.job) FROM job_nodes n JOIN jobs j ON "
                    "j.cluster = n.cluster AND j.job = n.job AND j.attempt = n.attempt AND j.latest = 1 AND "
                    "j.verified = 1 WHERE n.time >= ? AND n.verified = 1 AND n.role IN ('straggler', 'culprit', 'lost') "
                    f"AND j.time_lost_s IS NULL AND j.outcome NOT IN ({stopped}) AND n.node IN ({marks}) "
                    "GROUP BY n.node", (since, *part)):
                out[node]["unpriced"] = unpriced
            for node in part:
                d = out[node]
                d["users"] = len(users[node])
                d["job_ids"] = [j for _, j in sorted(d["job_ids"], reverse=True)[:5]]
            for node, n, last in self._all(
                    "SELECT r.node, COUNT(*), MAX(r.time) FROM results r JOIN reports p ON p.id = r.report_id WHERE "
                    f"r.time >= ? AND r.type = 'drain' AND r.outcome = 'fail' AND p.evidence = 'node' AND r.node IN ({marks}) "
                    "GROUP BY r.node", (since, *part)):
                out[node]["prolog_drains"], out[node]["last_prolog_drain"] = n, last
        return out

    def prolog_drains(self, since: float, limit: int) -> list[dict[str, Any]]:
        """Per node the prolog or health check drained (or failed to drain) since ``since``,
        named by a job or not, newest first: drains, failed drains (the node was bad and stayed
        schedulable), the last of either and the checks that failed in it. Node evidence only:
        what root's prolog sent about its own node."""
        limit = min(limit, PROLOG_DRAINS_MAX)
        out: dict[str, dict[str, Any]] = {}
        last_report: dict[str, tuple[float, int]] = {}
        for node, outcome, report_id, t in self._all(
                "SELECT r.node, r.outcome, r.report_id, r.time FROM results r JOIN reports p ON p.id = r.report_id "
                "WHERE r.time >= ? AND r.type = 'drain' AND r.outcome IN ('fail', 'error') AND p.evidence = 'node'",
                (since,)):
            d = out.setdefault(node, {"node": node, "drains": 0, "failed_drains": 0, "last": None, "checks": [],
                                      "last_failed": False})
            d["drains" if outcome == "fail" else "failed_drains"] += 1
            if node not in last_report or t > last_report[node][0]:
                last_report[node] = (t, report_id)
                d["last"], d["last_failed"] = t, outcome == "error"
        ranked = sorted(out.values(), key=lambda d: (-(d["last"] or 0), d["node"]))[:limit]
        for d in ranked:                     # by node and time: the (node, time) index, not a scan
            t, report_id = last_report[d["node"]]
            d["checks"] = sorted({c for c, rid in self._all(
                "SELECT name, report_id FROM results WHERE node = ? AND time = ? AND type != 'drain' "
                "AND outcome IN ('fail', 'error')", (d["node"], t)) if rid == report_id})
        return ranked

    def vet_history(self, nodes: Sequence[str], since: float) -> dict[str, dict[str, Any]]:
        """Per node: vetting reports since ``since``, how many bad and how many checked
        nothing (``unchecked``: never a pass), the last bad one's failing checks and when the
        node last passed."""
        out: dict[str, dict[str, Any]] = {n: {"reports": 0, "bad": 0, "unchecked": 0, "last_bad": None,
                                              "last_good": None, "last_unchecked": None, "failing_checks": []}
                                          for n in nodes}
        for i in range(0, len(nodes), 500):
            part = list(nodes[i:i + 500])
            marks = ",".join("?" * len(part))
            for node, verdict, n, last in self._all(
                    f"SELECT node, verdict, COUNT(*), MAX(time) FROM ({CHECKED.format(marks=marks)}) t "
                    "GROUP BY node, verdict", (since, *part)):
                d = out[node]
                d["reports"] += n
                if verdict in ("bad", "unchecked"):
                    d[verdict], d[f"last_{verdict}"] = n, last
                else:
                    d["last_good"] = last
            for node, name, n in self._all(
                    f"SELECT r.node, r.name, COUNT(*) FROM results r JOIN reports p ON p.id = r.report_id "
                    f"WHERE r.time >= ? AND r.node IN ({marks}) "
                    "AND r.outcome IN ('fail', 'error') AND p.evidence <> 'none' GROUP BY r.node, r.name",
                    (since, *part)):
                out[node]["failing_checks"].append({"check": name, "count": n})
            self._job_vetting(out, part, since)
        for d in out.values():
            d["failing_checks"].sort(key=lambda c: (-c["count"], c["check"]))
            del d["failing_checks"][5:]
        return out

    def _job_vetting(self, out: dict[str, dict[str, Any]], part: list[str], since: float) -> None:
        """Add the vetting that verified jobs' ``hpcml run --vet`` did to ``vet_history`` (good or
        bad: a summary leaves out the nodes its vetting checked nothing on)."""
        marks = ",".join("?" * len(part))
        failing: dict[tuple[str, str], int] = {}
        for node, verdict, t, checks in self._all(
                f"SELECT node, verdict, time, failing FROM job_vetting WHERE time >= ? AND node IN ({marks}) "
                "AND verified = 1", (since, *part)):
            d = out[node]
            d["reports"] += 1
            key = "last_bad" if verdict == "bad" else "last_good"
            d["bad"] += verdict == "bad"
            d[key] = t if d[key] is None else max(d[key], t)
            for c in filter(None, checks.split(",")):
                failing[(node, c)] = failing.get((node, c), 0) + 1
        for (node, c), n in failing.items():
            listed = next((f for f in out[node]["failing_checks"] if f["check"] == c), None)
            if listed:
                listed["count"] += n
            else:
                out[node]["failing_checks"].append({"check": c, "count": n})

    def job_totals(self, since: float) -> dict[str, Any]:
        (n, gpu_h, node_h, lost_h, lost_s, failed, hung, unmeasured, uncounted, lost_uncounted), = self._all(
            "SELECT COUNT(*), SUM(gpu_hours), COALESCE(SUM(node_hours), 0), "
            "SUM(gpu_hours_lost), SUM(time_lost_s), "
            "COALESCE(SUM(CASE WHEN outcome = 'failed' THEN 1 ELSE 0 END), 0), "
            f"COALESCE(SUM(CASE WHEN hangs > 0 THEN 1 ELSE 0 END), 0), {UNMEASURED}, {UNCOUNTED}, {LOST_UNCOUNTED} "
            f"FROM ({LATEST}) t", (since,))
        lost_h, lost_s = _lost(lost_h, unmeasured + lost_uncounted), _lost(lost_s, unmeasured)
        (unverified,), = self._all("SELECT COUNT(*) FROM jobs WHERE verified = 0 AND time >= ?", (since,))
        faults = ",".join(repr(r) for r in NODE_FAULTS)
        outcomes = ",".join(repr(o) for o in STOPPED)
        (stopped, stopped_gpu_h, stopped_node_h, stopped_uncounted), = self._all(
            f"SELECT COUNT(*), SUM(gpu_hours), COALESCE(SUM(node_hours), 0), {UNCOUNTED} FROM (" + LATEST + ") t "
            f"WHERE outcome IN ({outcomes}) AND COALESCE(time_lost_s, 0) = 0 AND EXISTS (SELECT 1 FROM job_nodes n "
            f"WHERE n.cluster = t.cluster AND n.job = t.job AND n.attempt = t.attempt AND n.role IN ({faults}))",
            (since,))
        return {"jobs": n, "gpu_hours": _lost(gpu_h, uncounted), "gpus_uncounted": uncounted,
                "node_hours": node_h, "gpu_hours_lost": lost_h,
                "time_lost_s": lost_s, "lost_unmeasured": unmeasured, "lost_gpus_uncounted": lost_uncounted,
                "failed": failed, "hung": hung, "unverified": unverified,
                "stopped_by_node": stopped, "gpu_hours_stopped": _lost(stopped_gpu_h, stopped_uncounted),
                "stopped_gpus_uncounted": stopped_uncounted, "node_hours_stopped": stopped_node_h}

    def scores_by_owner(self, since: float, per_owner: int, owners: int) -> list[dict[str, Any]]:
        """Per (user, account): jobs, GPU-hours, mean GPU score, and the lowest-scoring jobs;
        owners ordered by their GPU-hours at the lowest scores first."""
        rows = self._all(
            "SELECT user_name, account, COUNT(*), SUM(gpu_hours), AVG(gpu_score), "
            f"SUM(gpu_hours * (1 - gpu_score)), SUM(gpu_hours_lost), {UNMEASURED} + {LOST_UNCOUNTED} "
            f"FROM ({LATEST}) t WHERE gpu_score IS NOT NULL GROUP BY user_name, account", (since,))
        owners_ = sorted(rows, key=lambda r: -(r[5] or 0))[:owners]
        worst = self._all(
            "SELECT user_name, account, cluster, job, attempt, gpu_score, bound, gpu_hours, ended FROM ("
            "SELECT t.*, ROW_NUMBER() OVER (PARTITION BY user_name, account ORDER BY gpu_score, job) AS rn "
            f"FROM ({LATEST}) t WHERE gpu_score IS NOT NULL) w WHERE rn <= ? ORDER BY gpu_score",
            (since, per_owner))
        by_owner: dict[tuple, list[dict[str, Any]]] = {}
        for user, account, cluster, job, attempt, score, bound, gpu_h, ended in worst:
            by_owner.setdefault((user, account), []).append(
                {"job": job, "cluster": cluster, "attempt": attempt, "score": score, "bound": bound,
                 "gpu_hours": gpu_h, "ended": ended})
        return [{"user": u, "account": a, "jobs": n, "gpu_hours": gh, "mean_score": ms,
                 "idle_gpu_hours": idle, "gpu_hours_lost": _lost(lost, unknown), "lowest": by_owner.get((u, a), [])}
                for u, a, n, gh, ms, idle, lost, unknown in owners_]

    def lost_by_account(self, since: float) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT account, COUNT(*), SUM(gpu_hours), SUM(gpu_hours_lost), SUM(time_lost_s), "
            f"{UNMEASURED}, {UNCOUNTED}, {LOST_UNCOUNTED} FROM ({LATEST}) t GROUP BY account", (since,))
        return sorted(({"account": a, "jobs": n, "gpu_hours": _lost(gh, c), "gpus_uncounted": c,
                        "gpu_hours_lost": _lost(lh, u + lc), "time_lost_s": _lost(ls, u), "lost_unmeasured": u,
                        "lost_gpus_uncounted": lc}
                       for a, n, gh, lh, ls, u, c, lc in rows),
                      key=lambda d: (-(d["gpu_hours_lost"] or 0), -d["lost_unmeasured"], -(d["gpu_hours"] or 0)))

    # -- where the jobs' time went (their ledgers) ---------------------------------------
    # GPU-hours when the jobs said how many GPUs they had, node-hours always: a CPU job's
    # lost time still ranks. "why": the ledger part that cost the job the most.

    def not_training_jobs(self, since: float, limit: int) -> list[dict[str, Any]]:
        """The jobs whose allocation trained least, most GPU-hours (then node-hours) first;
        most node-hours first when some job's GPUs went uncounted (its GPU-hours unknown)."""
        (unknown,), = self._all(f"SELECT {UNCOUNTED} FROM ({LATEST}) t WHERE node_hours_not_training > 0", (since,))
        order = "node_hours_not_training DESC" if unknown else \
            "COALESCE(gpu_hours_not_training, 0) DESC, node_hours_not_training DESC"
        rows = self._all(
            "SELECT cluster, job, attempt, user_name, account, gpu_hours, node_hours, gpu_hours_not_training, "
            f"node_hours_not_training, not_training_why, not_training_bound FROM ({LATEST}) t "
            f"WHERE node_hours_not_training > 0 ORDER BY {order}, job LIMIT ?", (since, limit))
        return [{"cluster": c, "job": j, "attempt": a, "user": u, "account": acc, "gpu_hours": gh, "node_hours": nh,
                 "gpu_hours_not_training": gl, "node_hours_not_training": nl, "why": why, "lower_bound": int(bool(lb))}
                for c, j, a, u, acc, gh, nh, gl, nl, why, lb in rows]

    def not_training_by_user(self, since: float, limit: int) -> list[dict[str, Any]]:
        """Per user: the hours their jobs did not train, and the part that cost them most."""
        rows = self._all(
            "SELECT user_name, not_training_why, COUNT(*), SUM(gpu_hours_not_training), "
            f"SUM(node_hours_not_training), SUM(gpu_hours), SUM(node_hours), {UNCOUNTED}, {BOUNDED} "
            f"FROM ({LATEST}) t WHERE node_hours_not_training IS NOT NULL GROUP BY user_name, not_training_why",
            (since,))
        out: dict[Any, dict[str, Any]] = {}
        for user, why, n, gl, nl, gh, nh, uncounted, bounded in rows:
            d = out.setdefault(user, {"user": user, "jobs": 0, "gpu_hours_not_training": None, "gpus_uncounted": 0,
                                      "node_hours_not_training": 0.0, "gpu_hours": None, "node_hours": 0.0,
                                      "lower_bound": 0, "why": {}})
            d["jobs"] += n
            d["lower_bound"] += bounded
            d["gpus_uncounted"] += uncounted     # their GPU-hours are unknown: the sums below leave them out
            if gl is not None:
                d["gpu_hours_not_training"] = (d["gpu_hours_not_training"] or 0.0) + gl
            if gh is not None:
                d["gpu_hours"] = (d["gpu_hours"] or 0.0) + gh
            d["node_hours_not_training"] += nl or 0.0
            d["node_hours"] += nh or 0.0
            if why:
                d["why"][why] = d["why"].get(why, 0.0) + (nl or 0.0)     # node-hours: known for every job
        for d in out.values():
            d["why"] = max(d["why"], key=d["why"].get) if d["why"] else None
        return _most_not_training(list(out.values()), "user")[:limit]

    def not_training_by_node(self, since: float, limit: int) -> list[dict[str, Any]]:
        """Per node: the hours lost by the jobs that named it as the cause of a fault (hang
        culprit, lost), and in which roles; a crashed rank is its code's, never the node's.
        Only jobs with a ledger count, as for jobs and users: one without has no figure. A
        job's hours count once however many roles it named the node in; GPU-hours are None
        where no job's GPUs were counted (unknown, never 0), and the nodes rank on node-hours
        (known for every job) when any job's GPUs went uncounted."""
        rows = self._all(
            "SELECT n.node, SUM(n.culprit), SUM(n.lost), SUM(t.gpu_hours_not_training), "
            "SUM(t.node_hours_not_training), COALESCE(SUM(CASE WHEN t.gpu_hours_not_training IS NULL "
            f"THEN 1 ELSE 0 END), 0), {BOUNDED} "
            "FROM (SELECT node, cluster, job, attempt, MAX(CASE WHEN role = 'culprit' THEN 1 ELSE 0 END) AS culprit, "
            "MAX(CASE WHEN role = 'lost' THEN 1 ELSE 0 END) AS lost FROM job_nodes "
            "WHERE verified = 1 AND role IN ('culprit', 'lost') GROUP BY node, cluster, job, attempt) n "
            f"JOIN ({LATEST}) t ON t.cluster = n.cluster AND t.job = n.job AND t.attempt = n.attempt "
            "WHERE t.node_hours_not_training IS NOT NULL "       # a job without a ledger: not measured, not 0
            "GROUP BY n.node", (since,))
        out = [{"node": node, "gpu_hours_not_training": gl, "node_hours_not_training": nl or 0.0,
                "gpus_uncounted": uncounted, "lower_bound": bounded,
                "roles": {r: c for r, c in (("culprit", culprit), ("lost", lost)) if c}}
               for node, culprit, lost, gl, nl, uncounted, bounded in rows]
        return _most_not_training(out, "node")[:limit]


def _most_not_training(items: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Most GPU-hours not training first (then node-hours, then ``name``); most node-hours
    first when any item's GPU-hours leave a job out (``gpus_uncounted``): an unknown is not
    a 0 to rank below every known figure."""
    if any(d["gpus_uncounted"] for d in items):
        return sorted(items, key=lambda d: (-d["node_hours_not_training"], str(d[name])))
    return sorted(items, key=lambda d: (-(d["gpu_hours_not_training"] or 0.0), -d["node_hours_not_training"],
                                        str(d[name])))
