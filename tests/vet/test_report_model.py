"""The vetting report is one document, defined once (``hpcml.jobmodel.VetReport``): the
writer's dataclasses name its fields, what the writer writes satisfies the model and the
schema generated from it, and its readers (the collector, the node handler) validate with
that model, refusing a wrong field in one line."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import typing
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest

from hpcml import jobmodel, schemas
from hpcml.centre.collector.schema import Invalid, parse
from hpcml.centre.sources import JsonDirSource
from hpcml.errors import UsageError
from hpcml.jobmodel import VetNode, VetReport, VetResult, VetVerdict
from hpcml.vet import report
from hpcml.vet.model import EXIT_CODES, CheckResult, Decision, NodeReport, Outcome
from tests.vet.reports import vet_report, vet_run

ROOT = Path(__file__).resolve().parents[2]


def keys(model: type[jobmodel.BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def same_shape(a, b, where="") -> None:
    """``a == b`` with every object's keys in the same order (the bytes a reader sees)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, list(a), list(b))
        for k in a:
            same_shape(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_shape(x, y, f"{where}.{i}")
    else:
        assert a == b, (where, a, b)


def valid(doc: dict) -> VetReport:
    jsonschema.validate(doc, schemas.load("vet"), cls=jsonschema.Draft202012Validator)
    model = VetReport.model_validate(doc)
    same_shape(model.model_dump(by_alias=True), doc)       # the model keeps every key, in the writer's order
    return model


# --- one set of fields ---------------------------------------------------------------------

def test_the_dataclasses_name_the_models_fields_with_its_defaults():
    fields = dataclasses.fields(CheckResult)
    assert [f.name for f in fields] == keys(VetResult)
    for f in fields:
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is not dataclasses.MISSING:
            assert VetResult.model_fields[f.name].get_default(call_default_factory=True) == default, f.name
    result = CheckResult(node="n1", check="c", type="t", outcome=Outcome.PASS)
    assert list(result.to_dict()) == keys(VetResult)
    assert list(NodeReport(node="n1", results=[result]).to_dict()) == keys(VetNode)
    assert {f.name for f in dataclasses.fields(NodeReport)} - set(keys(VetNode)) == {"received_at", "free_port"}  # the launcher's own
    assert [o.value for o in Outcome] == list(jobmodel.VET_OUTCOMES)
    decisions = typing.get_args(VetVerdict.model_fields["decision"].annotation)
    assert [d.value for d in Decision] == list(decisions)
    assert sorted(EXIT_CODES.values()) == sorted(typing.get_args(VetVerdict.model_fields["exit_code"].annotation))


def test_to_dict_reads_back():
    r = CheckResult(node="n1", check="c", type="t", outcome=Outcome.WARN, value=3, details={"a": [1, {"b": None}]})
    rep = NodeReport(node="n1", results=[r], sent_at=5.0)
    back = NodeReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert back.to_dict() == rep.to_dict() and back.results[0].outcome is Outcome.WARN


# --- the writer ----------------------------------------------------------------------------

def _rich_run():
    """Every outcome, every kind of value, nested details, an unreachable node, notes."""
    run = vet_run({"n1": [("mem", "memory", "pass"), ("gpu", "gpu", "warn")],
                   "n2": [("mem", "memory", "fail"), ("gpu", "gpu", "error")],
                   "n3": [("mem", "memory", "skipped"), ("gpu", "gpu", "pass")], "n4": None},
                  started_at=1_790_000_000.25, job_id=None)
    values = [1.5, 7, "8.0.1", None, True, 0.0]
    for i, r in enumerate(r for rep in run.reports.values() for r in rep.results):
        r.value, r.unit, r.threshold = values[i % len(values)], "B", ">= 1"
        r.duration, r.message = 0.25 * i, f"m{i}"
        r.details = {"gpus": [{"index": 0, "ok": True, "temp": 40.5}], "source": "nvml", "none": None}
    run.reports["n1"].sent_at = 1_790_000_001.0
    run.protocol.evals[0].params = {"min_available_fraction": 0.01, "paths": ["/tmp"], "nested": {"a": 1}}
    run.protocol.evals[1].min_relative, run.protocol.evals[1].severity = 0.8, "warn"
    run.notes = ["a note"]
    return run


def test_the_writers_document_satisfies_the_model_and_the_generated_schema():
    run = _rich_run()
    written = report.dumps(report.to_json(run))
    doc = json.loads(written)
    assert list(doc) == keys(VetReport) and doc["verdict"]["decision"] == "abort"
    model = valid(doc)
    assert model.nodes["n4"].reachable is False and model.nodes["n1"].results[1].outcome == "warn"
    assert [type(r.value) for r in model.nodes["n1"].results + model.nodes["n2"].results] == \
        [float, int, str, type(None)]                       # a value keeps its JSON type
    # the model serialises the very bytes the writer wrote
    assert report.dumps(model.model_dump(by_alias=True)) == written


def test_a_real_vet_run_writes_a_valid_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    p = subprocess.run([sys.executable, "-m", "hpcml", "vet", "run", str(ROOT / "examples" / "vet" / "cpu.yaml"),
                        "--local", "--out", str(tmp_path / "o"), "--json"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)
    assert p.returncode in (0, 3, 4), p.stderr
    on_disk = json.loads((tmp_path / "o" / "report.json").read_text())
    valid(on_disk)
    assert on_disk == json.loads(p.stdout)


# --- the readers ---------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("change, field", [
    (lambda d: d["nodes"]["n1"]["results"][0].update(duration="slow"), "nodes.n1.results.0.duration"),
    (lambda d: d["nodes"]["n1"]["results"][0].update(outcome="exploded"), "nodes.n1.results.0.outcome"),
    (lambda d: d["nodes"]["n1"].update(reachable="perhaps"), "nodes.n1.reachable"),
    (lambda d: d["verdict"].update(exit_code=7), "verdict.exit_code"),
    (lambda d: d["protocol"]["checks"][0].update(scope="rack"), "protocol.checks.0.scope"),
    (lambda d: d.update(started_at="yesterday"), "started_at"),
    (lambda d: d.update(surprise=1), "surprise"),                          # closed: an unknown key is named
    (lambda d: d["nodes"]["n1"]["results"][0].update(colour="red"), "nodes.n1.results.0.colour"),
])
def test_the_collector_refuses_a_wrong_field_in_one_line(change, field):
    doc = vet_report({"n1": [("mem", "memory", "pass")], "n2": [("mem", "memory", "fail")]})
    assert [r.node for r in parse(json.dumps(doc).encode())] == ["n1", "n2"]
    change(doc)
    with pytest.raises(Invalid) as info:
        parse(json.dumps(doc).encode())
    assert _one_line(info.value).startswith(f"{field}: "), str(info.value)


