"""Job summaries in a real collector (``POST /v1/jobs``), on SQLite and on PostgreSQL: stored
once per (cluster, job, attempt), refused whole when bad, and older databases migrated."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap

import jsonschema
import pytest

from hpcml import schemas
from hpcml.centre.collector.store import SCHEMA_VERSION, StoreError, open_store
from tests.centre.collector.test_collector import call
from tests.centre.conftest import READ_TOKEN, TOKEN
from tests.centre.jobdocs import event, proven, summary


def jobs_stored(server) -> tuple[int, int]:
    n = server.store.count()
    return n["jobs"], n["job_nodes"]


def test_the_fixture_is_what_hpcml_run_writes(tmp_path):
    """The fixture has the keys, in the order, of the summary ``hpcml.run.summary.build``
    makes of a real job's directory, and both satisfy the schema file."""
    import subprocess
    import sys

    from hpcml.run.summary import build
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--dir", "job", "--no-report", "--",
                        sys.executable, "-c", "pass"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    real = build(tmp_path / "job").to_json()
    doc = summary("1", stragglers=[event("nid001", 3)])
    assert list(doc) == [k for k in real if k != "requeues"], (list(doc), list(real))    # requeues: Slurm jobs only
    for d in (doc, real):
        jsonschema.validate(d, schemas.load("job.summary"), cls=jsonschema.Draft202012Validator)


def test_a_summary_is_stored_once_however_often_it_is_sent(collector):
    one = summary("100", stragglers=[event("nid002", 5)], culprits=[event("nid001", 0)])
    code, answer = call(collector, "POST", "/v1/jobs", one)
    assert (code, answer) == (201, {"stored": 1, "duplicates": 0, "unverified": 1})   # the write token proves no one
    code, answer = call(collector, "POST", "/v1/jobs", one)
    assert (code, answer) == (200, {"stored": 0, "duplicates": 1, "unverified": 1})
    batch = [one, summary("100", 1), summary("101"), summary("101")]
    code, answer = call(collector, "POST", "/v1/jobs", batch)
    assert (code, answer) == (201, {"stored": 2, "duplicates": 2, "unverified": 4})
    assert jobs_stored(collector) == (3, 2)
    code, job = call(collector, "GET", "/v1/jobs/100", token=READ_TOKEN)
    assert code == 200 and [s["attempt"] for s in job["summaries"]] == [0, 1]
    assert job["summaries"][0]["culprits"] == [{"node": "nid001", "rank": 0, "attempt": 0, "detail": ""}]
    assert call(collector, "POST", "/v1/jobs", summary("102"), token=READ_TOKEN)[0] == 401


def test_the_same_job_id_on_two_clusters_is_two_jobs(collector):
    call(collector, "POST", "/v1/jobs", [summary("7", cluster="alps"), summary("7", cluster="eiger")])
    assert jobs_stored(collector)[0] == 2


GOOD = summary("200")


@pytest.mark.parametrize("body, words", [
    ({**GOOD, "schema": "hpcml.job.summary/2"}, "schema: written by a newer hpcml"),
    ({**GOOD, "schema": "hpcml.vet/1"}, "schema: not an hpcml.job.summary document"),
    ({k: v for k, v in GOOD.items() if k != "schema"}, "schema: no schema tag"),
    ({k: v for k, v in GOOD.items() if k != "job_id"}, "job_id: Field required"),
    ({**GOOD, "outcome": "exploded"}, "outcome:"),
    ({**GOOD, "gpu_hours": -1}, "gpu_hours:"),
    ({**GOOD, "gpu": {"score": 1.5}}, "gpu.score:"),
    ({**GOOD, "nodes": ["n" * 256]}, "nodes.0:"),
    ({**GOOD, "stragglers": [{"node": "nid\x00001"}]}, "stragglers.0.node:"),
    ([GOOD, {**GOOD, "attempt": -1}], "1.attempt:"),
    ({**GOOD, "gpus": 2**63}, "gpus:"),
    ({**GOOD, "stragglers": [{"node": "nid001", "rank": 2**40}]}, "stragglers.0.rank:"),
    ({**GOOD, "gpu_hours": 1e308}, "gpu_hours:"),
    ({**GOOD, "node_hours_not_training": 1e11}, "node_hours_not_training: 1e+11 for"),    # would own the ranking
    ({**GOOD, "not_training_why": "aliens"}, "not_training_why:"),
    ({**GOOD, "started": 1e15, "ended": 1e15 + 1}, "more than a day in the future"),
    ({**GOOD, "ended": GOOD["started"] - 1}, "is before started"),
    ({**GOOD, "culprits": [{"node": "elsewhere"}]}, "culprit: node 'elsewhere' is not one of the job's nodes"),
    ({**GOOD, "user": "eve\x1b[2J"}, "user: Value error, control characters"),
    ({**GOOD, "nodes": ["nid001\nfake line"]}, "nodes.0: Value error, control characters"),
    (42, "body: expected a job summary"),
    (b"{not json", "invalid JSON"),
])
def test_a_bad_summary_is_refused_whole_and_nothing_is_stored(collector, body, words):
    code, answer = call(collector, "POST", "/v1/jobs", body)
    assert code == 400 and words in answer["error"], answer
    assert "\n" not in answer["error"]
    assert jobs_stored(collector) == (0, 0)
    assert call(collector, "GET", "/healthz", token=None)[0] == 200


