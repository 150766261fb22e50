"""``hpcml centre report``: job summaries and vetting results joined, on SQLite and on
PostgreSQL; terminal, ``--json`` (checked against its schema) and the HTML page in Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import jsonschema
import pytest

from hpcml import schemas
from hpcml.centre.collector.schema import NodeReport
from hpcml.centre.collector.store import open_store
from hpcml.centre.report import build, lines, render_html
from tests.centre.jobdocs import event, proven, summary
from tests.observe.browser import render

DAY = 86400.0
HOSTILE = "<img src=x onerror=alert(1)>"


def vet(node: str, t: float, bad: bool, evidence: str = "node") -> NodeReport:
    """A node's vetting report, proven as ``evidence`` (the collector's ``proof``: node,
    root's on the node; none, a token's say-so)."""
    rep = NodeReport.model_validate({
        "job_id": "v", "node": node, "time": t, "protocol": "gpu", "verdict": "bad" if bad else "good",
        "results": [{"name": "gemm", "type": "compute", "outcome": "fail" if bad else "pass"},
                    {"name": "ecc", "type": "gpu", "outcome": "pass"}]})
    rep.proven(evidence, "root" if evidence == "node" else None)
    return rep


@pytest.fixture
def centre(db_url):
    """Five jobs this week, one 40 days ago; nid007 slows or hangs three of them yet passes
    vetting, nid003 is excluded by vetting twice, job 12 was requeued (two attempts)."""
    now = time.time()
    docs = [
        summary("10", ended=now - 1 * DAY, score=0.2, stragglers=[event("nid007", 3)]),
        summary("11", ended=now - 2 * DAY, score=0.9, culprits=[event("nid007", 1)],
                excluded=[event("nid003", detail="gemm")], outcome="hung", time_lost_s=1800),
        summary("12", 0, ended=now - 3 * DAY, score=0.6, stragglers=[event("nid007", 2)], outcome="requeued"),
        summary("12", 1, ended=now - 3 * DAY + 600, score=0.6, stragglers=[event("nid007", 2, attempt=0)],
                excluded=[event("nid003", detail="gemm")], hours=2.0),
        summary("13", ended=now - 4 * DAY, user=HOSTILE, account="b2", score=0.8, hours=3.0),
        summary("14", ended=now - 40 * DAY, stragglers=[event("nid009", 0)], culprits=[event("nid009", 0)]),
    ]
    store = open_store(db_url)
    store.add_jobs([proven(d) for d in docs])
    store.add([vet("nid007", now - d * DAY, False) for d in (1, 2, 3, 4)]
              + [vet("nid003", now - d * DAY, True) for d in (2, 3)]
              # a token's say-so: stored, counted nowhere (nid007 would show 3 bad vettings)
              + [vet("nid007", now - d * DAY, True, evidence="none") for d in (1, 2, 3)])
    try:
        yield store
    finally:
        store.close()


def test_nodes_that_hurt_jobs_come_first_beside_their_vetting(centre):
    rep = build(centre, 30 * DAY)
    jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
    first, second = rep["nodes"][:2]
    # job 12's two attempts name nid007 twice: one job
    assert (first["node"], first["jobs"], first["straggler"], first["culprit"]) == ("nid007", 3, 2, 1)
    assert first["vet"]["reports"] == 4 and first["vet"]["bad"] == 0
    assert (second["node"], second["jobs"], second["excluded"]) == ("nid003", 2, 2)
    assert second["vet"]["bad"] == 2 and second["vet"]["failing_checks"] == [{"check": "gemm", "count": 2}]
    assert "nid009" not in {n["node"] for n in rep["nodes"]}           # 40 days ago
    assert build(centre, 60 * DAY)["nodes"][0]["node"] in ("nid007", "nid009")


def test_totals_count_each_job_once_at_its_latest_attempt(centre):
    t = build(centre, 30 * DAY)["totals"]
    # 4 GPUs a node; job 10: 3 nodes x 1 h, 11: 4 nodes x 1 h, 12 (attempt 1): 4 nodes x 2 h, 13: 2 nodes x 3 h
    assert t["jobs"] == 4 and t["hung"] == 1
    assert t["gpu_hours"] == pytest.approx(4 * (3 + 4 + 8 + 6))
    assert t["gpu_hours_lost"] == pytest.approx(0.5 * 16) and t["time_lost_s"] == pytest.approx(1800)
    # a requeued job whose attempt 1 arrives before its attempt 0 still counts at attempt 1
    now = time.time()
    centre.add_jobs([proven(summary("15", 1, ended=now - DAY, hours=5.0))])
    centre.add_jobs([proven(summary("15", 0, ended=now - DAY - 3600, outcome="requeued"))])
    t = build(centre, 30 * DAY)["totals"]
    assert t["jobs"] == 5 and t["gpu_hours"] == pytest.approx(4 * (3 + 4 + 8 + 6) + 8 * 5)


def test_a_fault_whose_loss_nobody_measured_is_not_counted_as_0(db_url):
    """A failed job whose loss no recovery priced (``time_lost_s`` null) beside a completed
    one: faults cost "not measured", not "0.0 GPU-hours"; once a hung job's loss is measured
    the total is that, "at least", and still names the failed job it could not count."""
    now = time.time()
    store = open_store(db_url)
    try:
        store.add_jobs([proven(summary("20", ended=now - DAY)),
                        proven(summary("21", ended=now - DAY, outcome="failed", account="b2"))])
        rep = build(store, 30 * DAY)
        t = rep["totals"]
        assert (t["gpu_hours_lost"], t["time_lost_s"], t["lost_unmeasured"]) == (None, None, 1)
        owners = {o["account"]: o for o in rep["owners"]}   # alice in b2: the failed job's loss unknown, not 0
        assert owners["b2"]["gpu_hours_lost"] is None and owners["a1"]["gpu_hours_lost"] == 0.0, owners
        text = "\n".join(lines(rep))
        assert "faults cost not measured (1 failed, hung or restarted job" in text and "faults cost 0.0" not in text
        b2 = next(a for a in rep["accounts"] if a["account"] == "b2")
        assert b2["gpu_hours_lost"] is None and "b2: not measured" in text
        store.add_jobs([proven(summary("22", ended=now - DAY, outcome="hung", time_lost_s=1800))])
        rep = build(store, 30 * DAY)
        t = rep["totals"]
        assert t["time_lost_s"] == pytest.approx(1800) and t["lost_unmeasured"] == 1 and t["gpu_hours_lost"] > 0
        assert (f"faults cost at least {t['gpu_hours_lost']:.1f} GPU-hours (0.5 h of job time), not measured for 1 "
                "failed, hung or restarted job") in "\n".join(lines(rep))
        page = render_html(rep)
        assert f"at least {t['gpu_hours_lost']:.1f}" in page and "not measured" in page     # b2's cell
    finally:
        store.close()


def test_a_restarted_job_whose_loss_nobody_measured_is_not_counted_as_0(db_url):
    """A job that restarted after a fault and completed, resumed at a step nobody read (no
    checkpoint step, no --step-pattern): its loss is unknown, so faults cost "not measured",
    not "0.0 GPU-hours", and its account is listed (was: 0.0, and no account line)."""
    now = time.time()
    doc = summary("60", ended=now - DAY, outcome="completed", account="c1")
    doc["attempts"] = 2                        # hpcml run restarted it once (two attempts in one run)
    store = open_store(db_url)
    try:
        store.add_jobs([proven(doc)])
        rep = build(store, 30 * DAY)
        t = rep["totals"]
        assert (t["gpu_hours_lost"], t["time_lost_s"], t["lost_unmeasured"]) == (None, None, 1)
        text = "\n".join(lines(rep))
        assert "faults cost not measured (1 failed, hung or restarted job" in text and "faults cost 0.0" not in text
        assert "c1: not measured" in text, text
    finally:
        store.close()


def test_gpu_hours_of_jobs_whose_gpus_nobody_counted_are_not_0(db_url, tmp_path):
    """Jobs that vetting aborted (no rank ran: no GPU count) beside a counted one: the total
    is "≥" the counted GPU-hours and names the jobs it could not count; with only uncounted
    jobs it is "not counted", never "0.0 GPU-hours"; the page and ``--json`` agree."""
    now = time.time()
    store = open_store(db_url)
    try:
        store.add_jobs([proven(summary("30", ended=now - DAY, counted=False, outcome="aborted", account="b2"))])
        rep = build(store, 30 * DAY)
        assert rep["totals"]["gpu_hours"] is None and rep["totals"]["gpus_uncounted"] == 1
        text = "\n".join(lines(rep))
        assert lines(rep)[1].startswith("  not counted GPU-hours (1 job whose GPUs nobody counted"), text
        store.add_jobs([proven(summary("31", ended=now - DAY, hours=2.0, gpus_per_node=4, account="b2",
                                       outcome="failed"))])
        rep = build(store, 30 * DAY)
        t = rep["totals"]
        assert t["gpu_hours"] == pytest.approx(16.0) and t["gpus_uncounted"] == 1
        text = "\n".join(lines(rep))
        assert lines(rep)[1].startswith("  ≥ 16.0 GPU-hours (1 job whose GPUs nobody counted"), text
        assert "of ≥ 16.0 GPU-h over 2 jobs" in text, text
        page = render_html(rep)
        assert "≥ 16.0 GPU-hours" in page and "≥ 16.0</td>" in page
        out = subprocess.run([sys.executable, "-m", "hpcml", "centre", "report", "--db", db_url, "--since", "30d",
                              "--json"], capture_output=True, text=True, timeout=120)
        doc = json.loads(out.stdout)
        jsonschema.validate(doc, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
        assert doc["totals"]["gpu_hours"] == pytest.approx(16.0) and doc["totals"]["gpus_uncounted"] == 1
    finally:
        store.close()


def test_lowest_scores_per_owner(centre):
    owners = build(centre, 30 * DAY, per_owner=2)["owners"]
    alice = next(o for o in owners if o["user"] == "alice")
    assert alice["jobs"] == 3 and [j["job"] for j in alice["lowest"]] == ["10", "12"]
    assert alice["lowest"][0]["score"] == pytest.approx(0.2) and alice["lowest"][0]["bound"] == "memory"
    assert alice["mean_score"] == pytest.approx((0.2 + 0.9 + 0.6) / 3)
    # alice leaves 12*0.8 + 16*0.1 + 32*0.4 = 24 GPU-h idle, the hostile user 24*0.2 = 4.8: alice first
    assert owners[0]["user"] == "alice" and owners[1]["user"] == HOSTILE


def test_the_command_terminal_json_and_html(centre, db_url, tmp_path):
    base = [sys.executable, "-m", "hpcml", "centre", "report", "--db", db_url, "--since", "30d"]
    text = subprocess.run(base + ["--html", str(tmp_path / "centre.html")], capture_output=True, text=True,
                          timeout=120)
    assert text.returncode == 0, text.stderr
    assert "nid007: 3 jobs (straggler 2, culprit 1)" in text.stdout and "vetting never caught it" in text.stdout
    doc = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=120).stdout)
    jsonschema.validate(doc, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
    page = (tmp_path / "centre.html").read_text()
    assert "<script" not in page and "http" not in page.split("</title>", 1)[1]   # offline, nothing to fetch
    pixels, dom = render(tmp_path / "centre.html", tmp_path)
    assert "nid007" in dom and "vetting never caught it" in dom and "32.0 GPU-hours" not in dom
    assert HOSTILE not in dom and "&lt;img src=x" in dom                  # shown, never run
    assert pixels.std() > 10                                               # something was drawn


@pytest.mark.parametrize("args, key", [(["--since", "soon"], "--since"), (["--top", "0"], "--top")])
def test_bad_options_are_one_line_exit_2(tmp_path, args, key):
    p = subprocess.run([sys.executable, "-m", "hpcml", "centre", "report", "--db",
                        f"sqlite:///{tmp_path}/c.db", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and key in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_an_empty_store_says_so_and_a_missing_one_is_bad_input(tmp_path):
    cmd = [sys.executable, "-m", "hpcml", "centre", "report", "--db", f"sqlite:///{tmp_path}/c.db"]
    missing = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "c.db: no such database file" in missing.stderr, missing.stderr
    assert not (tmp_path / "c.db").exists()                   # a mistyped path creates nothing
    open_store(f"sqlite:///{tmp_path}/c.db").close()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "0 jobs" in p.stdout and "no job named a node" in p.stdout


def test_jobs_users_and_nodes_rank_by_the_time_their_allocations_did_not_train(db_url):
    """Ledgers of four jobs: the centre names who lost the most GPU-hours and to what; a job
    without GPUs ranks by node-hours; a node named as a hang's culprit carries its job's time."""
    now = time.time()
    docs = [
        summary("20", ended=now - DAY, user="alice", hours=10.0, ettr=0.9, why="startup"),     # 2 nodes: 8 GPU-h
        summary("21", ended=now - DAY, user="bob", hours=10.0, ettr=0.5, why="idle",            # 40 GPU-h
                culprits=[event("nid050", 1)]),
        summary("22", ended=now - DAY, user="bob", hours=2.0, ettr=0.0, why="detection"),       # 16 GPU-h
        summary("23", ended=now - DAY, user="carol", hours=100.0, ettr=0.5, why="vetting", score=None),   # no GPUs
    ]
    store = open_store(db_url)
    try:
        store.add_jobs([proven(d) for d in docs])
        rep = build(store, 30 * DAY)
        jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
        nt = rep["not_training"]
        assert [(j["job"], j["why"]) for j in nt["jobs"]] == [("21", "idle"), ("22", "detection"), ("20", "startup"),
                                                              ("23", "vetting")]
        assert nt["jobs"][0]["gpu_hours_not_training"] == pytest.approx(0.5 * 10 * 12)   # 3 nodes x 4 GPUs
        assert nt["jobs"][-1]["gpu_hours_not_training"] is None and nt["jobs"][-1]["node_hours_not_training"] == 100
        bob = nt["users"][0]
        assert (bob["user"], bob["jobs"], bob["why"]) == ("bob", 2, "idle")
        assert bob["gpu_hours_not_training"] == pytest.approx(60 + 16)
        assert [(n["node"], n["roles"]) for n in nt["nodes"]] == [("nid050", {"culprit": 1})]
        text = "\n".join(lines(rep))
        assert "job 21 (bob): 60.00 GPU-h, most of it idle" in text
        assert "user carol: 100.00 node-h over 1 job, most of it vetting" in text
        assert "node nid050: 60.00 GPU-h in jobs that named it culprit 1x" in text
    finally:
        store.close()


def test_time_not_training_that_a_ledger_could_only_bound_is_shown_at_least(db_url):
    """A job whose ledger counted steps done again that nobody measured as training (ETTR
    "at most"): its time that did not train is a lower bound, "≥", for the job, its user
    and the node it named (was: shown as exact); --json says ``lower_bound``."""
    now = time.time()
    doc = summary("80", ended=now - DAY, user="gina", hours=2.0, ettr=0.75, why="redone", outcome="hung",
                  culprits=[event("nid080", 1)])
    doc["ettr_bound"] = "at most"
    store = open_store(db_url)
    try:
        store.add_jobs([proven(doc), proven(summary("81", ended=now - DAY, user="hal", hours=2.0, ettr=0.5,
                                                    why="idle"))])
        rep = build(store, 30 * DAY)
        jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
        nt = rep["not_training"]
        jobs = {j["job"]: j for j in nt["jobs"]}
        assert (jobs["80"]["lower_bound"], jobs["81"]["lower_bound"]) == (1, 0)
        text = "\n".join(lines(rep))
        gpu_h = jobs["80"]["gpu_hours_not_training"]
        assert f"job 80 (gina): ≥ {gpu_h:,.2f} GPU-h" in text and f"user gina: ≥ {gpu_h:,.2f} GPU-h" in text, text
        assert f"node nid080: ≥ {gpu_h:,.2f} GPU-h" in text and "job 81 (hal): 8.00 GPU-h" in text, text
    finally:
        store.close()


def test_a_node_named_only_by_jobs_without_a_ledger_has_no_time_that_did_not_train_not_0(db_url):
    """Node nid070 was a hang's culprit in a job that recorded no step (no ledger: nothing
    measured what its allocation trained) and in one with a ledger: only the measured job
    counts (was: "node nid070: 0.00 node-h" from the job without, and its role counted)."""
    now = time.time()
    store = open_store(db_url)
    try:
        store.add_jobs([proven(summary("70", ended=now - DAY, outcome="hung", culprits=[event("nid070", 1)])),
                        proven(summary("71", ended=now - DAY, outcome="hung", culprits=[event("nid071", 1)]))])
        nt = build(store, 30 * DAY)["not_training"]
        assert [n["node"] for n in nt["nodes"]] == [], nt["nodes"]
        store.add_jobs([proven(summary("72", ended=now - DAY, hours=2.0, ettr=0.5, why="idle",
                                       culprits=[event("nid070", 1)]))])
        rep = build(store, 30 * DAY)
        (node,) = rep["not_training"]["nodes"]
        assert node["node"] == "nid070" and node["roles"] == {"culprit": 1}, node
        assert node["node_hours_not_training"] == pytest.approx(3 * 2.0 * 0.5)
        assert "node nid071" not in "\n".join(lines(rep))
    finally:
        store.close()


def test_time_not_training_of_a_user_with_jobs_whose_gpus_nobody_counted_is_not_a_partial_gpu_sum(db_url):
    """dave's two ledgers: one counted (40 GPU-h not training), one whose GPUs nobody counted
    (10 node-h): his GPU-hours are not shown as the whole (was: "40.00 GPU-h", and 0 in
    ``--json`` for erin, whose only job went uncounted), but in node-hours, known for both;
    ``--json`` keeps the counted sum beside how many jobs it leaves out."""
    now = time.time()
    docs = [summary("24", ended=now - DAY, user="dave", hours=10.0, ettr=0.5, why="idle"),
            summary("25", ended=now - DAY, user="dave", hours=5.0, ettr=0.0, why="vetting", counted=False,
                    outcome="aborted"),
            summary("26", ended=now - DAY, user="erin", hours=1.0, ettr=0.0, why="vetting", counted=False,
                    outcome="aborted")]
    store = open_store(db_url)
    try:
        store.add_jobs([proven(d) for d in docs])
        rep = build(store, 30 * DAY)
        jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
        users = {u["user"]: u for u in rep["not_training"]["users"]}
        dave, erin = users["dave"], users["erin"]
        assert dave["gpu_hours_not_training"] == pytest.approx(40.0) and dave["gpus_uncounted"] == 1
        assert dave["gpu_hours"] == pytest.approx(80.0) and dave["node_hours_not_training"] == pytest.approx(20.0)
        assert erin["gpu_hours_not_training"] is None and erin["gpu_hours"] is None and erin["gpus_uncounted"] == 1
        text = "\n".join(lines(rep))
        assert "user dave: 20.00 node-h over 2 jobs" in text and "user erin: 2.00 node-h over 1 job" in text, text
    finally:
        store.close()


def test_lost_gpu_hours_of_a_job_whose_gpus_nobody_counted_are_not_0(db_url):
    """A hang whose restart priced its loss (0.5 h of job time) but whose GPUs nobody counted:
    its lost GPU-hours are "not counted", never "0.0"; beside a counted loss (8.0 GPU-h), the
    total is "at least" it and names the job it could not count; the account's cell is "≥"."""
    now = time.time()
    store = open_store(db_url)
    try:
        store.add_jobs([proven(summary("40", ended=now - DAY, outcome="hung", time_lost_s=1800, counted=False,
                                       account="b3"))])
        rep = build(store, 30 * DAY)
        t = rep["totals"]
        assert t["gpu_hours_lost"] is None and t["time_lost_s"] == pytest.approx(1800) and t["lost_gpus_uncounted"] == 1
        text = "\n".join(lines(rep))
        assert ("faults cost GPU-hours not counted (0.5 h of job time, 1 job whose GPUs nobody counted)" in text
                and "faults cost 0.0" not in text), text
        store.add_jobs([proven(summary("41", ended=now - DAY, outcome="hung", time_lost_s=3600, account="b3"))])
        rep = build(store, 30 * DAY)
        t = rep["totals"]
        assert t["gpu_hours_lost"] == pytest.approx(8.0) and t["lost_gpus_uncounted"] == 1
        text = "\n".join(lines(rep))
        assert ("faults cost at least 8.0 GPU-hours (1.5 h of job time), GPUs not counted for 1 job" in text), text
        (b3,) = [a for a in rep["accounts"] if a["account"] == "b3"]
        assert b3["gpu_hours_lost"] == pytest.approx(8.0) and b3["lost_gpus_uncounted"] == 1
        assert "≥ 8.0</td>" in render_html(rep)
    finally:
        store.close()


