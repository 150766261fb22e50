"""A node the health check drained comes back with no person (issue 69).

A local cluster of its own, configured as a site would: hpcml's script (as ``hpcml vet
prolog-script`` prints it) as ``Prolog=`` and as ``HealthCheckProgram=`` (every 2 s, ``HealthCheckNodeState=ANY``: drained nodes too), with
``--drain --report-to`` a real collector (``hpcml centre serve``, proving root's MUNGE
credential with this cluster's munged). Each node has a scratch filesystem the protocol
requires (a real tmpfs mount per node); the fault is n2's unmounted: the health check drains
n2 with hpcml's reason and reports it; the fault is fixed (mounted again); the health check,
which Slurm runs on the drained node, reports n2 passing; ``hpcml centre handle --db``
resumes it. A person's drain of n1 is never touched. The collector's store is a real
PostgreSQL. A drain that fails (a prolog on n1 without a slurm.conf it can read) is exit 3,
reaches the collector, and ``hpcml centre report`` lists it beside n2's drain, with what to
do about each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcml.testing.localslurm import LocalSlurm
from tests.centre.collector.test_proof_slurm import OPERATOR, Collector
from tests.slurmjobs import own_cluster

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]
HEALTH = "HealthCheckInterval=2\nHealthCheckNodeState=ANY\n"
PROTOCOL = ("name: site-prolog\nevals:\n"
            "  - {{name: scratch, type: mounts, paths: ['{scratch}-$SLURMD_NODENAME'], must_be_mountpoint: true}}\n")


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[LocalSlurm]:
    """Its own root and ports: the health check runs on every node every 2 s."""
    prolog = Path(os.environ.get("HPCML_SLURM_ROOT", "/tmp/hpcml-slurm") + "-health") / "prolog"   # own_cluster's
    with own_cluster("health", 80, extra_conf=f"HealthCheckProgram={prolog}/prolog.sh\n{HEALTH}") as c:
        assert c.prolog_dir == prolog, c.prolog_dir
        yield c


def _state(node: str, env) -> tuple[str, str]:
    out = subprocess.run(["scontrol", "show", "-o", "node", node], env=env, capture_output=True, text=True,
                         timeout=10).stdout
    fields = dict(t.partition("=")[::2] for t in out.split() if "=" in t)
    reason = out.split("Reason=", 1)[1].split(" [")[0] if "Reason=" in out else ""
    return fields.get("State", ""), reason


def _wait(what, timeout: float = 60, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting: {what.__doc__}; " + (
            log.read_text()[-3000:] if log is not None and log.exists() else "no health check ran")
        time.sleep(0.5)


def _rows(url: str, sql: str, args: tuple = ()) -> list[tuple]:
    from hpcml.centre.collector.store import open_store
    store = open_store(url)
    try:
        return store._all(sql, args)
    finally:
        store.close()


def test_a_node_the_health_check_drained_is_resumed_once_it_passes_again(cluster, tmp_path):
    from tests.centre.pgcluster import PgCluster
    env = {**cluster.client_env(), "PYTHONPATH": str(ROOT / "src"), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    shared = Path(tempfile.mkdtemp(prefix="hpcml-health-", dir="/tmp"))
    shared.chmod(0o755)
    pg = PgCluster().start()
    db = pg.create_db("centre")
    collector = Collector(shared, env, db=db)
    (shared / "p.yaml").write_text(PROTOCOL.format(scratch=shared / "scratch"))
    (shared / "token").write_text(OPERATOR + "\n")
    marker = cluster.prolog_dir / "enabled"
    try:
        for n in ("n1", "n2"):
            (shared / f"scratch-{n}").mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(shared / f"scratch-{n}")], check=True)
        # the script a site installs, as prolog-script prints it (the health check gets no
        # SLURM_CONF from Slurm: the script exports the one it was told)
        script = subprocess.run([sys.executable, "-m", "hpcml", "vet", "prolog-script", f"{shared}/p.yaml",
                                 "--budget", "5 s", "--report-to", collector.url, "--report-token-file",
                                 f"{shared}/token", "--report-spool", f"{shared}/spool", "--log", f"{shared}/health.log",
                                 "--slurm-conf", str(cluster.conf)], env=env, capture_output=True, text=True, timeout=60)
        assert script.returncode == 0 and f"export SLURM_CONF={cluster.conf}" in script.stdout, script.stderr
        marker.write_text(f"unset SLURM_CONF\nexport HPCML_MUNGE_SOCKET={cluster.munge_socket} PYTHONPATH={ROOT / 'src'}\n"
                          + script.stdout)
        subprocess.run(["scontrol", "update", "nodename=n1", "state=drain", "reason=admin: new DIMMs"], env=env,
                       check=True, timeout=10)
        subprocess.run(["umount", str(shared / "scratch-n2")], check=True)      # the fault

        def drained():
            """n2 drained by the health check with hpcml's reason"""
            state, reason = _state("n2", env)
            return "DRAIN" in state and reason.startswith("hpcml: scratch") and reason
        assert "not a mount point" in _wait(drained, log=shared / "health.log")

        def reported():
            """n2's drain in the collector, as its own evidence"""
            return _rows(db, "SELECT r.time FROM results r JOIN reports p ON p.id = r.report_id WHERE "
                             "r.node = 'n2' AND r.type = 'drain' AND p.evidence = 'node'")
        _wait(reported, log=shared / "health.log")
        handle = [sys.executable, "-m", "hpcml", "centre", "handle", "--db", db,
                  "--audit", str(shared / "audit.jsonl"), "--json"]
        p = subprocess.run(handle, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        acts = {a["node"]: a for a in json.loads(p.stdout)["actions"]}
        assert acts["n2"]["action"] == "hold" and acts["n2"]["rule"] == "prolog", acts

        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(shared / "scratch-n2")], check=True)

        def passed_twice():
            """two passing health checks of n2 after its last drain"""
            last = _rows(db, "SELECT MAX(time) FROM results WHERE node = 'n2' AND type = 'drain'")[0][0]
            return _rows(db, "SELECT COUNT(*) FROM results r JOIN reports p ON p.id = r.report_id WHERE "
                             "r.node = 'n2' AND r.name = 'scratch' AND r.outcome = 'pass' AND r.time > ? "
                             "AND p.evidence = 'node'", (last,))[0][0] >= 2
        _wait(passed_twice, log=shared / "health.log")
        acts: dict = {}

        def resumed():
            """the handler resuming n2 (it runs again as a timer would, while passes come in)"""
            p = subprocess.run(handle, env=env, capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            acts.update({a["node"]: a for a in json.loads(p.stdout)["actions"]})
            return acts["n2"]["action"] == "resume"
        _wait(resumed, log=shared / "health.log")
        assert acts["n2"]["status"] == "done", acts
        assert "DRAIN" not in _state("n2", env)[0]
        assert _state("n1", env) == (_state("n1", env)[0], "admin: new DIMMs") and "DRAIN" in _state("n1", env)[0]
        audit = [json.loads(line) for line in (shared / "audit.jsonl").read_text().splitlines()]
        (resumed,) = [e for e in audit if e["action"] == "resume"]
        assert resumed["node"] == "n2" and resumed["evidence"]["drained_by"] == "prolog"

        # the person's work on n1 is done; a prolog on n1 finds a check failing and cannot
        # drain it (no slurm.conf it can read): exit 3, a line, and the failed drain at the
        # collector, as root's own report about its node
        subprocess.run(["scontrol", "update", "nodename=n1", "state=resume"], env=env, check=True, timeout=10)
        (shared / "p3.yaml").write_text("name: site-prolog\nevals:\n"
                                        "  - {name: need-x, type: env, expected: {HPCML_PROLOG_X: '1'}}\n")
        failing = {**env, "SLURMD_NODENAME": "n1", "SLURM_CONF": str(shared / "no-slurm.conf"),
                   "HPCML_MUNGE_SOCKET": str(cluster.munge_socket)}
        p = subprocess.run([sys.executable, "-m", "hpcml", "vet", "--prolog", "--drain", "--budget", "5 s",
                            f"{shared}/p3.yaml", "--report-to", collector.url, "--report-token-file", f"{shared}/token",
                            "--report-spool", f"{shared}/spool3"], env=failing, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 3 and "n1 is bad and was not drained" in p.stderr, (p.returncode, p.stderr)
        rep = subprocess.run([sys.executable, "-m", "hpcml", "centre", "report", "--db", db, "--since", "1d",
                              "--audit", str(shared / "audit.jsonl"), "--json"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert rep.returncode == 0, rep.stderr
        drains = {d["node"]: d for d in json.loads(rep.stdout)["prolog_drains"]}
        assert drains["n2"]["drains"] >= 1 and drains["n2"]["checks"] == ["scratch"], drains
        assert drains["n2"]["next"].startswith("watch: back in service"), drains["n2"]
        assert drains["n1"]["failed_drains"] == 1 and drains["n1"]["checks"] == ["need-x"], drains
        assert drains["n1"]["next"].startswith("drain it by hand"), drains["n1"]
    finally:
        marker.unlink(missing_ok=True)
        collector.stop()
        pg.stop()
        for n in ("n1", "n2"):
            subprocess.run(["scontrol", "update", f"nodename={n}", "state=resume"], env=env, capture_output=True,
                           timeout=10)
        for n in ("n1", "n2"):
            subprocess.run(["umount", str(shared / f"scratch-{n}")], capture_output=True, timeout=30)
        shutil.rmtree(shared, ignore_errors=True)
