"""Running the collector as a service (issue 69 item 5): Prometheus metrics, readiness that
asks the database (a real PostgreSQL halted and started again), timestamped and JSON logs,
token files read again on change and on SIGHUP, the password kept out of argv; and the
handler's textfile for node_exporter. Each collector is a real ``hpcml centre serve``."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcml.ports import free_port
from tests.centre.conftest import TOKEN
from tests.centre.pgcluster import PgCluster
from tests.vet.reports import vet_report

JOB = "job-token-0123456789abcdef"
NEW = "new-job-token-0123456789abcdef"


class Served:
    def __init__(self, db: str, *args: str, env: dict | None = None) -> None:
        self.port = free_port("127.0.0.1")
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcml", "centre", "serve", "--db", db, "--port",
                                      str(self.port), "--slurm-check", "off", *args],
                                     env={**os.environ, "HPCML_VET_TOKEN": TOKEN, **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, line + (self.proc.stderr.read() if self.proc.stderr else "")

    def call(self, method: str, path: str, body=None, token: str | None = TOKEN) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        out = resp.read()
        conn.close()
        return resp.status, out, resp.getheader("Content-Type") or ""

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        return self.proc.stderr.read() if self.proc.stderr else ""


def _samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_count_requests_by_route_and_status_and_what_was_stored(tmp_path):
    s = Served(f"sqlite:///{tmp_path}/c.db", "--verbose")
    try:
        assert s.call("GET", "/healthz")[0] == 200
        assert s.call("GET", "/v1/plan", token=None)[0] == 401
        assert s.call("GET", "/v1/nodes/n1/history")[0] == 200
        assert s.call("POST", "/v1/reports", vet_report({"n1": [("gpu", "gpu", "fail")]}))[0] == 201
        assert s.call("POST", "/v1/reports", {"node": "n1"})[0] == 400
        code, body, ctype = s.call("GET", "/metrics", token=None)
        assert code == 200 and ctype.startswith("text/plain")
        got = _samples(body.decode())
        assert got[("hpcml_collector_requests_total", (("method", "GET"), ("route", "/healthz"), ("status", "200")))] == 1
        assert got[("hpcml_collector_requests_total", (("method", "GET"), ("route", "/v1/plan"), ("status", "401")))] == 1
        assert got[("hpcml_collector_requests_total",
                    (("method", "GET"), ("route", "/v1/nodes/NODE/history"), ("status", "200")))] == 1
        assert got[("hpcml_collector_documents_total", (("kind", "report"), ("result", "stored")))] == 1
        assert got[("hpcml_collector_documents_total", (("kind", "report"), ("result", "unverified")))] == 1
        assert got[("hpcml_collector_request_seconds_count", (("route", "/v1/reports"),))] == 2
        assert got[("hpcml_collector_refused_total", (("reason", "token"),))] == 1
        assert got[("hpcml_collector_refused_total", (("reason", "invalid"),))] == 1
        assert got[("hpcml_collector_refused_total", (("reason", "too_large"),))] == 0
    finally:
        err = s.stop()
    # the log: each line with its UTC time and level
    lines = [ln for ln in err.splitlines() if "GET /healthz" in ln]
    assert lines and lines[0][:20].endswith("Z") and " INFO " in lines[0], err


def test_refusals_are_counted_by_reason_and_the_senders_spools_as_their_nodes_told():
    """Refusals by a fixed set of reasons (a wrong token, an invalid body, a body too large);
    the senders' spool depth from each node's newest proven report (a report only a token
    backs tells nothing: it could say anything)."""
    from hpcml.centre.collector.schema import NodeReport
    from hpcml.centre.collector.server import Metrics

    def rep(node, t, waiting, evidence="node"):
        r = NodeReport.model_validate({"node": node, "time": t, "verdict": "good", "spool_waiting": waiting})
        r.proven(evidence, "root")
        return r
    m = Metrics()
    m.spools([rep("n1", 10, 3), rep("n2", 10, 2)])
    m.spools([rep("n1", 5, 9), rep("n2", 20, 0), rep("n3", 30, 7, evidence="none")])  # n1's older report: not it
    got = _samples(m.exposition()[0].decode())
    assert got[("hpcml_collector_sender_spool_reports", ())] == 3
    assert got[("hpcml_collector_refused_total", (("reason", "proof"),))] == 0


def test_readiness_asks_the_database_health_does_not(tmp_path):
    """A real PostgreSQL halted under a running collector: /healthz 200 (the process), /readyz
    503 naming the database, then 200 again once it is back."""
    pg = PgCluster().start()
    try:
        s = Served(pg.create_db("ready"), "--log-json")
        try:
            assert s.call("GET", "/readyz")[0] == 200
            pg.halt()
            code, body, _ = s.call("GET", "/readyz")
            assert code == 503 and b"database" in body
            assert s.call("GET", "/healthz")[0] == 200
            pg.start_again()
            deadline = time.monotonic() + 30
            while s.call("GET", "/readyz")[0] != 200:
                assert time.monotonic() < deadline, "the collector never got its database back"
                time.sleep(0.5)
            metrics = _samples(s.call("GET", "/metrics", token=None)[1].decode())
            assert metrics[("hpcml_collector_database_errors_total", ())] >= 1
        finally:
            err = s.stop()
    finally:
        pg.stop()
    logged = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    assert logged and all({"time", "level", "logger", "message"} <= set(e) for e in logged), err


@pytest.mark.parametrize("url", ["postgresql://u@h/db?password=s3cret", "postgresql://u@h/db?sslpassword=x",
                                 "postgresql://u:p@[h/db"])
def test_a_password_in_the_query_or_a_url_that_does_not_read_is_refused(url):
    """libpq takes ``?password=`` too; a URL urllib cannot read is refused, not let through."""
    from hpcml.centre.collector.store import refuse_password
    from hpcml.errors import UsageError
    with pytest.raises(UsageError, match="--db|db"):
        refuse_password(url)
    refuse_password("postgresql://u@h:5432/db?sslmode=require")       # no password: fine


def test_the_password_comes_from_pgpassfile_never_argv(tmp_path):
    """A PostgreSQL that asks every connection for a password: the collector given the URL
    without one and PGPASSFILE (mode 0600) is ready; without the file it does not start."""
    pg = PgCluster().start(password="s3cret-pw")
    try:
        url = pg.url()
        passfile = tmp_path / "pgpass"
        passfile.write_text(f"127.0.0.1:{pg.port}:*:postgres:s3cret-pw\n")
        passfile.chmod(0o600)
        s = Served(url, env={"PGPASSFILE": str(passfile)})
        try:
            assert s.call("GET", "/readyz")[0] == 200
            assert s.call("POST", "/v1/reports", vet_report({"n1": [("gpu", "gpu", "fail")]}))[0] == 201
        finally:
            s.stop()
        p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "serve", "--db", url, "--port", "0",
                            "--slurm-check", "off"], env={**os.environ, "HPCML_VET_TOKEN": TOKEN,
                                                          "PGPASSFILE": str(tmp_path / "none")},
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "password" in p.stderr and "s3cret" not in p.stderr, p.stderr
    finally:
        pg.stop()


def test_token_files_are_read_again_on_change_and_on_sighup(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.write_text(JOB + "\n")
    s = Served(f"sqlite:///{tmp_path}/c.db", "--job-token-file", str(jobs))
    try:
        assert s.call("GET", "/v1/plan", token=JOB)[0] == 200
        assert s.call("GET", "/v1/plan", token=NEW)[0] == 401
        jobs.write_text(JOB + "\n" + NEW + "\n")                 # a token added: works without a restart

        def answer(token: str, want: int) -> None:
            deadline = time.monotonic() + 15
            while s.call("GET", "/v1/plan", token=token)[0] != want:
                assert time.monotonic() < deadline, f"{token[:8]}: never {want}"
                time.sleep(0.3)
        answer(NEW, 200)
        jobs.write_text(NEW + "\n")                               # revoked
        answer(JOB, 401)
        # SIGHUP reads them even when the change cannot be seen: same size, same mtime
        before = os.stat(jobs)
        other = NEW[:-1] + "X"
        jobs.write_text(other + "\n")
        os.utime(jobs, ns=(before.st_atime_ns, before.st_mtime_ns))
        time.sleep(2.5)
        assert s.call("GET", "/v1/plan", token=other)[0] == 401
        s.proc.send_signal(signal.SIGHUP)
        answer(other, 200)
        jobs.write_text("9bad-user:token\n")                     # a file that does not read keeps the tokens
        time.sleep(2.5)
        assert s.call("GET", "/v1/plan", token=other)[0] == 200
        jobs.unlink()                                             # nor does one that is gone
        time.sleep(2.5)
        assert s.call("GET", "/v1/plan", token=other)[0] == 200
    finally:
        err = s.stop()
    assert "token files reloaded" in err and "token files not reloaded" in err


@pytest.mark.parametrize("command", [["serve", "--port", "0", "--slurm-check", "off"], ["report"], ["handle", "--dry-run"]])
def test_a_password_in_the_database_url_is_refused_in_one_line(tmp_path, command):
    """argv is in every user's ps: the password goes in PGPASSFILE or PGPASSWORD, never --db."""
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", *command, "--db", "postgresql://u:secret@127.0.0.1:1/x"],
                       env={**os.environ, "HPCML_VET_TOKEN": TOKEN}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "--db" in line and "every user sees in ps" in line and "PGPASSFILE" in line and "secret" not in line


def test_the_handler_writes_its_figures_for_node_exporter(tmp_path):
    from tests.vet.reports import vet_report
    reports = tmp_path / "r"
    for i in range(3):
        d = reports / f"run{i}"
        d.mkdir(parents=True)
        (d / "report.json").write_text(json.dumps(vet_report({"n1": [("gpu", "gpu", "fail")]},
                                                             started_at=time.time() - 60 + i)))
    prom = tmp_path / "hpcml.prom"
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "handle", "--results", str(reports), "--dry-run",
                        "--audit", str(tmp_path / "audit.jsonl"), "--textfile", str(prom)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": "/nonexistent"})
    got = _samples(prom.read_text()) if prom.exists() else {}
    # no Slurm here (PATH has no sinfo): the run fails, and the textfile says so
    assert p.returncode == 1 and got.get(("hpcml_handler_up", ())) == 0.0, (p.stdout, p.stderr)
    assert got[("hpcml_handler_last_run_timestamp_seconds", ())] > time.time() - 120
