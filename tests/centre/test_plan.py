"""The centre's plan for the next jobs (``hpcml.centre.plan``, ``GET /v1/plan``): the fleet's
failure rate, each check's cost and recall, the avoid list. Measured on a simulated fleet
with known truth (``hpcml.testing.fleet``, written through the collector's store), and
served by a real ``hpcml centre serve`` to a job token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hpcml.centre.collector.store import open_store
from hpcml.centre.plan import SCHEMA, Plan, avoid_list, build
from hpcml.ports import free_port
from hpcml.testing.fleet import simulate

DAY = 86400.0
JOB_TOKEN = "job-token-0123456789abcdef"
WRITE_TOKEN = "write-token-0123456789abcdef"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """200 nodes, 21 days, 8 bad ones and 2 lied about; jobs keep off the avoid list."""
    root = tmp_path_factory.mktemp("fleet")
    store = open_store(f"sqlite:///{root}/centre.db")
    end = time.time() - 3600
    truth = simulate(store, nodes=200, days=21, bad_share=0.04, jobs_per_day=150, end=end, seed=3, avoid=True)
    try:
        yield store, truth, end, root
    finally:
        store.close()


def test_the_rate_is_the_jobs_a_node_hurt_per_node_day_as_the_simulation_counted_them(fleet):
    store, truth, end, _ = fleet
    plan = build(store, now=end, window=14 * DAY)
    assert plan.hurt_jobs > 0 and plan.rate_per_node_day is not None
    # a crashed rank is not evidence about its node (any user's bug crashes one): the plan
    # prices the hang culprits and stragglers the jobs named
    assert plan.rate_per_node_day == pytest.approx(truth.rate(end - 14 * DAY, ("culprits", "stragglers")), rel=0.01)
    assert plan.rate_per_node_day < truth.rate(end - 14 * DAY)
    by_name = {c.name: c for c in plan.checks}
    assert set(by_name) == {"gpu-count", "xid", "gemm", "pcie-link", "disk"}
    assert abs(by_name["gpu-count"].runs - 200 * 14 * 4) <= 800              # 4 health-check rounds a day
    # the bad nodes are those the jobs named (the slow, the intermittent, and the healthy ones
    # a false straggler named): the same for every check; GEMM, failing at 70% of a slow
    # node's vettings, flagged one before the first job it hurt
    assert all(c.bad_nodes == by_name["gemm"].bad_nodes >= 2 for c in plan.checks)
    assert by_name["gemm"].caught >= 1 and by_name["xid"].caught == 0          # a dead node hurts as lost: not priced


def test_the_avoid_list_names_bad_nodes_only_never_one_users_or_a_liar(fleet):
    """Measured against the truth, day by day over three weeks: most nodes the list named
    were really bad then (the liars' jobs run well); the ones that were not are healthy
    nodes the watch wrongly named a straggler in two users' jobs (the simulation's 0.3% of
    jobs), which the list cannot tell from a slow node: measured, not hidden."""
    store, truth, end, _ = fleet
    assert truth.avoids, "the avoid list never named a node"
    assert (truth.avoid_precision() or 0.0) >= 0.7, truth.avoid_precision()
    events = store.job_events_since(end - 30 * DAY)
    for node, when, bad in truth.avoids:
        if not bad:
            named = {e["user"] for e in events if e["node"] == node and e["role"] in ("culprit", "straggler")
                     and when - 7 * DAY <= e["time"] <= when}
            assert len(named) >= 2, (node, named)
    liars = {n for n, k in truth.kind.items() if k == "liar"}
    assert not liars & {n for n, *_ in truth.avoids}
    # one user's jobs alone never put a node on it
    events = [{"node": "n9", "job": f"j{i}", "role": "culprit", "time": end - i, "user": "uid:1000"} for i in range(5)]
    assert avoid_list(events, end) == []
    events.append({"node": "n9", "job": "j9", "role": "straggler", "time": end - 9, "user": "uid:1001"})
    # crashed ranks of many users' code on one node are no evidence about the node
    events += [{"node": "n1", "job": f"c{i}", "role": "crashed", "time": end - i, "user": f"uid:{1100 + i}"}
               for i in range(5)]
    (only,) = avoid_list(events, end)
    assert only.node == "n9" and only.users == 2 and only.jobs == 6 and only.roles == {"culprit": 5, "straggler": 1}
    # older than the window: off the list
    assert avoid_list(events, end + 8 * DAY) == []


def test_the_plan_round_trips_and_a_wrong_document_is_refused(fleet):
    store, _, end, _ = fleet
    doc = build(store, now=end).to_json()
    assert doc["schema"] == SCHEMA and list(doc)[0] == "schema"
    again = Plan.from_doc(json.loads(json.dumps(doc)), "x")
    assert again.avoid == build(store, now=end).avoid
    from hpcml.errors import UsageError
    with pytest.raises(UsageError, match="schema"):
        Plan.from_doc({**doc, "schema": "hpcml.centre.plan/2"}, "x")
    with pytest.raises(UsageError, match="hurt_jobs"):
        Plan.from_doc({**doc, "hurt_jobs": "many"}, "x")


def _get(url: str, token: str | None) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_a_job_token_reads_the_plan_and_nothing_else_from_a_real_collector(fleet, tmp_path):
    """What every job's launcher needs is the plan; the fleet's other answers (users' scores,
    nodes' histories) stay behind a read token."""
    _, _, _, root = fleet
    jobs = tmp_path / "job-tokens"
    jobs.write_text(JOB_TOKEN + "\n")
    port = free_port("127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "hpcml", "centre", "serve", "--db", f"sqlite:///{root}/centre.db",
                             "--port", str(port), "--job-token-file", str(jobs)],
                            env={**os.environ, "HPCML_VET_TOKEN": WRITE_TOKEN}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "listening on" in proc.stdout.readline()
        base = f"http://127.0.0.1:{port}"
        code, doc = _get(f"{base}/v1/plan", JOB_TOKEN)
        assert code == 200 and doc["schema"] == SCHEMA and doc["rate_per_node_day"] > 0 and len(doc["checks"]) == 5
        assert _get(f"{base}/v1/plan", None)[0] == 401
        assert _get(f"{base}/v1/plan", "not-a-token")[0] == 401
        assert _get(f"{base}/v1/fleet", JOB_TOKEN)[0] == 401
        assert _get(f"{base}/v1/nodes/nid00001/history", JOB_TOKEN)[0] == 401
        assert _get(f"{base}/v1/plan", WRITE_TOKEN)[0] == 200
        from hpcml.centre.client import fetch_plan
        plan, why = fetch_plan(base, JOB_TOKEN)
        assert why is None and plan is not None and [a.node for a in plan.avoid] == [a["node"] for a in doc["avoid"]]
        plan, why = fetch_plan(base, "wrong")
        assert plan is None and why is not None and "401" in why
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_a_collector_that_is_not_there_gives_no_plan_and_says_why():
    from hpcml.centre.client import fetch_plan
    port = free_port("127.0.0.1")
    plan, why = fetch_plan(f"http://127.0.0.1:{port}", JOB_TOKEN, timeout=2)
    assert plan is None and why is not None and f"127.0.0.1:{port}/v1/plan" in why


def test_the_plan_of_an_empty_centre_has_no_rate(tmp_path: Path):
    store = open_store(f"sqlite:///{tmp_path}/empty.db")
    try:
        plan = build(store)
    finally:
        store.close()
    assert plan.rate_per_node_day is None and plan.hurt_jobs == 0 and plan.avoid == [] and plan.checks == []


def test_unproven_reports_price_nothing_and_no_duration_counts_past_a_day(tmp_path: Path):
    """A job token's POST is stored unproven: it must not make checks look dear (or the plan
    not serialisable) for every job; a proven absurd duration counts as a day."""
    from hpcml.centre.collector.schema import CheckResult, NodeReport
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    now = time.time()
    try:
        reps = []
        for i, (evidence, duration) in enumerate((("none", 1e308), ("none", 1e308), ("node", 2.0), ("node", 1e9))):
            rep = NodeReport(node=f"n{i}", time=now - 60, protocol="p", job_id=None, verdict="good",
                             results=[CheckResult(name="gemm", type="compute", outcome="pass", duration=duration),
                                      CheckResult(name="skip", type="compute", outcome="skipped", duration=duration)])
            rep.proven(evidence, "root")
            reps.append(rep)
        store.add(reps)
        (gemm,) = build(store, now=now).checks
        assert gemm.name == "gemm" and gemm.runs == 2 and gemm.mean_s == (2.0 + 86400) / 2
        assert json.loads(json.dumps(build(store, now=now).to_json(), allow_nan=False))
    finally:
        store.close()


def test_one_users_reports_of_their_own_job_price_no_check_and_add_none(tmp_path: Path):
    """A proven user's report of their job is evidence about their nodes, not about what a
    check costs every job: 1,400 results a check of a day each, and 500 made-up checks, from
    one user leave the plan as the nodes' own reports made it."""
    from hpcml.centre.collector.schema import CheckResult, NodeReport
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    now = time.time()
    try:
        fleet = []
        for i in range(20):
            rep = NodeReport(node=f"n{i}", time=now - 3600 + i, protocol="p", job_id=None, verdict="good",
                             results=[CheckResult(name=n, type="compute", outcome="pass", duration=0.5)
                                      for n in ("gemm", "memory")])
            rep.proven("node", "root")
            fleet.append(rep)
        store.add(fleet)
        before = build(store, now=now).checks
        dear = [CheckResult(name=n, type="compute", outcome="pass", duration=86400.0)
                for n in ("gemm", "memory") for _ in range(1400)]
        made_up = [CheckResult(name=f"made-up-{k}", type="compute", outcome="pass", duration=1.0)
                   for k in range(500) for _ in range(30)]
        mine = [NodeReport(node="n9", time=now - 60, protocol="p", job_id="900", verdict="good", results=part)
                for part in (dear, made_up[:7500], made_up[7500:])]
        for rep in mine:
            rep.proven("job", "uid:4242")
        store.add(mine)
        after = build(store, now=now).checks
        assert [(c.name, c.runs, c.mean_s) for c in before] == [("gemm", 20, 0.5), ("memory", 20, 0.5)]
        assert after == before
    finally:
        store.close()


def test_where_no_node_measured_a_check_three_people_s_own_jobs_price_it_at_their_median(tmp_path: Path):
    """A site whose vetting runs in users' jobs only (``hpcml run --vet``): a check three
    people ran is priced at the median of each person's mean (2 s), however many results or
    how dear one of them says it was (a day, 1,400 times); a check only one or two people ran
    is not priced (its default stands), and a node's own report wins where there is one."""
    from hpcml.centre.collector.schema import CheckResult, NodeReport
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    now = time.time()
    try:
        reps = []
        for k, (who, secs, n) in enumerate((("uid:1", 1.0, 3), ("uid:2", 2.0, 3), ("uid:3", 86400.0, 1400),
                                             ("uid:3", 3.0, 1))):
            rep = NodeReport(node=f"n{k}", time=now - 600, protocol="p", job_id=str(100 + k), verdict="good",
                             results=[CheckResult(name="gemm", type="compute", outcome="pass", duration=secs)] * n
                             + [CheckResult(name="dcgm", type="gpu", outcome="pass", duration=secs)] * (k < 2))
            rep.proven("job", who)
            reps.append(rep)
        node = NodeReport(node="n9", time=now - 60, protocol="p", job_id=None, verdict="good",
                          results=[CheckResult(name="memory", type="compute", outcome="pass", duration=0.5)])
        node.proven("node", "root")
        mine = NodeReport(node="n8", time=now - 60, protocol="p", job_id="200", verdict="good",
                          results=[CheckResult(name="memory", type="compute", outcome="pass", duration=9.0)] * 3)
        mine.proven("job", "uid:1")
        store.add([*reps, node, mine])
        got = {(c.name, c.type): (c.runs, c.mean_s) for c in build(store, now=now).checks}
        assert got == {("gemm", "compute"): (1407, 2.0), ("memory", "compute"): (1, 0.5)}, got
    finally:
        store.close()


def test_the_collector_serves_its_last_good_plan_when_a_rebuild_fails(tmp_path: Path, monkeypatch):
    from hpcml.centre import plan as plan_mod
    from hpcml.centre.collector.server import App, Tokens
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    try:
        app = App(store, Tokens([WRITE_TOKEN]))
        first = app._plan()
        assert first["schema"] == SCHEMA
        monkeypatch.setattr(plan_mod, "TTL", 0.0)

        def broken(*_a, **_k):
            raise RuntimeError("database down")
        monkeypatch.setattr(plan_mod, "build", broken)
        assert app._plan() is first                       # the last good plan, not a 500
        fresh = App(store, Tokens([WRITE_TOKEN]))
        with pytest.raises(RuntimeError):                 # no plan ever built: the error is the answer
            fresh._plan()
    finally:
        store.close()


def test_a_broken_answer_is_one_line_and_never_a_traceback():
    """A server that is not HTTP, one that sends a torn body, one that never finishes."""
    import socket
    import threading

    from hpcml.centre.client import fetch_plan
    answers = [b"garbage\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"schema\"",
               b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + b" " * 10]
    for answer in answers:
        srv = socket.create_server(("127.0.0.1", 0))
        port = srv.getsockname()[1]

        def serve(srv=srv, answer=answer) -> None:
            conn, _ = srv.accept()
            conn.recv(65536)
            conn.sendall(answer)
            if answer.endswith(b" "):
                time.sleep(3)                         # holds the connection past the deadline
            conn.close()
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        plan, why = fetch_plan(f"http://127.0.0.1:{port}", JOB_TOKEN, timeout=1)
        assert plan is None and why and "\n" not in why and f"127.0.0.1:{port}/v1/plan" in why, why
        t.join(10)
        srv.close()


def test_one_users_word_on_a_bad_node_moves_no_check_s_recall(tmp_path: Path):
    """Node n1 hurt a job. Its own report says gemm failed there; one user's report of their
    job says memory passed (a lie or not, theirs alone), and says gemm passed; two users
    say dcgm failed. Recall counts gemm (the node's word) and dcgm (two people), caught both
    times, and not memory (was: memory ran and missed on one user's say-so)."""
    from hpcml.centre.collector.schema import CheckResult, NodeReport
    from hpcml.centre.plan import NODE_ROLES, recall
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    now = time.time()
    try:
        def rep(sender: str, evidence: str, *results: tuple[str, str]) -> NodeReport:
            r = NodeReport(node="n1", time=now - 3600, protocol="p", job_id=None if evidence == "node" else "7",
                           verdict="good", results=[CheckResult(name=n, type="compute", outcome=o, duration=1.0)
                                                    for n, o in results])
            r.proven(evidence, sender)
            return r
        store.add([rep("root", "node", ("gemm", "fail")), rep("uid:1", "job", ("memory", "pass"), ("gemm", "pass")),
                   rep("uid:1", "job", ("dcgm", "fail")), rep("uid:2", "job", ("dcgm", "fail"))])
        events = [{"node": "n1", "role": sorted(NODE_ROLES)[0], "time": now - 100, "job": "9", "user": "uid:5"}]
        assert recall(store, events, now - 30 * DAY) == {"gemm": {"ran": 1, "caught": 1}, "dcgm": {"ran": 1, "caught": 1}}
    finally:
        store.close()