def test_each_node_says_whom_it_hurt_what_it_cost_where_it_stands_and_what_to_do(db_url):
    """Issue 69: nid020 hung the jobs of two users (both stopped: their whole allocations
    count: 3 nodes x 4 GPUs x 2 h each), the prolog drained it once and it is drained by hpcml now;
    nid021 slowed one user's job; nid022 only had ranks crash in two users' code (exit 126, a
    sys.exit): the code's, never ranked as a node's fault."""
    from hpcml.centre.collector.schema import NodeReport
    now = time.time()
    docs = [summary("30", ended=now - DAY, user="alice", hours=2.0, outcome="hung", culprits=[event("nid020", 0)]),
            summary("31", ended=now - 2 * DAY, user="bob", hours=2.0, outcome="hung", culprits=[event("nid020", 1)]),
            summary("32", ended=now - DAY, user="carol", stragglers=[event("nid021", 0)]),
            summary("33", ended=now - DAY, user="alice", outcome="failed", crashed=[event("nid022", 0, detail="exit 126")]),
            summary("34", ended=now - DAY, user="bob", outcome="failed", crashed=[event("nid022", 1, detail="exit 3")])]
    store = open_store(db_url)
    try:
        store.add_jobs([proven(d) for d in docs])
        drained = NodeReport.model_validate({
            "job_id": None, "node": "nid020", "time": now - 3 * DAY, "protocol": "prolog", "verdict": "bad",
            "results": [{"name": "scratch", "type": "mounts", "outcome": "fail"},
                        {"name": "hpcml-drain", "type": "drain", "outcome": "fail", "message": "hpcml: scratch"}]})
        drained.proven("node", "root")
        store.add([drained])
        rep = build(store, 30 * DAY, states={"nid020": ("IDLE+DRAIN", "hpcml: scratch: not a mount point"),
                                             "nid021": ("MIXED", "")})
    finally:
        store.close()
    jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
    by = {n["node"]: n for n in rep["nodes"]}
    assert "nid022" not in by and list(by) == ["nid020", "nid021"]
    a = by["nid020"]
    assert (a["users"], a["stopped"], a["gpu_hours_lost"], a["prolog_drains"]) == (2, 2, 48.0, 1)
    assert a["job_ids"] == ["30", "31"] and a["next"].startswith("wait: hpcml drained it")
    assert by["nid021"]["next"].startswith("watch: one user's jobs named it")
    assert by["nid021"]["gpu_hours_lost"] is None          # a straggler's slowdown is unknown, not 0
    text = "\n".join(lines(rep))
    assert "2 users; jobs 30, 31; lost 48.0 GPU-h, 2 jobs stopped" in text and "the prolog drained it 1x" in text
    assert "Slurm: IDLE+DRAIN (hpcml: scratch: not a mount point)" in text
    assert rep["totals"]["stopped_by_node"] == 2 and "2 jobs a node fault stopped without a recovery: 48.0 GPU-h" in text
    # without Slurm's states (the collector's GET /v1/fleet): said, and the jobs decide
    store = open_store(db_url)
    try:
        bare = {n["node"]: n for n in build(store, 30 * DAY)["nodes"]}
    finally:
        store.close()
    assert bare["nid020"]["slurm"] is None and bare["nid020"]["next"].startswith("drain and test: proven jobs of 2")


