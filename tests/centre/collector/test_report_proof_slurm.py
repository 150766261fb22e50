"""Vetting reports are proven like job summaries: real users, real MUNGE, real Slurm.

A real collector (``hpcml centre serve`` with Slurm's config) and the local cluster's own
munged. Reports are sent the ways they come in: with the shared write token alone (what
every job script holds), signed by a real user (``runuser`` + the ``munge`` command) about
a real job of theirs (an ``sbatch`` job holding n1) and about nodes and jobs that are not
theirs, and signed by root on the node (the prolog's uid). Nothing a token or a user sends
may drain or resume a node; root's report of a failing node drains it, and only root's
passes resume it.

One limit of a one-host cluster: every virtual node's address is 127.0.0.1, so "made on
the node it is about" cannot fail here; ``tests/centre/collector/test_report_proof.py`` tests that
refusal with another node address.
"""

from __future__ import annotations

import json
import pwd
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hpcml.centre.collector.proof import AUTH_KEY, credential
from tests.centre.collector.test_proof_slurm import (  # noqa: F401 - fixtures
    JOB_TOKEN,
    OPERATOR,
    _drained,
    _user_env,
    collector,
    shared,
    signed,
    undrain,
    users,
)
from tests.centre.jobdocs import summary
from tests.slurmjobs import wait

pytestmark = [pytest.mark.slurm]

CHECK_RULES = """\
name: checks
max_drain_fraction: 100%
rules:
  - name: xid
    match: {check: xid}
    count: 1
    window: 1 h
    reason: "hpcml: {check} failed on {node}"
    resume_after: {passes: 2}
"""


def report(node: str, outcome: str, job: str | None = None, at: float | None = None) -> dict:
    return {"job_id": job, "node": node, "time": at if at is not None else time.time(),
            "verdict": "bad" if outcome == "fail" else "good",
            "results": [{"name": "xid", "type": "gpu", "outcome": outcome}]}


def post(c, doc) -> tuple[int, dict]:
    """A report to the collector, with the write token every job script holds."""
    return c.post(doc, token=OPERATOR, path="/v1/reports")


def get(url: str, path: str) -> int:
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {OPERATOR}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def handle(work: Path, db: Path, env: dict[str, str], *extra: str) -> list[tuple[str, str, str]]:
    (work / "check-rules.yaml").write_text(CHECK_RULES)
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "handle", "--db", f"sqlite:///{db}",
                        "--rules", str(work / "check-rules.yaml"), "--audit", str(work / "audit.jsonl"),
                        "--json", *extra], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [(a["node"], a["action"], a["status"]) for a in json.loads(p.stdout)["actions"]]


def as_root(doc: dict, socket: str) -> dict:
    auth = credential(doc, socket)
    assert auth is not None
    return {**doc, AUTH_KEY: auth}