def test_the_collector_reads_a_newer_minor_without_its_additions_and_a_signed_report():
    doc = vet_report({"n1": [("mem", "memory", "pass")]})
    newer = {**copy.deepcopy(doc), "schema": "hpcml.vet/1.3", "added": {"x": 1}}
    newer["nodes"]["n1"]["results"][0]["added_too"] = 2
    assert [(r.node, r.verdict) for r in parse(json.dumps(newer).encode())] == [("n1", "good")]
    signed = {**doc, "auth": {"munge": "cred"}}         # the request's credential, not the report's
    assert [r.node for r in parse(json.dumps(signed).encode())] == ["n1"]
    with pytest.raises(Invalid, match="^schema: written by a newer hpcml"):
        parse(json.dumps({**doc, "schema": "hpcml.vet/2"}).encode())


def test_the_node_handler_refuses_a_wrong_field_naming_the_file(tmp_path):
    doc = vet_report({"n1": [("mem", "memory", "fail")]}, started_at=datetime.now(timezone.utc).timestamp())
    (tmp_path / "report.json").write_text(json.dumps(doc))
    since = datetime.fromtimestamp(0, timezone.utc)
    assert [(r.node, r.check, r.outcome) for r in JsonDirSource([tmp_path]).results_since(since)] == \
        [("n1", "mem", "fail")]
    doc["nodes"]["n1"]["results"][0]["type"] = 5
    (tmp_path / "report.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError) as info:
        list(JsonDirSource([tmp_path]).results_since(since))
    assert _one_line(info.value).startswith(f"{tmp_path / 'report.json'}: nodes.n1.results.0.type: ")


def test_a_folded_row_of_a_large_table_shows_skipped_checks_as_skipped(tmp_path):
    """A real ``hpcml vet`` report whose GPU check was skipped (no NVIDIA driver here), its
    node's results given to 40 nodes (a table past ``FULL_TABLE_NODES`` folds the good
    ones): the folded row says "skipped" in the GPU column, not "pass"; nodes that differ in
    what was skipped are folded apart."""
    from rich.console import Console

    from hpcml.vet import verdict
    from hpcml.vet.engine import VetRun
    from hpcml.vet.model import NodeReport
    from hpcml.vet.protocol import load
    from hpcml.vet.report import FULL_TABLE_NODES, table
    proto = tmp_path / "p.yaml"
    proto.write_text("name: t\nevals:\n  - {name: mem, type: memory}\n  - {name: gpu, type: gpu}\n")
    p = subprocess.run([sys.executable, "-m", "hpcml", "vet", str(proto), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    (entry,) = json.loads((tmp_path / "o" / "report.json").read_text())["nodes"].values()
    assert {r["check"]: r["outcome"] for r in entry["results"]} == {"mem": "pass", "gpu": "skipped"}
    nodes = [f"n{i:02d}" for i in range(FULL_TABLE_NODES + 8)]
    reports = {}
    for i, n in enumerate(nodes):
        d = copy.deepcopy(entry)
        d["node"] = n
        for r in d["results"]:
            r["node"] = n
            if i % 2 and r["check"] == "gpu":         # half the nodes ran the GPU check and passed it
                r["outcome"] = "pass"
        reports[n] = NodeReport.from_dict(d)
    protocol = load(proto)
    run = VetRun(protocol=protocol, nodes=nodes, reports=reports, started_at=0, duration=0.1,
                 verdict=verdict.decide(nodes, reports, {e.name: e.count_errors for e in protocol.evals}))
    console = Console(width=200, record=True)
    console.print(table(run))
    rows = [line for line in console.export_text().splitlines() if "(20)" in line]
    assert len(rows) == 2, console.export_text()
    skipped = next(line for line in rows if "skipped" in line)
    assert skipped.count("pass") == 1 and "n[00," in skipped        # mem passed, gpu skipped
    assert next(line for line in rows if line != skipped).count("pass") == 2
