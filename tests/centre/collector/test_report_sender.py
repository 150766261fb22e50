"""Who sent a user's vetting report, as the report door stores it: one person is one sender
whichever proof they used (the node handler counts a rule's ``match.users`` by it), taken
from Slurm's record as the summary door does; and the door asks Slurm again before it
refuses, as the summary door does.

Slurm is a stand-in lookup; MUNGE's decode is a stand-in giving a credential of uid 4242,
a uid this host's passwd does not know (as on a collector host outside the cluster's
name service). The real munged and Slurm path is ``test_report_proof_slurm.py``'s.
"""

from __future__ import annotations

import time

import pytest

from hpcml.centre.collector.proof import AUTH_KEY, Forbidden, Sender, Verifier, digest
from hpcml.centre.collector.schema import NodeReport
from hpcml.cluster import munge
from hpcml.cluster.jobrecord import JobRecord

NOW = time.time()
UID = 4242


def _doc(job: str = "321", node: str = "n5", at: float = NOW - 600) -> dict:
    return {"job_id": job, "node": node, "time": at, "verdict": "bad",
            "results": [{"name": "gpu-ecc", "type": "gpu", "outcome": "fail"}]}


def _prove(verifier: Verifier, doc: dict, sender: Sender = Sender()) -> tuple[str | None, NodeReport]:
    rep = NodeReport.model_validate(doc)
    proof = verifier.prove_report(doc, [rep], sender)
    assert proof.evidence == "job"
    return proof.sender, rep


@pytest.fixture
def as_uid(monkeypatch):
    """MUNGE credentials all made by ``UID``."""
    def decode(cred, socket=None):
        return munge.Decoded(uid=UID, gid=UID, payload=cred["digest"], encoded_at=int(NOW), ttl=300, addr="10.0.0.9")
    monkeypatch.setattr(munge, "decode", decode)


def _signed(doc: dict) -> dict:
    return {**doc, AUTH_KEY: {"munge": {"digest": digest(doc)}}}


def test_one_person_is_one_sender_by_munge_or_by_token(as_uid):
    rec = JobRecord("321", "alice", UID, frozenset({"n5"}), "RUNNING", 0, NOW - 3600, None, "scontrol")
    v = Verifier(slurm=lambda job: rec, addresses=None)
    by_munge, _ = _prove(v, _signed(_doc(at=NOW - 600)))
    by_token, _ = _prove(v, _doc(at=NOW - 300), Sender(user="alice"))
    assert by_munge == by_token == f"uid:{UID}"


def test_without_slurm_checks_the_sender_is_still_one_key_per_person(as_uid):
    v = Verifier(slurm=None, addresses=None)
    assert _prove(v, _signed(_doc()))[0] == f"uid:{UID}"
    assert _prove(v, _doc(), Sender(user="no-such-user-here"))[0] == "user:no-such-user-here"


def test_the_report_door_asks_slurm_again_before_it_refuses():
    """Slurm requeued the job onto n2 since its cached answer (n1): the report of n2 is
    taken, not refused on a record ten seconds old."""
    answers = [JobRecord("500", "alice", None, frozenset({"n1"}), "RUNNING", 0, NOW - 600, None, "scontrol")]
    v = Verifier(slurm=lambda job: answers[-1], addresses=None, ttl=600)
    assert _prove(v, _doc("500", "n1", NOW - 300), Sender(user="alice"))[1].job_id == "500"
    answers.append(JobRecord("500", "alice", None, frozenset({"n2"}), "RUNNING", 1, NOW - 60, None, "scontrol"))
    assert _prove(v, _doc("500", "n2", NOW - 30), Sender(user="alice"))[1].node == "n2"
    with pytest.raises(Forbidden, match="did not run on n3"):          # asked again, still not there
        _prove(v, _doc("500", "n3", NOW - 30), Sender(user="alice"))


def test_an_array_tasks_report_is_stored_under_slurms_own_id():
    rec = JobRecord("127", "alice", None, frozenset({"n1"}), "RUNNING", 0, NOW - 600, None, "scontrol")
    v = Verifier(slurm=lambda job: rec if job in ("123_4", "127") else None, addresses=None)
    assert _prove(v, _doc("123_4", "n1", NOW - 300), Sender(user="alice"))[1].job_id == "127"
