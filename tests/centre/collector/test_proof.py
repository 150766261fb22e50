"""The summary door's proof (``hpcml.centre.collector.proof.Verifier``) held to its twin,
the vetting report door: what a user's summary says of when its job ran lies within Slurm's
record of the job's run.

Slurm's record is a stand-in lookup returning the ``JobRecord`` sacct would give (a job that
ran 40 days ago for an hour): the real sacct and MUNGE path is in ``test_proof_slurm.py``;
this one needs a job old enough to date, which a test cluster cannot have.
"""

from __future__ import annotations

import http.client
import json
import time

import pytest

from hpcml.centre.collector.proof import Verifier
from hpcml.centre.collector.server import Tokens, start
from hpcml.centre.collector.store import open_store
from hpcml.cluster.jobrecord import JobRecord
from tests.centre.jobdocs import event, summary

NOW = time.time()
RAN = (NOW - 40 * 86400, NOW - 40 * 86400 + 3600)


def lookup(job_id: str) -> JobRecord | None:
    return JobRecord(job_id, "alice", None, frozenset({"n1", "n2"}), "COMPLETED", 0, *RAN, "sacct") \
        if job_id == "101" else None


@pytest.fixture
def collector(tmp_path):
    srv = start(open_store(f"sqlite:///{tmp_path}/c.db"), Tokens(["op-token"], jobs=["alice:tok-alice"]),
                verifier=Verifier(slurm=lookup, cluster="c1", addresses=None))
    try:
        yield srv
    finally:
        srv.close()


def post(srv, path: str, doc: dict) -> tuple[int, dict]:
    host, port = srv.server_address[:2]
    c = http.client.HTTPConnection(host, port, timeout=10)
    try:
        c.request("POST", path, json.dumps(doc).encode(), {"Authorization": "Bearer tok-alice"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def redated(started: float, **extra) -> dict:
    """Job 101's summary with no end, its start moved to ``started``: a summary without an
    end is dated by its start, so this is the job's hang, dated into today's window."""
    s = summary("101", user="alice", cluster="c1", nodes=["n1", "n2"], outcome="hung", culprits=[event("n2", 1)],
                ended=RAN[1], hours=1.0)
    s.update(started=started, ended=None, duration_s=None, node_hours=0.0, gpu_hours=0.0, gpus=0, ntasks=2,
             gpu={"score": None, "bound": None}, time_lost_s=None, gpu_hours_lost=None, **extra)
    return s


def test_a_summary_without_an_end_is_refused_when_it_starts_after_slurm_ended_the_job(collector):
    code, body = post(collector, "/v1/jobs", redated(NOW - 120))
    assert code == 403 and body["error"] == "started: after Slurm ended job 101", body
    # the twin door says the same of a report at that time
    rep = {"job_id": "101", "node": "n2", "time": NOW - 120, "verdict": "bad",
           "results": [{"name": "nccl", "type": "collective", "outcome": "fail"}]}
    assert post(collector, "/v1/reports", rep)[0] == 403
    assert collector.store._all("SELECT COUNT(*) FROM jobs") == [(0,)]


def test_a_summary_s_vetting_outside_the_job_s_run_is_refused(collector):
    inside = redated(RAN[0] + 60)
    assert post(collector, "/v1/jobs", inside)[0] == 201
    late = redated(RAN[0] + 60, attempt=1, vetting=[{"node": "n2", "attempt": 1, "time": NOW - 60, "verdict": "bad",
                                                      "failing": ["gemm"]}])
    code, body = post(collector, "/v1/jobs", late)
    assert code == 403 and body["error"].startswith("vetting: node 'n2' vetted at"), body
    early = redated(RAN[0] + 60, attempt=1, vetting=[{"node": "n2", "attempt": 1, "time": RAN[0] - 3600,
                                                       "verdict": "bad", "failing": ["gemm"]}])
    assert post(collector, "/v1/jobs", early)[0] == 403
