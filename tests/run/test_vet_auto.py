"""``hpcml run --vet auto`` and the centre's avoid list, local tasks (no Slurm; the Slurm run
is tests/run/test_avoid_slurm.py): the model and its numbers in run.json and the report,
the centre's plan read from a real collector, its defaults named when there is none."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpcml.centre.collector.store import open_store
from hpcml.centre.summaries import Proven, Received
from hpcml.cluster.allocation import this_node
from tests.run.test_summary import TOKEN, Collector
from tests.run.test_watch import hpcml, valid


def _hurt(store, node: str, users: list[str], end: float) -> None:
    """Proven jobs of ``users`` that named ``node`` a hang culprit, a day apart."""
    out = []
    for i, user in enumerate(users):
        t = end - (i + 1) * 86400
        s = Received.model_validate({
            "job_id": str(100 + i), "attempt": 1, "user": user, "account": "a", "started": t, "ended": t + 3600,
            "duration_s": 3600, "exit_code": 5, "outcome": "hung", "nodes": [node, "other"], "gpus": 0,
            "node_hours": 2.0, "gpu_hours": 0.0, "culprits": [{"node": node, "detail": "hang culprit"}]})
        s.proven(Proven(how="munge", user=user, uid=2000 + i, verified=True))
        out.append(s)
    store.add_jobs(out)


def test_vet_auto_without_a_centre_uses_named_defaults_and_reports_its_model(tmp_path):
    p = hpcml("run", "--vet", "auto", "--ntasks", "1", "--dir", "job", "--", "python", "-c", "print('ran')",
              cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    run = valid(json.loads((tmp_path / "job" / "run.json").read_text()))
    auto = run["vet"]["auto"]
    assert auto["nodes"] == 1 and auto["protocol"] == "cpu-node-vetting"
    assert "Llama 3" in auto["rate_source"] and "no collector" in auto["rate_source"]
    assert auto["chosen"] in {t["name"] for t in auto["tiers"]}
    assert "vet auto:" in p.stdout and "default (assumed, not measured)" in p.stdout
    rep = json.loads(hpcml("report", "job", "--json", cwd=tmp_path).stdout)
    assert rep["vet"]["auto"]["chosen"] == auto["chosen"]


def test_vet_auto_reads_the_centres_plan_and_keeps_an_avoided_node_it_cannot_spare(tmp_path):
    """This host is on the avoid list (jobs of two proven users named it); a local job has no
    other node, so it keeps it and says so; the plan's rate rests on too few jobs to use."""
    c = Collector(tmp_path)
    store = open_store(f"sqlite:///{c.db}")
    try:
        _hurt(store, this_node(), ["alice", "bob"], time.time())
    finally:
        store.close()
    c.start()
    try:
        p = hpcml("run", "--vet", "auto", "--collector", c.url, "--ntasks", "1", "--dir", "job", "--",
                  "python", "-c", "print('ran')", cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN})
    finally:
        c.stop()
    assert p.returncode == 0, p.stderr
    run = valid(json.loads((tmp_path / "job" / "run.json").read_text()))
    # the plan was read; two jobs' 0.2 node-days are too few to measure a rate on: the default
    assert "(the collector held 0.2 node-days of jobs)" in run["vet"]["auto"]["rate_source"]
    assert run["vet"]["avoided"] == [] and run["nodes"] == [this_node()]
    assert f"kept {this_node()} though the centre's avoid list names them" in p.stderr


def test_a_collector_that_is_down_leaves_the_job_running_on_defaults(tmp_path):
    c = Collector(tmp_path)                       # never started
    p = hpcml("run", "--vet", "auto", "--collector", c.url, "--ntasks", "1", "--dir", "job", "--",
              "python", "-c", "print('ran')", cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN})
    assert p.returncode == 0, p.stderr
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert "no plan:" in run["vet"]["auto"]["rate_source"] and "/v1/plan" in run["vet"]["auto"]["rate_source"]
    assert "the centre's plan:" in p.stderr


def test_vet_auto_with_a_protocol_that_is_not_there_is_one_line_exit_2(tmp_path: Path):
    p = hpcml("run", "--vet", "auto:missing.yaml", "--ntasks", "1", "--", "true", cwd=tmp_path)
    assert p.returncode == 2 and "missing.yaml" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
