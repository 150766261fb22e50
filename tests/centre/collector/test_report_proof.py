"""The proof of a vetting report (``Verifier.prove_report``) with a real munged of its own:
who made the credential, over which bytes, on which host, and when.

Slurm is a stand-in here (a function answering "no such job", and one answering a node's
addresses): a one-host local cluster gives every node 127.0.0.1, so "made on another node"
can only be shown with an address Slurm would give a real node. The whole path with real
users, jobs and drains is ``test_report_proof_slurm.py``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcml.centre.collector.proof import AUTH_KEY, Forbidden, Sender, Unavailable, Verifier, credential
from hpcml.centre.collector.schema import NodeReport
from tests import needs


@pytest.fixture(scope="module")
def munged(tmp_path_factory) -> Iterator[str]:
    """munged with its own key and socket, stopped after the module."""
    binary = needs.tool("munged", "MUNGE's daemon")
    d = tmp_path_factory.mktemp("munge")
    d.chmod(0o755)
    key = d / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = d / "sock"
    subprocess.run([binary, f"--socket={sock}", f"--key-file={key}", f"--pid-file={d}/pid",
                    f"--log-file={d}/log", f"--seed-file={d}/seed", "--force"], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert time.monotonic() < deadline, (d / "log").read_text()
        time.sleep(0.05)
    try:
        yield str(sock)
    finally:
        pid = int((d / "pid").read_text())
        os.kill(pid, 15)


def _doc(node: str = "n1", at: float | None = None) -> dict:
    return {"job_id": None, "node": node, "time": at if at is not None else time.time(), "verdict": "bad",
            "results": [{"name": "xid", "outcome": "fail"}]}


def _signed(doc: dict, sock: str) -> dict:
    auth = credential(doc, sock)
    assert auth is not None
    return {**doc, AUTH_KEY: auth}


def _prove(verifier: Verifier, doc: dict, sender: Sender = Sender()):
    return verifier.prove_report(doc, [NodeReport.model_validate(doc)], sender)


def _verifier(sock: str, addrs: set[str]) -> Verifier:
    return Verifier(munge_socket=sock, slurm=lambda job: None, addresses=lambda node: frozenset(addrs))


def test_roots_report_made_on_its_node_is_the_nodes_evidence(munged):
    proof = _prove(_verifier(munged, {"127.0.0.1"}), _signed(_doc(), munged))
    assert (proof.evidence, proof.sender) == ("node", "root")


def test_roots_report_made_on_another_node_is_refused(munged):
    with pytest.raises(Forbidden, match=r"made on 127\.0\.0\.1, not on n1 \(10\.1\.2\.3\)"):
        _prove(_verifier(munged, {"10.1.2.3"}), _signed(_doc(), munged))


def test_a_report_ahead_of_the_clock_is_refused_whoever_sent_it(munged):
    ahead = _doc(at=time.time() + 3600)
    for doc, sender in ((ahead, Sender()), (ahead, Sender(trusted=True)), (_signed(ahead, munged), Sender())):
        with pytest.raises(Forbidden, match="ahead"):
            _prove(_verifier(munged, {"127.0.0.1"}), doc, sender)


def test_a_credential_over_other_bytes_is_refused(munged):
    lifted = {**_doc("n2"), AUTH_KEY: _signed(_doc("n1"), munged)[AUTH_KEY]}
    with pytest.raises(Forbidden, match="another report"):
        _prove(_verifier(munged, {"127.0.0.1"}), lifted)


def test_only_the_token_backs_it_or_a_trusted_token(munged):
    v = _verifier(munged, {"127.0.0.1"})
    assert _prove(v, _doc()).evidence == "none"
    assert _prove(v, _doc(), Sender(trusted=True)).evidence == "node"


def test_a_user_token_without_a_job_is_refused(munged):
    with pytest.raises(Forbidden, match="job_id"):
        _prove(_verifier(munged, {"127.0.0.1"}), _doc(), Sender(user="alice"))


def test_munged_unreachable_is_unavailable(munged, tmp_path):
    doc = _signed(_doc(), munged)
    with pytest.raises(Unavailable):
        _prove(Verifier(munge_socket=str(Path(tmp_path) / "no-socket"), slurm=None), doc)
