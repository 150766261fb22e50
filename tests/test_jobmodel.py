"""run.json and the job summary, defined once (hpcml.jobmodel): the schema files are the
models', the models are closed, a newer minor is read without what it added, and what a
real ``hpcml run`` writes reads back through the same model."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from hpcml import jobmodel, schemas
from hpcml.errors import UsageError
from hpcml.jobmodel import JobSummary, RunRecord


@pytest.mark.parametrize("name", ["run", "job.summary", "observe.beat", "vet"])
def test_the_schema_files_are_generated_from_the_models(name):
    """A field added to a model without ``python -m hpcml.jobmodel --write-schemas`` fails."""
    assert schemas.load(name) == jobmodel.generated()[name]


def _closed(schema: dict) -> list[str]:
    """Every object schema that would take a key it does not declare."""
    open_ = []
    for where, node in [("", schema), *((k, v) for k, v in schema.get("$defs", {}).items())]:
        if node.get("type") == "object" and node.get("properties") and node.get("additionalProperties") is not False:
            open_.append(where or "top")
    return open_


@pytest.mark.parametrize("name", ["run", "job.summary", "vet"])
def test_every_object_in_the_schemas_is_closed(name):
    assert _closed(schemas.load(name)) == []


def test_a_real_run_json_reads_back_and_satisfies_its_schema(tmp_path):
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--dir", "job", "--no-report", "--",
                        sys.executable, "-c", "import sys; sys.exit(3)"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 3, p.stderr
    doc = json.loads((tmp_path / "job" / "run.json").read_text())
    jsonschema.validate(doc, schemas.load("run"), cls=jsonschema.Draft202012Validator)
    rec = jobmodel.read_run(tmp_path / "job" / "run.json")
    assert rec.exit_code == 3 and rec.first_failure is not None and rec.first_failure.exit_code == 3
    assert rec.to_json() == doc                          # nothing added, nothing lost on the way


def _run(**more) -> dict:
    return {"schema": "hpcml.run/1", "command": ["python", "t.py"], "mode": "local", "started": 1.0, **more}


def test_an_unknown_key_is_refused_in_one_line_naming_it(tmp_path):
    p = tmp_path / "run.json"
    p.write_text(json.dumps(_run(exit_cod=1)))
    with pytest.raises(UsageError, match=r"run.json: exit_cod: Extra inputs are not permitted"):
        jobmodel.read_run(p)
    p.write_text(json.dumps(_run(attempts=[{"command": ["x"], "mode": "local", "started": 0.0, "tiemline": []}])))
    with pytest.raises(UsageError, match=r"attempts\.0\.tiemline"):
        jobmodel.read_run(p)


def test_a_newer_minor_is_read_without_the_keys_it_added(tmp_path):
    p = tmp_path / "run.json"
    p.write_text(json.dumps(_run(schema="hpcml.run/1.3", new_key=1, hang={"began": 1.0, "detected": 2.0, "timeout": 1.0,
                                                                          "ranks": 2, "new_inner": True})))
    rec = jobmodel.read_run(p)
    assert rec.hang is not None and rec.hang.ranks == 2
    p.write_text(json.dumps(_run(schema="hpcml.run/2")))
    with pytest.raises(UsageError, match="newer hpcml"):
        jobmodel.read_run(p)


def test_a_summary_the_collector_refuses_is_refused_by_the_writer_too():
    good = {"schema": "hpcml.job.summary/1", "job_id": "1", "attempt": 0, "started": 1.0, "ended": 2.0,
            "outcome": "completed", "nodes": ["n1"]}
    assert JobSummary.model_validate(good).job_id == "1"
    for bad, field in (({"gpu": {"score": 1.5}}, "gpu.score"), ({"jobid": "1"}, "jobid"),
                       ({"stragglers": [{"node": "n9"}]}, "straggler: node 'n9' is not one of the job's nodes")):
        with pytest.raises(UsageError, match=field):
            jobmodel.validate(JobSummary, {**good, **bad}, jobmodel.SUMMARY_SCHEMA, "s.json")


def test_assignment_is_checked():
    rec = RunRecord.model_validate(_run())
    with pytest.raises(ValueError):
        rec.ntasks = 0
    rec.hang = {"began": 1.0, "detected": 2.0, "timeout": 1.0, "ranks": 2}      # the watch's dict becomes the model
    assert rec.hang.timeout == 1.0


def test_what_the_launcher_may_hold_is_written_and_read_back(tmp_path):
    """A non-UTF-8 argument (a surrogate escape, as Python gives such bytes) and an infinite
    straggler score are written as hpcml always wrote them and read back unchanged; a key
    an older hpcml wrote (``superseded``) is dropped on reading, not refused."""
    import os

    from hpcml.files import write_atomic
    rec = RunRecord.model_validate(_run(command=["/bin/echo", os.fsdecode(b"caf\xe9")]))
    rec.stragglers = [{"rank": 1, "score": float("inf"), "since_step": 3, "detected": 2.0}]
    p = tmp_path / "run.json"
    write_atomic(p, jobmodel.dumps(rec))
    back = jobmodel.read_run(p)
    assert back.command == rec.command and back.stragglers is not None and back.stragglers[0].score == float("inf")
    doc = json.loads(p.read_text())
    earlier = {"command": ["x"], "mode": "local", "started": 0.0, "superseded": True}
    p.write_text(json.dumps({**doc, "superseded": True, "attempts": [earlier]}))
    assert jobmodel.read_run(p).attempts is not None