def test_oversized_and_unauthorised_summaries(collector):
    big = summary("300", nodes=[f"nid{i:06d}" for i in range(20_000)])
    assert call(collector, "POST", "/v1/jobs", big)[0] == 413          # the fixture's limit: 64 KiB
    assert call(collector, "POST", "/v1/jobs", GOOD, token="wrong-token")[0] == 401
    assert call(collector, "POST", "/v1/jobs", GOOD, token=None)[0] == 401
    assert jobs_stored(collector) == (0, 0)
    assert call(collector, "POST", "/v1/jobs", GOOD)[0] == 201


SENDER = textwrap.dedent("""
    import json, sys
    from hpcml.centre.client import post
    docs = json.load(sys.stdin)
    for i in range(0, len(docs), 20):
        why = post(sys.argv[1], "/v1/jobs", docs[i:i + 20], sys.argv[2], 30)
        assert why is None, why
""")


def test_two_processes_sending_the_same_summaries_at_once_store_each_once(collector):
    docs = [summary(str(1000 + i), stragglers=[event(f"nid{i % 7:03d}", i % 4)]) for i in range(300)]
    procs = [subprocess.Popen([sys.executable, "-c", SENDER, collector.url, TOKEN], stdin=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(json.dumps(docs if p is procs[0] else docs[::-1]))
        p.stdin.close()
    for p in procs:
        assert p.wait(120) == 0, p.stderr.read() if p.stderr else ""
    assert jobs_stored(collector) == (300, 300)


def _version_1(url: str) -> None:
    """A database as the collector before job summaries left it: the vetting tables, one
    report in them, no version row."""
    if url.startswith("sqlite"):
        from hpcml.centre.collector.sqlite import DDL, path_of
        with sqlite3.connect(path_of(url)) as conn:
            conn.executescript(DDL)
            conn.execute("INSERT INTO reports VALUES (1, 'j1', 'nid001', 1.0, 'cpu', 'bad', 2.0)")
            conn.execute("INSERT INTO results VALUES (1, 0, 'nid001', 'j1', 1.0, 'mem', 'memory', 'fail', "
                         "1.0, NULL, 'GB', 'low', 0.1)")
        return
    import psycopg

    from hpcml.centre.collector.postgres import DDL as PG_DDL
    with psycopg.connect(url, autocommit=True) as conn:
        for stmt in filter(str.strip, PG_DDL.split(";")):
            conn.execute(stmt)
        conn.execute("INSERT INTO reports (job, node, time, protocol, verdict, received) "
                     "VALUES ('j1', 'nid001', 1.0, 'cpu', 'bad', 2.0)")
        conn.execute("INSERT INTO results VALUES (1, 0, 'nid001', 'j1', 1.0, 'mem', 'memory', 'fail', "
                     "1.0, NULL, 'GB', 'low', 0.1)")


def _set_version(url: str, version: int) -> None:
    if url.startswith("sqlite"):
        from hpcml.centre.collector.sqlite import path_of
        with sqlite3.connect(path_of(url)) as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
        return
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(version),))


