"""Slurm's own record of a job, read from the local cluster's slurmctld and from its job
completion log (``sacct -c``: the cluster has no accounting database), and MUNGE
credentials made and decoded through libmunge against the cluster's own munged."""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

from hpcml.cluster import jobrecord, munge
from tests.slurmjobs import wait

pytestmark = pytest.mark.slurm


def test_a_finished_job_reads_the_same_from_slurmctld_and_the_completion_log(slurm_env, tmp_path, monkeypatch):
    for k, v in slurm_env.items():
        monkeypatch.setenv(k, v)
    out = subprocess.run(["sbatch", "--parsable", "--nodes=2", f"--output={tmp_path}/o", "--wrap", "true"],
                         env=slurm_env, capture_output=True, text=True, timeout=30, check=True)
    job = out.stdout.strip()
    wait(job, slurm_env, 60)
    live = jobrecord.lookup(job, via=("scontrol",))
    logged = jobrecord.lookup(job, via=("sacct",))
    me = pwd.getpwuid(os.getuid())
    for rec, source in ((live, "scontrol"), (logged, "jobcomp")):
        assert rec is not None and rec.source == source
        assert (rec.job_id, rec.user, rec.uid, rec.nodes, rec.restarts) == \
            (job, me.pw_name, me.pw_uid, frozenset({"n1", "n2"}), 0), rec
        assert rec.state == "COMPLETED" and rec.start is not None and rec.end is not None
    assert abs(live.end - logged.end) <= 1
    assert jobrecord.lookup(str(int(job) + 1000)) is None            # never submitted
    assert jobrecord.lookup("1;rm -rf /") is None and jobrecord.lookup("") is None


def test_a_credential_proves_its_maker_once(slurm_cluster):
    sock = str(slurm_cluster.munge_socket)
    cred = munge.encode(b"\x01" * 32, sock)
    dec = munge.decode(cred, sock)
    assert (dec.uid, dec.gid, dec.payload) == (os.getuid(), os.getgid(), b"\x01" * 32) and dec.ttl > 0
    with pytest.raises(munge.MungeError) as again:
        munge.decode(cred, sock)
    assert again.value.replayed and not again.value.transient
    with pytest.raises(munge.MungeError) as bad:
        munge.decode(cred[:20] + ("A" if cred[20] != "A" else "B") + cred[21:], sock)
    assert not bad.value.replayed and not bad.value.transient
    with pytest.raises(munge.MungeError) as down:
        munge.decode(munge.encode(b"x", sock), "/nonexistent/munge.socket")
    assert down.value.transient
    for junk in ("", "MUNGE:" + "A" * 5000, "not a credential", "MUNGE:\u00e9"):
        with pytest.raises(munge.MungeError):
            munge.decode(junk, sock)