def _prolog_report(node: str, t: float, drained: bool, check: str = "scratch") -> NodeReport:
    """What ``hpcml vet --prolog --drain --report-to`` sends as root about its node: the
    failed check and its drain (fail) or the drain that failed (error)."""
    rep = NodeReport.model_validate({
        "job_id": None, "node": node, "time": t, "protocol": "prolog", "verdict": "bad",
        "results": [{"name": check, "type": "mounts", "outcome": "fail"},
                    {"name": "hpcml-drain", "type": "drain", "outcome": "fail" if drained else "error",
                     "message": f"hpcml: {check}" if drained else "drain failed: scontrol: no slurm.conf"}]})
    rep.proven("node", "root")
    return rep


def test_the_prolog_s_drains_and_failed_drains_are_reported_for_nodes_no_job_named(db_url, tmp_path):
    """Issue 69: nid040 was drained by its prolog before any job met it; nid041's health
    check found it bad twice and could not drain it (Slurm still schedules it): both are in
    the report, terminal, JSON and HTML, with what to do; no job names either."""
    now = time.time()
    store = open_store(db_url)
    try:
        store.add([_prolog_report("nid040", now - DAY, True), _prolog_report("nid041", now - 2 * DAY, False, "memory"),
                   _prolog_report("nid041", now - DAY / 2, False, "memory")])
        rep = build(store, 30 * DAY, states={"nid040": ("IDLE+DRAIN", "hpcml: scratch: not a mount point"),
                                             "nid041": ("IDLE", "")})
    finally:
        store.close()
    jsonschema.validate(rep, schemas.load("vet.fleet"), cls=jsonschema.Draft202012Validator)
    assert rep["nodes"] == []                                   # no job named them
    by = {d["node"]: d for d in rep["prolog_drains"]}
    assert [d["node"] for d in rep["prolog_drains"]] == ["nid041", "nid040"]   # newest first
    assert (by["nid040"]["drains"], by["nid040"]["failed_drains"], by["nid040"]["checks"]) == (1, 0, ["scratch"])
    assert (by["nid041"]["drains"], by["nid041"]["failed_drains"], by["nid041"]["checks"]) == (0, 2, ["memory"])
    assert by["nid040"]["next"].startswith("wait: hpcml drained it")
    assert by["nid041"]["next"].startswith("drain it by hand: the prolog found it bad and could not drain it")
    text = "\n".join(lines(rep))
    assert "nid041: 0 drains, 2 failed drains (bad, left schedulable)" in text and "(memory); Slurm: IDLE" in text
    from hpcml.centre.report import render_html
    html = tmp_path / "centre.html"
    html.write_text(render_html(rep))
    _, dom = render(html, tmp_path)
    assert "Drained by the prolog or health check" in dom and "nid041" in dom and "could not drain it" in dom


def test_a_crashed_rank_is_not_a_node_s_lost_time(db_url):
    """Issue 69: time that did not train is put on a node for a hang or a lost node, never
    for a rank its own code crashed (exit 126, sys.exit)."""
    now = time.time()
    store = open_store(db_url)
    try:
        store.add_jobs([proven(summary("60", ended=now - DAY, user="alice", outcome="failed",
                                       crashed=[event("nid060", 0, detail="exit 126")])),
                        proven(summary("61", ended=now - DAY, user="bob", hours=2.0, outcome="hung",
                                       culprits=[event("nid061", 0)], ettr=0.6, why="detection"))])
        rep = build(store, 30 * DAY)
    finally:
        store.close()
    assert [n["node"] for n in rep["not_training"]["nodes"]] == ["nid061"]
    assert "nid060" not in json.dumps(rep["not_training"]["nodes"])