def test_a_version_1_database_is_migrated_with_its_results_kept(db_url):
    _version_1(db_url)
    store = open_store(db_url)
    try:
        assert store.count() == {"reports": 1, "results": 1, "jobs": 0, "job_nodes": 0}
        assert store.history("nid001")[0]["results"][0]["name"] == "mem"
        assert store.failing(0.0) == []       # from before proofs: kept, shown, counted as evidence nowhere
        (version,), = store._all("SELECT value FROM meta WHERE key = 'schema_version'")
        assert int(version) == SCHEMA_VERSION
        assert store.add_jobs([proven(summary("9"))]) == [True]
    finally:
        store.close()
    again = open_store(db_url)                 # opening a migrated database changes nothing
    try:
        assert again.count() == {"reports": 1, "results": 1, "jobs": 1, "job_nodes": 0}
    finally:
        again.close()
    _set_version(db_url, SCHEMA_VERSION + 1)
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, written by a newer hpcml"):
        open_store(db_url)


def test_a_job_token_may_only_send_summaries_and_reports(db_url):
    """A job token sends (what it sends is proven, not believed: a report it alone backs is
    stored unverified) and reads nothing."""
    from hpcml.centre.collector.server import Tokens, start
    job_token = "job-token-0123456789abcdef"
    server = start(open_store(db_url), Tokens([TOKEN], [READ_TOKEN], [job_token]))
    try:
        assert call(server, "POST", "/v1/jobs", summary("1"), token=job_token)[0] == 201
        code, body = call(server, "POST", "/v1/reports", {"node": "n1", "time": 1, "verdict": "bad"}, token=job_token)
        assert (code, body["unverified"]) == (201, 1)
        assert call(server, "GET", "/v1/jobs/1", token=job_token)[0] == 401
        assert call(server, "GET", "/v1/fleet?since=1d", token=READ_TOKEN)[0] == 200
        assert call(server, "POST", "/v1/jobs", summary("2"), token=READ_TOKEN)[0] == 401
        assert jobs_stored(server)[0] == 1
    finally:
        server.close()


