"""Who sent a job summary is proven by the cluster: real users, real MUNGE, real Slurm.

Two real Unix users (made here with ``useradd``) run real ``hpcml run --collector`` jobs
on the local cluster; a real collector (``hpcml centre serve`` with Slurm's config) decodes
their MUNGE credentials with the cluster's own munged and checks each job with
slurmctld's records. Forged summaries are made the way an attacker with a job token
would: credentials from the ``munge`` command run as the other user, claims about jobs
that are not theirs, jobs that do not exist yet, attempts out of range, no credential at
all. None of them may be stored as verified, shadow a real summary, or drain a node;
three real hung jobs of the two users drain their culprit's node.

The users run hpcml from Debian's python3 with the checkout's sources and the test venv's
packages on PYTHONPATH (the venv's interpreter lies under root's home, which other users
cannot enter), as a cluster's users run a shared installation.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hpcml.centre.collector.proof import digest
from hpcml.ports import free_port
from tests import needs
from tests.centre.jobdocs import event, summary
from tests.centre.test_rules import JOB_RULES
from tests.slurmjobs import wait

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
ROOT = Path(__file__).parents[3]
TASK = ROOT / "tests" / "run" / "faulty_ddp.py"
OPERATOR = "operator-token-0123456789abcdef"
JOB_TOKEN = "job-token-0123456789abcdef"
USERS = ("hpcmlalice", "hpcmlbob")
USER_PY = "/usr/bin/python3"


def _user(name: str) -> None:
    if subprocess.run(["id", name], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)


@pytest.fixture(scope="module")
def users():
    needs.root("jobs of two real Unix users need useradd and runuser")
    for u in USERS:
        _user(u)
    return USERS


@pytest.fixture
def shared():
    """A directory both users can write (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="hpcml-proof-", dir="/tmp"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Collector:
    def __init__(self, root: Path, env: dict[str, str], db: str | None = None) -> None:
        """``db``: the store's URL (default: SQLite in ``root``)."""
        self.db = root / "centre.db"
        self.db_url = db or f"sqlite:///{self.db}"
        self.port = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "job-tokens").write_text(f"# every user's hpcml run\n{JOB_TOKEN}\n")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hpcml", "centre", "serve", "--db", self.db_url, "--port", str(self.port),
             "--job-token-file", str(root / "job-tokens"), "--slurm-check", "on"],
            env={**env, "HPCML_VET_TOKEN": OPERATOR}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, line + self.proc.stderr.read() if self.proc.stderr else line

    def post(self, doc, token: str = JOB_TOKEN, path: str = "/v1/jobs") -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(doc).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def rows(self) -> list[tuple]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute("SELECT job, attempt, user_name, uid, proof, verified FROM jobs "
                                "ORDER BY job, attempt").fetchall()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture
def collector(shared, slurm_env):
    c = Collector(shared, slurm_env)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def undrain(slurm_env):
    yield
    for n in ("n1", "n2"):
        subprocess.run(["scontrol", "update", f"nodename={n}", "state=resume"], env=slurm_env,
                       capture_output=True, timeout=10)


def _as(user: str, argv: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], env=env, capture_output=True, text=True,
                          timeout=60, **kw)