def test_only_the_nodes_own_evidence_drains_and_resumes(users, shared, collector, slurm_cluster,  # noqa: F811
                                                        slurm_env, undrain):  # noqa: F811 - the fixtures above
    alice, _ = users
    sock = str(slurm_cluster.munge_socket)
    env_a = _user_env(shared, alice, slurm_env)
    url = collector.url

    # the write token alone: stored, unverified, never acted on
    for _ in range(3):
        code, answer = post(collector, report("n2", "fail"))
        assert (code, answer["unverified"]) == (201, 1), answer
    assert handle(shared, collector.db, slurm_env, "--dry-run") == []

    # a user's signed report: of no job, of a job Slurm never saw
    code, answer = post(collector, signed(report("n2", "fail"), alice, sock, env_a))
    assert code == 403 and "job_id" in answer["error"], answer
    code, answer = post(collector, signed(report("n2", "fail", job="999999"), alice, sock, env_a))
    assert code == 403 and "no record" in answer["error"], answer

    # alice's real job on n1: her report of it is job evidence, which this rule does not count
    out = subprocess.run(["runuser", "-u", alice, "--", "sbatch", "--parsable", "--nodelist=n1", "--nodes=1",
                          f"--chdir={shared}", "--output=/dev/null", "--wrap", "sleep 120"],
                         env=env_a, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while "JobState=RUNNING" not in subprocess.run(["scontrol", "show", "-o", "job", job], env=slurm_env,
                                                       capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "alice's job did not start"
            time.sleep(0.5)
        time.sleep(1)
        code, answer = post(collector, signed(report("n1", "fail", job=job), alice, sock, env_a))
        assert (code, answer["unverified"]) == (201, 0), answer
        code, answer = post(collector, signed(report("n2", "fail", job=job), alice, sock, env_a))
        assert code == 403 and "did not run on n2" in answer["error"], answer
        code, answer = post(collector, signed(report("n1", "fail", job=job, at=time.time() + 3600), alice, sock, env_a))
        assert code == 403 and "ahead" in answer["error"], answer
        assert handle(shared, collector.db, slurm_env, "--dry-run") == []

        # a summary of an array task of a job that is no array: Slurm says no such job (403,
        # set aside), not "unavailable" (503, retried for ever)
        code, answer = collector.post(signed(summary(f"{job}_0", nodes=["n1"], user=alice, cluster="hpcmllocal"),
                                             alice, sock, env_a))
        assert code == 403, answer
    finally:
        subprocess.run(["scancel", job], env=slurm_env, capture_output=True, timeout=30)
        wait(job, slurm_env, timeout=60)

    # root on the node (the prolog's uid): node evidence, which drains
    mine = as_root(report("n2", "fail"), sock)
    assert post(collector, mine)[0] == 201
    assert post(collector, mine) == (401, {"error": "auth.munge: Replayed credential"})
    lifted = {**report("n1", "fail"), AUTH_KEY: as_root(report("n1", "pass"), sock)[AUTH_KEY]}
    code, answer = post(collector, lifted)
    assert code == 403 and "another report" in answer["error"], answer
    assert handle(shared, collector.db, slurm_env) == [("n2", "drain", "done")]
    assert _drained("n2", slurm_env) and not _drained("n1", slurm_env)

    # passes the token backs, or a user, do not resume it; root's do
    for _ in range(3):
        assert post(collector, report("n2", "pass"))[0] == 201
    assert handle(shared, collector.db, slurm_env) == [("n2", "hold", "planned")]
    assert _drained("n2", slurm_env)
    for _ in range(2):
        assert post(collector, as_root(report("n2", "pass"), sock))[0] == 201
    assert handle(shared, collector.db, slurm_env) == [("n2", "resume", "done")]
    assert not _drained("n2", slurm_env)

    with sqlite3.connect(collector.db) as conn:
        kinds = conn.execute("SELECT evidence, sender, COUNT(*) FROM reports GROUP BY evidence, sender "
                             "ORDER BY evidence").fetchall()
    # alice as one person, whichever proof she sends: Slurm's uid (as her jobs' events name her)
    assert kinds == [("job", f"uid:{pwd.getpwnam(alice).pw_uid}", 1), ("node", "root", 3), ("none", None, 6)], kinds
    assert get(url, "/v1/nodes/%00/history") == 400


PROLOG_PROTOCOL = """\
name: prolog-evidence
evals:
  - name: on-n1
    type: env
    expected: {SLURMD_NODENAME: n1}
"""
PROLOG_RULES = CHECK_RULES.replace("match: {check: xid}", "match: {check: on-n1}")


def _prolog_round(shared: Path, collector, slurm_cluster, slurm_env) -> str:  # noqa: F811 - the fixture's type
    """One 2-node job under the cluster's prolog, ``hpcml vet --prolog --report-to`` as root
    on each node: n1 passes, n2 fails (only n1 is n1). Its job id, once both reports are in."""
    slurm_cluster.wait_idle(20)
    proto, tokens = shared / "prolog.yaml", shared / "op-token"
    proto.write_text(PROLOG_PROTOCOL)
    tokens.write_text(OPERATOR + "\n")
    err = slurm_cluster.prolog_dir / "report.err"
    err.unlink(missing_ok=True)
    marker = slurm_cluster.prolog_dir / "enabled"
    marker.write_text(f"export HPCML_MUNGE_SOCKET={slurm_cluster.munge_socket} SLURM_CONF={slurm_env['SLURM_CONF']}\n"
                      f"{sys.executable} -m hpcml vet --prolog --budget 5 {proto} --report-to {collector.url} "
                      f"--report-token-file {tokens} --report-spool {shared}/spool >/dev/null 2>>{err}\nexit 0\n")
    job = ""
    try:
        job = subprocess.run(["sbatch", "--parsable", "-N2", "--output=/dev/null", f"--chdir={shared}",
                              "--wrap", "true"], env=slurm_env, capture_output=True, text=True,
                             timeout=60).stdout.strip()
        assert job, "sbatch failed"
        deadline = time.monotonic() + 60
        rows: list = []
        while len(rows) < 2:
            assert time.monotonic() < deadline, (rows, err.read_text() if err.exists() else "")
            time.sleep(0.5)
            with sqlite3.connect(collector.db) as conn:
                rows = conn.execute("SELECT node, verdict, evidence, sender, job FROM reports "
                                    "ORDER BY node").fetchall()
        assert rows == [("n1", "good", "node", "root", job), ("n2", "bad", "node", "root", job)], rows
    finally:
        marker.unlink(missing_ok=True)
        if job:
            wait(job, slurm_env, timeout=60)
    return job


def test_a_real_prologs_failure_reaches_the_collector_as_the_nodes_evidence_and_drains_it(
        shared, collector, slurm_cluster, slurm_env, undrain):  # noqa: F811 - the fixtures above
    """slurmd runs the cluster's prolog as root on each node of a new job: ``hpcml vet
    --prolog --report-to`` there signs its result with root's credential. n2 fails the
    protocol's check (only n1 is n1); its report is stored as node evidence and the handler
    drains n2, not n1. The prolog exits 0 here, as under ``HealthCheckProgram`` (whose exit
    code Slurm ignores), so that the drain is the handler's and not Slurm's own."""
    _prolog_round(shared, collector, slurm_cluster, slurm_env)
    (shared / "check-rules.yaml").write_text(PROLOG_RULES)
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "handle", "--db", f"sqlite:///{collector.db}",
                        "--rules", str(shared / "check-rules.yaml"), "--audit", str(shared / "audit.jsonl"),
                        "--json"], env=slurm_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert [(a["node"], a["action"], a["status"]) for a in json.loads(p.stdout)["actions"]] == [("n2", "drain", "done")]
    assert _drained("n2", slurm_env) and not _drained("n1", slurm_env)


def test_the_fault_the_prolog_found_is_drained_confirmed_by_jobs_and_avoided(
        shared, collector, slurm_cluster, slurm_env, undrain):  # noqa: F811 - the fixtures above
    """Issue 68 end to end: n2 fails the prolog's check (node evidence, root's MUNGE), the
    handler's rule drains it, and proven jobs of two users named it a hang culprit. The
    centre report counts the check's flag and the rule's drain as confirmed (precision 1 of
    1), and the plan every job reads puts n2 on the avoid list. The two jobs' summaries are
    written into the collector's store as the collector stores proven ones (their MUNGE
    proof against Slurm's records is tested in test_proof_slurm.py)."""
    _prolog_round(shared, collector, slurm_cluster, slurm_env)
    assert handle_rules(shared, collector.db, slurm_env, PROLOG_RULES) == [("n2", "drain", "done")]
    verdicts = _verdicts_after_jobs_hurt_n2(shared, collector.db, slurm_env, shared / "check-rules.yaml")
    (check,) = [c for c in verdicts["checks"] if c["check"] == "on-n1"]
    assert (check["flags"], check["confirmed"], check["refuted"], check["precision"]) == (1, 1, 0, 1.0), check
    (rule,) = verdicts["rules"]
    assert (rule["drains"], rule["confirmed"], rule["precision"]) == (1, 1, 1.0), rule
    req = urllib.request.Request(collector.url + "/v1/plan", headers={"Authorization": f"Bearer {JOB_TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        plan = json.loads(r.read())
    assert [(a["node"], a["users"], a["jobs"]) for a in plan["avoid"]] == [("n2", 2, 2)], plan["avoid"]


def _verdicts_after_jobs_hurt_n2(work: Path, db: Path, env: dict[str, str], rules: Path) -> dict:
    """Proven jobs of two users name n2 a hang culprit (written into the collector's store as
    it stores proven ones: their MUNGE proof is test_proof_slurm.py's); then ``hpcml centre
    report``'s verdicts with the handler's audit log and ``rules``."""
    from hpcml.centre.collector.store import open_store
    from tests.run.test_vet_auto import _hurt
    store = open_store(f"sqlite:///{db}")
    try:
        _hurt(store, "n2", ["alice", "bob"], time.time())
    finally:
        store.close()
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "report", "--db", f"sqlite:///{db}",
                        "--since", "30d", "--audit", str(work / "audit.jsonl"), "--rules", str(rules), "--json"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["verdicts"]


def handle_rules(work: Path, db: Path, env: dict[str, str], rules: str) -> list[tuple[str, str, str]]:
    (work / "check-rules.yaml").write_text(rules)
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "handle", "--db", f"sqlite:///{db}",
                        "--rules", str(work / "check-rules.yaml"), "--audit", str(work / "audit.jsonl"),
                        "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [(a["node"], a["action"], a["status"]) for a in json.loads(p.stdout)["actions"]]


INTERMITTENT_PROTOCOL = """\
name: prolog-scratch
evals:
  - {{name: scratch, type: mounts, paths: ['{scratch}-$SLURMD_NODENAME'], must_be_mountpoint: true}}
"""
INTERMITTENT_RULES = """\
name: checks
max_drain_fraction: 100%
rules:
  - name: scratch-failing
    match: {check: scratch, outcome: [fail]}
    count: 2
    window: 1 h
    min_precision: 90%
    reason: "hpcml: {check} failed {count}x in {window}"
    resume_after: {passes: 2}
"""


def test_an_intermittent_fault_is_drained_by_the_rules_and_its_precision_reported(
        shared, collector, slurm_cluster, slurm_env, undrain):  # noqa: F811 - the fixtures above
    """Issue 68 end to end with a fault that comes and goes: n2's scratch (a real tmpfs) is
    unmounted for the first job, back for the second, gone again for the third; each job's
    prolog (root, MUNGE) reports it. The handler does not drain on one failure, drains n2
    after the second (the rule: twice in an hour), never n1; proven jobs of two users named
    n2 a hang culprit, so the centre report counts the check's 2 flags and the rule's drain
    as confirmed, with the rule at or above its declared floor."""
    proto, tokens = shared / "scratch.yaml", shared / "op-token"
    proto.write_text(INTERMITTENT_PROTOCOL.format(scratch=shared / "scratch"))
    tokens.write_text(OPERATOR + "\n")
    (shared / "rules.yaml").write_text(INTERMITTENT_RULES)
    for n in ("n1", "n2"):
        (shared / f"scratch-{n}").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(shared / "scratch-n1")], check=True)
    marker = slurm_cluster.prolog_dir / "enabled"
    marker.write_text(f"export HPCML_MUNGE_SOCKET={slurm_cluster.munge_socket} SLURM_CONF={slurm_env['SLURM_CONF']}\n"
                      f"{sys.executable} -m hpcml vet --prolog --budget 5 {proto} --report-to {collector.url} "
                      f"--report-token-file {tokens} --report-spool {shared}/spool >/dev/null 2>>{shared}/err\n"
                      "exit 0\n")
    handle = [sys.executable, "-m", "hpcml", "centre", "handle", "--db", f"sqlite:///{collector.db}", "--rules",
              str(shared / "rules.yaml"), "--audit", str(shared / "audit.jsonl"), "--json"]
    acted = []
    try:
        for k, mounted in enumerate((False, True, False)):
            if mounted:
                subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(shared / "scratch-n2")],
                               check=True)
            elif k:
                subprocess.run(["umount", str(shared / "scratch-n2")], check=True)
            slurm_cluster.wait_idle(20)
            job = subprocess.run(["sbatch", "--parsable", "-N2", "--output=/dev/null", f"--chdir={shared}",
                                  "--wrap", "true"], env=slurm_env, capture_output=True, text=True,
                                 timeout=60).stdout.strip()
            assert job, "sbatch failed"
            deadline = time.monotonic() + 60
            while True:
                with sqlite3.connect(collector.db) as conn:
                    got = conn.execute("SELECT COUNT(*) FROM reports WHERE job = ?", (job,)).fetchone()[0]
                if got == 2:
                    break
                assert time.monotonic() < deadline, (shared / "err").read_text() if (shared / "err").exists() else ""
                time.sleep(0.5)
            wait(job, slurm_env, timeout=60)
            p = subprocess.run(handle, env=slurm_env, capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            acted.append([(a["node"], a["action"]) for a in json.loads(p.stdout)["actions"] if a["action"] == "drain"])
    finally:
        marker.unlink(missing_ok=True)
        for n in ("n1", "n2"):
            subprocess.run(["umount", str(shared / f"scratch-{n}")], capture_output=True, timeout=30)
    assert acted == [[], [], [("n2", "drain")]], acted
    assert _drained("n2", slurm_env) and not _drained("n1", slurm_env)
    verdicts = _verdicts_after_jobs_hurt_n2(shared, collector.db, slurm_env, shared / "rules.yaml")
    (check,) = [c for c in verdicts["checks"] if c["check"] == "scratch"]
    assert (check["flags"], check["confirmed"], check["precision"]) == (2, 2, 1.0), check
    (rule,) = verdicts["rules"]
    assert (rule["rule"], rule["drains"], rule["confirmed"], rule["precision"]) == ("scratch-failing", 1, 1, 1.0), rule
    assert rule["floor"] == 0.9 and not rule["below_floor"], rule