def test_two_collectors_writing_attempts_of_the_same_jobs_keep_one_latest_each(db_url):
    """Two stores on one database (two collectors), attempts 0 and 1 of each job written at
    the same moment from two threads: each job is counted once, at attempt 1."""
    import threading

    stores = [open_store(db_url), open_store(db_url)]
    try:
        barrier = threading.Barrier(2)

        def write(store, attempt: int) -> None:
            for j in range(60):
                barrier.wait(30)
                store.add_jobs([proven(summary(f"c{j}", attempt, hours=1.0 + attempt))])

        threads = [threading.Thread(target=write, args=(stores[a], a)) for a in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        rows = stores[0]._all("SELECT job, attempt FROM jobs WHERE latest = 1 ORDER BY job")
        assert sorted(rows) == sorted((f"c{j}", 1) for j in range(60))
    finally:
        for st in stores:
            st.close()


OPENER = textwrap.dedent("""
    import sys
    from hpcml.centre.collector.store import open_store
    open_store(sys.argv[1]).close()
""")


def test_two_collectors_opening_a_new_database_at_once_both_start(tmp_path):
    for trial in range(8):
        url = f"sqlite:///{tmp_path}/race{trial}.db"
        procs = [subprocess.Popen([sys.executable, "-c", OPENER, url], stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err


def test_a_damaged_version_row_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path}/c.db"
    open_store(url).close()
    with sqlite3.connect(tmp_path / "c.db") as conn:
        conn.execute("UPDATE meta SET value = 'two' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version is 'two', not a number"):
        open_store(url)


# --- who sent it: the store's side (the real MUNGE and Slurm: test_proof_slurm.py) ----------

def test_a_verified_summary_wins_over_an_unverified_one_in_the_same_batch_or_later(db_url):
    """However they arrive, a key's verified summary is the one stored and counted; the
    unverified one never shadows it, and GET /v1/jobs says which is which."""
    from hpcml.centre.collector.server import Tokens, start
    from hpcml.centre.summaries import Received as JobSummary
    store = open_store(db_url)
    forged = summary("7", user="mallory", culprits=[event("nid001", 0)])
    real = summary("7", user="alice", stragglers=[event("nid002", 1)])
    assert store.add_jobs([JobSummary.model_validate(forged), proven(real)]) == [False, True]
    store.add_jobs([JobSummary.model_validate(summary("8", user="mallory"))])
    assert store.add_jobs([proven(summary("8", user="bob"))]) == [True]
    rows = store._all("SELECT job, user_name, verified FROM jobs ORDER BY job")
    assert rows == [("7", "alice", 1), ("8", "bob", 1)]
    assert {(e["node"], e["role"]) for e in store.job_events_since(0)} == {("nid002", "straggler")}
    server = start(store, Tokens([TOKEN], [READ_TOKEN]))
    try:
        (doc,) = call(server, "GET", "/v1/jobs/7")[1]["summaries"]
        assert doc["proof"] == {"how": "munge", "verified": True, "user": "alice"}
    finally:
        server.close()
        server.close()                                   # twice: harmless


def test_vetting_repeated_by_later_attempts_counts_once(db_url):
    store = open_store(db_url)
    try:
        vetted = [{"node": "nid001", "attempt": 0, "time": __import__("time").time() - 7200, "verdict": "bad",
                   "failing": ["gpu-burn"]}]
        store.add_jobs([proven(summary("9", a, hours=1.0 + a, vetting=vetted)) for a in range(3)])
        v = store.vet_history(["nid001"], 0)["nid001"]
        assert (v["reports"], v["bad"], v["failing_checks"]) == (1, 1, [{"check": "gpu-burn", "count": 1}])
    finally:
        store.close()


def test_an_unproven_summarys_vetting_never_shadows_the_proven_jobs_own(db_url):
    """Attempt 0 came with the write token only, attempt 1 proven, each repeating the job's
    vetting: the proven copy counts (its failing checks, not the unproven one's)."""
    from hpcml.centre.summaries import Received as JobSummary
    store = open_store(db_url)
    try:
        at = __import__("time").time() - 7000.123456
        said = [{"node": "nid002", "attempt": 0, "time": at, "verdict": "bad", "failing": ["made-up"]}]
        vetted = [{**said[0], "failing": ["gpu-count"]}]
        store.add_jobs([JobSummary.model_validate(summary("700", 0, hours=0.9, vetting=said, requeues=0))])
        assert store.vet_history(["nid002"], 0)["nid002"]["reports"] == 0
        store.add_jobs([proven(summary("700", 1, hours=0.9, vetting=vetted, requeues=1))])
        v = store.vet_history(["nid002"], 0)["nid002"]
        assert (v["reports"], v["bad"], v["failing_checks"]) == (1, 1, [{"check": "gpu-count", "count": 1}])
        store.add_jobs([JobSummary.model_validate(summary("700", 2, hours=0.9, vetting=said, requeues=2))])
        assert store.vet_history(["nid002"], 0)["nid002"]["failing_checks"] == [{"check": "gpu-count", "count": 1}]
    finally:
        store.close()


def test_job_token_lines():
    from hpcml.centre.collector.server import Tokens
    t = Tokens([TOKEN], jobs=["alice:s3cret:with:colons", "bare-token-0123"])
    assert t.grant("Bearer s3cret:with:colons").user == "alice"
    assert t.grant("Bearer bare-token-0123").user is None and t.grant("Bearer colons") is None
    with pytest.raises(ValueError, match="USER:TOKEN"):
        Tokens([TOKEN], jobs=["not a user:tok"])


def test_one_person_proven_two_ways_counts_once():
    """MUNGE proves a uid, a user token a name: both become the same uid."""
    import os
    import pwd

    from hpcml.centre.collector.proof import Sender, Verifier
    from hpcml.centre.summaries import Received as JobSummary
    me = pwd.getpwuid(os.getuid()).pw_name
    s = JobSummary.model_validate(summary("1"))
    proof = Verifier(slurm=None).prove({}, s, Sender(user=me))
    assert (proof.how, proof.uid, proof.verified) == ("token", os.getuid(), True)
    assert Verifier(slurm=None).prove({}, s, Sender()).verified is False


def _version_5(url: str) -> None:
    """A database as the collector of schema version 5 left it (GPUs and GPU-hours NOT
    NULL): a version-1 database taken up by the migrations of that collector."""
    from hpcml.centre.collector.store import MIGRATIONS
    _version_1(url)
    ddl = ";".join(MIGRATIONS[v] for v in (2, 3, 4, 5))      # type: ignore[misc] - versions 2-5 are one DDL each
    meta = ["CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "INSERT INTO meta (key, value) VALUES ('schema_version', '5')"]
    stmts = [s for s in ddl.split(";") if s.strip()] + meta
    if url.startswith("sqlite"):
        from hpcml.centre.collector.sqlite import path_of
        with sqlite3.connect(path_of(url)) as conn:
            for stmt in stmts:
                conn.execute(stmt)
        return
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        for stmt in stmts:
            conn.execute(stmt)


def _columns(store) -> list[tuple]:
    """The jobs table's columns: name, type, NOT NULL, default (as each backend says them)."""
    if store.DIALECT == "sqlite":
        return sorted((n, t, bool(nn), d) for _cid, n, t, nn, d, _pk in store._all("PRAGMA table_info(jobs)"))
    return sorted(store._all("SELECT column_name, data_type, is_nullable = 'NO', column_default "
                             "FROM information_schema.columns WHERE table_name = 'jobs'"))


def test_a_version_5_database_takes_jobs_whose_gpus_nobody_counted(db_url, request):
    """A job whose GPUs nobody counted (no rank ran: vetting aborted it) is stored with its
    GPUs and GPU-hours unknown (NULL), in a database made by the version before, whose
    columns said NOT NULL (where the old collector stored such a job as 0 GPUs); the rows
    already there are kept as they were, and the table is the one a new database has."""
    from hpcml.centre.jobstore import JOB_COLS_V6 as JOB_COLS
    from hpcml.centre.jobstore import job_row
    _version_5(db_url)
    old = proven(summary("8", gpus_per_node=2, hours=1.0))
    marks = ",".join(["?" if db_url.startswith("sqlite") else "%s"] * len(JOB_COLS))
    insert = f"INSERT INTO jobs ({','.join(JOB_COLS)}) VALUES ({marks})"
    row = job_row(old, 1.0)[:len(JOB_COLS)]          # the row as that collector stored it
    if db_url.startswith("sqlite"):
        from hpcml.centre.collector.sqlite import path_of
        with sqlite3.connect(path_of(db_url)) as conn:
            conn.execute(insert, row)
            before = conn.execute(f"SELECT {','.join(JOB_COLS)} FROM jobs").fetchall()
    else:
        import psycopg
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(insert, row)
            before = conn.execute(f"SELECT {','.join(JOB_COLS)} FROM jobs").fetchall()
    store = open_store(db_url)
    fresh = open_store(db_url.replace("vet.db", "fresh.db") if db_url.startswith("sqlite")
                       else request.getfixturevalue("pg_cluster").create_db(f"fresh{abs(hash(db_url))}"))
    try:
        assert store._all(f"SELECT {','.join(JOB_COLS)} FROM jobs") == [tuple(r) for r in before]
        assert store.add_jobs([proven(summary("9", counted=False, hours=2.0))]) == [True]
        assert store._all("SELECT gpus, gpu_hours, gpu_hours_lost FROM jobs WHERE job = '9'") == [(None, None, None)]
        totals = store.job_totals(0.0)
        assert totals["gpu_hours"] == pytest.approx(4.0) and totals["gpus_uncounted"] == 1     # 8's only, not 9's 0
        assert totals["node_hours"] == pytest.approx(2.0 + 4.0)
        assert _columns(store) == _columns(fresh)
        notnull = {n: nn for n, _t, nn, _d in _columns(store)}
        assert not notnull["gpus"] and not notnull["gpu_hours"] and notnull["node_hours"]
    finally:
        store.close()
        fresh.close()


def test_totals_of_jobs_whose_gpus_nobody_counted_are_not_0(db_url):
    """Only jobs whose GPUs nobody counted: their GPU-hours are unknown (None), not 0.0; the
    accounts' too; a node such a job's fault stopped prices its loss in node-hours."""
    store = open_store(db_url)
    try:
        assert store.add_jobs([proven(summary("1", counted=False, outcome="failed", lost=[event("nid001")])),
                               proven(summary("2", counted=False))]) == [True, True]
        totals = store.job_totals(0.0)
        assert totals["gpu_hours"] is None and totals["gpus_uncounted"] == 2 and totals["node_hours"] > 0
        assert totals["gpu_hours_stopped"] is None and totals["stopped_by_node"] == 1
        (account,) = store.lost_by_account(0.0)
        assert account["gpu_hours"] is None and account["gpus_uncounted"] == 2
        node = store.node_details(["nid001"], 0.0)["nid001"]
        assert node["gpus_uncounted"] == 1 and node["node_hours_lost"] == pytest.approx(2.0)
    finally:
        store.close()


def test_a_nodes_time_not_training_is_unknown_never_0_and_counts_each_job_once(db_url):
    """nid090: the culprit of a hung job whose GPUs nobody counted (15 node-hours, GPU-hours
    unknown); nid091: a counted job's (0.125 GPU-h); nid092: named by one job both culprit and
    lost (its 2 GPU-h once). Unknown GPU-hours are null, not 0.0, and do not rank the node
    last: with one unknown, the nodes rank on node-hours (known for every job)."""
    from hpcml.centre.report import build, lines
    store = open_store(db_url)
    day = 86400.0
    now = __import__("time").time()
    try:
        store.add_jobs([
            proven(summary("90", ended=now - day, user="ann", hours=5.0, ettr=0.0, why="stopping", outcome="hung",
                           counted=False, culprits=[event("nid090", 1)])),
            proven(summary("91", ended=now - day, user="bo", hours=0.25, ettr=0.5, why="idle", outcome="hung",
                           nodes=["nid091"], gpus_per_node=1, culprits=[event("nid091", 0)])),
            proven(summary("92", ended=now - day, user="cy", hours=1.0, ettr=0.5, why="idle", outcome="hung",
                           nodes=["nid092"], gpus_per_node=4, culprits=[event("nid092", 0)], lost=[event("nid092", 0)]))])
        rep = build(store, 30 * day)
        got = [(n["node"], n["gpu_hours_not_training"], n["node_hours_not_training"], n["gpus_uncounted"], n["roles"])
               for n in rep["not_training"]["nodes"]]
        assert got == [("nid090", None, pytest.approx(15.0), 1, {"culprit": 1}),
                       ("nid092", pytest.approx(2.0), pytest.approx(0.5), 0, {"culprit": 1, "lost": 1}),
                       ("nid091", pytest.approx(0.125), pytest.approx(0.125), 0, {"culprit": 1})]
        assert [j["job"] for j in rep["not_training"]["jobs"]] == ["90", "92", "91"]
        jsonschema.validate(json.loads(json.dumps(rep)), schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
        text = [line for line in lines(rep) if line.startswith("  node nid09")]
        assert text[0] == "  node nid090: 15.00 node-h in jobs that named it culprit 1x", text
        assert not any("0.00 GPU-h" in line for line in text)
    finally:
        store.close()


def test_a_nodes_lost_gpu_hours_are_not_shown_whole_when_a_jobs_gpus_went_uncounted(db_url):
    """Two jobs lost time to node nid009, one whose GPUs nobody counted: the node's lost
    GPU-hours leave that job out, so the node says node-hours, known for both (was: the
    counted job's GPU-hours alone, shown as the node's whole loss)."""
    from hpcml.centre.report import _impact
    store = open_store(db_url)
    try:
        store.add_jobs([proven(summary("3", outcome="hung", time_lost_s=3600, lost=[event("nid009")])),
                        proven(summary("4", outcome="hung", time_lost_s=1800, counted=False, lost=[event("nid009")]))])
        node = store.node_details(["nid009"], 0.0)["nid009"]
        assert node["gpus_uncounted"] == 1 and node["gpu_hours_lost"] == pytest.approx(12.0)
        assert node["node_hours_lost"] == pytest.approx(3 * 1.0 + 3 * 0.5)
        assert "lost 4.5 node-h" in _impact(node), _impact(node)
    finally:
        store.close()


def test_a_nodes_lost_hours_say_at_least_where_a_job_it_slowed_went_unpriced(db_url):
    """nid019 hung one job (its loss measured: 12 GPU-h) and slowed another, which completed
    with no loss priced (a straggler's slowdown is not): the node lost "at least" 12 GPU-h,
    naming the job not priced (was: 12.0 GPU-h, as if the whole)."""
    from hpcml.centre.report import _impact
    store = open_store(db_url)
    try:
        store.add_jobs([proven(summary("5", outcome="hung", time_lost_s=3600, lost=[event("nid019")])),
                        proven(summary("6", stragglers=[event("nid019", 1)]))])
        node = store.node_details(["nid019"], 0.0)["nid019"]
        assert node["unpriced"] == 1 and node["gpu_hours_lost"] == pytest.approx(12.0), node
        assert "lost at least 12.0 GPU-h (1 job not priced)" in _impact(node), _impact(node)
        store.add_jobs([proven(summary("7", stragglers=[event("nid020", 1)]))])
        alone = store.node_details(["nid020"], 0.0)["nid020"]
        assert alone["node_hours_lost"] is None and "not measured" in _impact(alone)
    finally:
        store.close()