def _user_env(shared: Path, user: str, slurm_env: dict[str, str]) -> dict[str, str]:
    home = shared / f"home-{user}"
    home.mkdir(exist_ok=True)
    shutil.chown(home, user, user)
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    return {**slurm_env, "HOME": str(home), "USER": user, "PYTHONNOUSERSITE": "1",
            "PYTHONPATH": f"{ROOT / 'src'}:{site}", "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


def submit_hang(shared: Path, user: str, collector: Collector, slurm_env: dict[str, str], name: str) -> str:
    """A real 2-node DDP job of ``user`` whose rank 1 (on n2) hangs in its collective."""
    work = shared / name
    work.mkdir()
    script = work / "job.sh"
    script.write_text(f"""#!/bin/bash
export HPCML_COLLECTOR_TOKEN={JOB_TOKEN} FAULT=collective STEPS=40
{USER_PY} -m hpcml run --dir job --no-report --interval 0.5 --hang-timeout 2s --kill-grace 3 \\
    --collector {collector.url} -- {USER_PY} {TASK}
echo "hpcml run exit $?"
""")
    shutil.chown(work, user, user)
    shutil.chown(script, user, user)
    out = _as(user, ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--output={work}/job.out",
                     f"--chdir={work}", str(script)], _user_env(shared, user, slurm_env))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def signed(doc: dict, user: str, socket: str, env: dict[str, str]) -> dict:
    cred = subprocess.run(["runuser", "-u", user, "--", "munge", "--socket", socket], input=digest(doc), env=env,
                  capture_output=True, timeout=30)
    assert cred.returncode == 0, cred.stderr
    return {**doc, "auth": {"munge": cred.stdout.decode().strip()}}


def _handle(shared: Path, collector: Collector, env: dict[str, str], *extra: str) -> dict:
    (shared / "rules.yaml").write_text(JOB_RULES)          # hurts-jobs: 3 jobs of 2 users in 7 d
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "handle", "--db", f"sqlite:///{collector.db}",
                        "--rules", str(shared / "rules.yaml"), "--audit", str(shared / "audit.jsonl"), "--json",
                        *extra], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _drained(node: str, env: dict[str, str]) -> bool:
    out = subprocess.run(["scontrol", "show", "-o", "node", node], env=env, capture_output=True, text=True,
                         timeout=10).stdout
    return "DRAIN" in out


def test_forged_summaries_are_refused_or_count_for_nothing_and_real_hangs_drain(
        users, shared, collector, slurm_cluster, slurm_env, undrain):
    alice, bob = users
    sock = str(slurm_cluster.munge_socket)
    env_a, env_b = _user_env(shared, alice, slurm_env), _user_env(shared, bob, slurm_env)

    # before any real job: an attacker with the job token and no credential names n2 in
    # three "jobs" of three "users"; stored, unverified, and no drain comes of it
    for j, who in enumerate(("alice", "bob", "carol")):
        code, answer = collector.post(summary(f"{900 + j}", nodes=["n1", "n2"], user=who, cluster="hpcmllocal",
                                              culprits=[event("n2", 1)]))
        assert code == 201 and answer["unverified"] == 1, answer
    assert _handle(shared, collector, slurm_env, "--dry-run")["actions"] == []

    jobs = [submit_hang(shared, alice, collector, slurm_env, "a1"), submit_hang(shared, bob, collector, slurm_env, "b1")]
    for j in jobs:
        wait(j, slurm_env, timeout=180)
    for name in ("a1", "b1"):
        out = (shared / name / "job.out").read_text()
        assert "hpcml run exit 5" in out, out

    rows = {r[0]: r for r in collector.rows()}
    a_job, b_job = jobs
    assert rows[a_job][2:] == (alice, int(_uid(alice)), "munge", 1), rows
    assert rows[b_job][2:] == (bob, int(_uid(bob)), "munge", 1), rows
    real = json.loads(urllib.request.urlopen(urllib.request.Request(
        collector.url + f"/v1/jobs/{a_job}", headers={"Authorization": f"Bearer {OPERATOR}"}), timeout=10).read())
    mine = real["summaries"][0]
    assert mine["culprits"][0]["node"] == "n2" and mine["hangs"] == 1

    forged = {k: v for k, v in mine.items() if k not in ("auth", "proof")}      # proof: the collector's, not the summary's
    # bob vouches for a summary of alice's job: the job is not his
    code, answer = collector.post(signed({**forged, "attempt": 1}, bob, sock, env_b))
    assert code == 403 and "belongs to" in answer["error"], answer
    # a job Slurm has never seen (the next ids, posted ahead)
    ahead = {**forged, "job_id": str(int(b_job) + 5)}
    code, answer = collector.post(signed(ahead, alice, sock, env_a))
    assert code == 403 and "no record" in answer["error"], answer
    # an attempt out of range, requeues Slurm never made, a node the job never ran on
    for bad, words in (({"attempt": 1_000_000}, "attempt"), ({"requeues": 3, "attempt": 3}, "requeued"),
                       ({"nodes": ["n1", "n2", "n9"]}, "did not run on"),
                       ({"cluster": "", "attempt": 4}, "cluster"), ({"cluster": "other", "attempt": 4}, "cluster")):
        code, answer = collector.post(signed({**forged, **bad}, alice, sock, env_a))
        assert code in (400, 403) and words in answer["error"], (bad, answer)
    # a credential replayed, and one lifted onto another summary
    again = signed({**forged, "attempt": 2}, alice, sock, env_a)
    assert collector.post(again)[0] == 201
    assert collector.post(again) == (401, {"error": "auth.munge: Replayed credential"})   # resent with a new one
    vouched = signed({**forged, "attempt": 3}, alice, sock, env_a)["auth"]
    lifted = {**forged, "attempt": 3, "culprits": [event("n1", 0)], "auth": vouched}
    code, answer = collector.post(lifted)
    assert code == 403 and "another summary" in answer["error"], answer
    # nothing forged shadows the real summary: attempt 0 of alice's job is hers, verified
    assert rows[a_job] in collector.rows()
    assert not any(r[5] == 1 and r[2] not in (alice, bob) for r in collector.rows())

    # two users' jobs named n2 twice, plus three unverified claims: not yet three jobs
    assert _handle(shared, collector, slurm_env, "--dry-run")["actions"] == []
    third = submit_hang(shared, alice, collector, slurm_env, "a2")
    wait(third, slurm_env, timeout=180)
    plan = _handle(shared, collector, slurm_env)
    assert [(a["node"], a["action"], a["status"]) for a in plan["actions"]] == [("n2", "drain", "done")], plan
    assert plan["actions"][0]["evidence"]["users"] == 2
    assert _drained("n2", slurm_env) and not _drained("n1", slurm_env)


def _uid(user: str) -> str:
    return subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout.strip()


def test_a_user_token_proves_its_user_where_munge_is_not_used(users, shared, slurm_env, slurm_cluster):
    """A site without MUNGE gives each user a token (``user:token``): a summary sent with
    it is that user's, checked against Slurm like a credential; another user's job is refused."""
    alice, bob = users
    (shared / "job-tokens").write_text(f"{alice}:alice-token-0123456789\n{bob}:bob-token-0123456789\n")
    port = free_port("127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "hpcml", "centre", "serve", "--db", f"sqlite:///{shared}/t.db",
                             "--port", str(port), "--job-token-file", str(shared / "job-tokens")],
                            env={**slurm_env, "HPCML_VET_TOKEN": OPERATOR}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "listening on" in proc.stdout.readline()
        env_a = _user_env(shared, alice, slurm_env)
        job = _as(alice, ["sbatch", "--parsable", "--nodes=1", f"--output={shared}/t.out", "--wrap", "sleep 1"], env_a)
        assert job.returncode == 0, job.stderr
        job_id = job.stdout.strip()
        wait(job_id, slurm_env, 60)
        doc = summary(job_id, nodes=["n1"], user="someone-else", cluster="hpcmllocal", hours=0.0001)
        c = Collector.__new__(Collector)
        c.url = f"http://127.0.0.1:{port}"
        assert c.post(doc, token="bob-token-0123456789")[0] == 403
        code, answer = c.post(doc, token="alice-token-0123456789")
        assert (code, answer["unverified"]) == (201, 0), answer
        with sqlite3.connect(shared / "t.db") as conn:
            assert conn.execute("SELECT user_name, proof, verified FROM jobs").fetchall() == [(alice, "token", 1)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert os.path.exists(shared / "t.db")
