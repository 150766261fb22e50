"""One JSON convention: every document hpcml writes leads with ``"schema": "hpcml.<...>/<major>"``.

The documents are made by the real code paths (pack, vet, scan, observe record, score),
validated against the JSON Schema files in ``hpcml/schemas``; readers refuse a newer major
in one line (exit 2) and still read what older hpcml versions left on disk.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest

from hpcml import schemas
from hpcml.data import ResumeStateError, ShardDataset
from hpcml.data.manifest import load_manifest
from hpcml.errors import UsageError
from hpcml.observe.report import Limits
from hpcml.observe.report import build as observe_report
from hpcml.observe.store import read_job
from hpcml.score.archive import write_store
from hpcml.testing.synthetic_job import make_job
from tests.data.gen import make_shards
from tests.score import synth

ROOT = Path(__file__).resolve().parents[1]
MAIN = ["data.manifest", "data.state", "observe.job", "observe.report", "scan", "score.report", "vet"]


def hpcml(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python -m hpcml ARGS`` as a user runs it, outside any Slurm job."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=e, timeout=300)


def valid(doc: dict, name: str) -> dict:
    """``doc`` leads with its tag and satisfies its schema file."""
    assert next(iter(doc)) == "schema", list(doc)[:3]
    jsonschema.validate(doc, schemas.load(name), cls=jsonschema.Draft202012Validator)
    return doc


def one_line_refusal(p: subprocess.CompletedProcess, path: Path, found: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "key 'schema'" in lines[0], p.stderr
    assert f"written by a newer hpcml (schema {found})" in lines[0]


# --- the module -----------------------------------------------------------------------------

def test_every_schema_file_is_a_valid_draft_2020_12_schema():
    assert set(MAIN) <= set(schemas.names())
    for name in schemas.names():
        s = schemas.load(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert "schema" in s["required"] and s["properties"]["schema"]["pattern"].startswith("^hpcml\\.")
    assert schemas.load("hpcml.data.manifest/1") == schemas.load("data.manifest")


def test_tag_and_check():
    assert schemas.tag("data.manifest", 1) == "hpcml.data.manifest/1"
    assert schemas.parse("hpcml.vet/1.2") == ("hpcml.vet", 1)
    expected = "hpcml.data.manifest/1"
    schemas.check({"schema": expected}, expected, "m.json")
    schemas.check({"schema": "hpcml.data.manifest/1.7"}, expected, "m.json")      # a newer minor adds keys
    schemas.check({}, expected, "m.json", untagged=True)
    schemas.check({"schema": "old/1"}, expected, "m.json", also=("old/1",))
    for doc, why in [({"schema": "hpcml.data.manifest/2"}, "written by a newer hpcml (schema hpcml.data.manifest/2); "
                                                           "this hpcml reads hpcml.data.manifest/1"),
                     ({"schema": "hpcml.data.manifest/0"}, "written by an older hpcml"),
                     ({"schema": "hpcml.data.state/1"}, "not an hpcml.data.manifest document"),
                     ({"schema": 3}, "not an hpcml.data.manifest document"),
                     ({}, "no schema tag"), ([], "expected a JSON object")]:
        with pytest.raises(UsageError, match="^m.json") as info:
            schemas.check(doc, expected, "m.json")
        assert why in str(info.value) and "\n" not in str(info.value) and info.value.exit_code == 2


# --- data -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("schemas"), samples=40, target=100_000)[1]


def test_manifest_and_resume_state(shards):
    doc = valid(json.loads((shards / "manifest.json").read_text()), "data.manifest")
    assert doc["schema"] == "hpcml.data.manifest/1" and doc["samples"] == 40
    assert load_manifest(shards).dataset == doc["dataset"]
    ds = ShardDataset(shards, rank=0, world_size=1)
    next(iter(ds))
    state = valid(json.loads(json.dumps(ds.state_dict())), "data.state")
    assert state["schema"] == "hpcml.data.state/1"


def _rewrite(src: Path, dst: Path, change) -> Path:
    import shutil
    shutil.copytree(src, dst)
    doc = json.loads((dst / "manifest.json").read_text())
    (dst / "manifest.json").write_text(json.dumps(change(doc)))
    return dst


def test_manifest_of_a_newer_hpcml_is_refused_in_one_line(shards, tmp_path):
    newer = _rewrite(shards, tmp_path / "newer", lambda d: {**d, "schema": "hpcml.data.manifest/2"})
    with pytest.raises(UsageError) as info:
        load_manifest(newer)
    assert info.value.exit_code == 2 and info.value.key == "schema"
    assert str(info.value).startswith(f"{newer / 'manifest.json'}: key 'schema': written by a newer hpcml")
    one_line_refusal(hpcml("data", "stage", newer, "--to", tmp_path / "local", cwd=tmp_path),
                     newer / "manifest.json", "hpcml.data.manifest/2")
    assert not (tmp_path / "local").exists()


def _legacy(doc: dict, version: int = 1) -> dict:
    return {"format": "hpcml-shards", "version": version, **{k: v for k, v in doc.items() if k != "schema"}}


def test_manifest_packed_before_tags_is_still_read(shards, tmp_path):
    old = _rewrite(shards, tmp_path / "old", _legacy)
    assert "schema" not in json.loads((old / "manifest.json").read_text())
    assert load_manifest(old).samples == 40
    assert len(list(ShardDataset(old, rank=0, world_size=1))) == 40
    v2 = _rewrite(shards, tmp_path / "v2", lambda d: _legacy(d, 2))
    with pytest.raises(UsageError, match="newer hpcml"):
        load_manifest(v2)


def test_resume_state_before_tags_is_read_and_a_newer_one_refused(shards):
    ds = ShardDataset(shards, rank=0, world_size=1)
    it = iter(ds)
    head = [next(it)["__key__"] for _ in range(5)]
    state = {k: v for k, v in ds.state_dict().items() if k != "schema"}
    again = ShardDataset(shards, rank=0, world_size=1)
    again.load_state_dict({"format": "hpcml-shard-state/1", **state})
    assert head + [s["__key__"] for s in again] == [s["__key__"] for s in ShardDataset(shards, rank=0, world_size=1)]
    with pytest.raises(ResumeStateError, match="newer hpcml") as info:
        again.load_state_dict({"schema": "hpcml.data.state/2", **state})
    assert isinstance(info.value, UsageError) and info.value.key == "schema"
    with pytest.raises(ResumeStateError, match="no schema tag"):
        again.load_state_dict(state)


# --- vet and scan ---------------------------------------------------------------------------

def test_vet_report(tmp_path):
    p = hpcml("vet", "run", "--out", tmp_path / "o", "--json", cwd=tmp_path)
    assert p.returncode in (0, 3, 4), p.stderr               # this machine may be judged either way
    on_disk = valid(json.loads((tmp_path / "o" / "report.json").read_text()), "vet")
    assert on_disk["schema"] == "hpcml.vet/1" and on_disk == valid(json.loads(p.stdout), "vet")


def test_vet_report_readers_refuse_a_newer_one(tmp_path):
    from hpcml.centre.collector.schema import Invalid, parse
    from hpcml.centre.sources import JsonDirSource
    (tmp_path / "report.json").write_text(json.dumps({"schema": "hpcml.vet/2", "started_at": 0, "nodes": {}}))
    with pytest.raises(UsageError, match=r"report.json: key 'schema': written by a newer hpcml"):
        list(JsonDirSource([tmp_path]).results_since(datetime.now(timezone.utc)))
    with pytest.raises(Invalid, match="^schema: written by a newer hpcml"):
        parse((tmp_path / "report.json").read_bytes())


def test_scan_report(tmp_path):
    (tmp_path / "safe.pkl").write_bytes(pickle.dumps({"a": [1, 2.0, "x"]}))
    (tmp_path / "evil.pkl").write_bytes(b"cos\nsystem\n(S'true'\ntR.")          # never loaded, only scanned
    p = hpcml("scan", "--json", tmp_path)
    assert p.returncode == 6, p.stderr
    doc = valid(json.loads(p.stdout), "scan")
    assert doc["schema"] == "hpcml.scan/1" and doc["summary"]["dangerous"] == 1
    assert any(f["findings"] for f in doc["files"])


# --- observe and score ----------------------------------------------------------------------

TRAIN = """
import time
from hpcml import observe
for i in range(15):
    with observe.section("step"):
        time.sleep(0.01)
    observe.log(step=i, samples_per_s=100.0 + i)
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("observe")
    (tmp / "train.py").write_text(TRAIN)
    p = hpcml("observe", "record", "--dir", tmp / "job", "--interval", "0.1", "--no-gpu", "--",
              sys.executable, tmp / "train.py", env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert p.returncode == 0, p.stderr
    return tmp / "job"


def test_observe_job_metadata_and_report(recorded, tmp_path):
    job = valid(json.loads((recorded / "job.json").read_text()), "observe.job")
    assert job["schema"] == "hpcml.observe.job/1" and job["ntasks"] == 1 and "end" in job
    assert json.loads((recorded / "rank-00000.json").read_text())["schema"] == "hpcml.observe.rank/1"
    p = hpcml("observe", "report", recorded, "--json", "--html", tmp_path / "r.html")
    assert p.returncode == 0, p.stderr
    rep = valid(json.loads(p.stdout), "observe.report")
    assert rep["schema"] == "hpcml.observe.report/1" and rep["throughput"]["name"] == "samples_per_s"


def test_observe_report_with_stragglers_and_stalls(tmp_path):
    job_dir = make_job(tmp_path / "obs", 16, 200, slow_ranks={3: 1.5}, stalls=[(100, 5.0)], hiccups={(5, 50): 8.0},
                       missing=[9], truncated=[2])
    valid(json.loads((job_dir / "job.json").read_text()), "observe.job")
    rep = valid(json.loads(json.dumps(observe_report(read_job(job_dir), limits=Limits(min_straggler_s=10)).to_dict())),
                "observe.report")                       # 22 s of synthetic steps: judged as a long job
    assert rep["stragglers"] and rep["stalls"] and rep["missing_ranks"] == [9] and rep["damaged_ranks"]


def _untag(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc.pop("schema")
    path.write_text(json.dumps(doc))


def test_job_dir_recorded_before_tags_is_read_and_a_newer_one_refused(recorded, tmp_path):
    import shutil
    old = tmp_path / "old"
    shutil.copytree(recorded, old)
    for f in old.glob("*.json"):
        _untag(f)
    job = read_job(old)
    assert job.meta["ntasks"] == 1 and job.meta["ranks"]["0"]["exit_code"] == 0
    assert observe_report(job).ranks_with_data == 1
    (old / "job.json").write_text(json.dumps({"schema": "hpcml.observe.job/2", "job_id": "x", "ntasks": 1}))
    one_line_refusal(hpcml("observe", "report", old, "--json"), old / "job.json", "hpcml.observe.job/2")
    one_line_refusal(hpcml("score", "report", old, "--json", "--no-html"), old / "job.json", "hpcml.observe.job/2")


def test_score_report_of_an_imported_recording(tmp_path):
    write_store(synth.recording(), tmp_path / "job")
    valid(json.loads((tmp_path / "job" / "job.json").read_text()), "observe.job")
    p = hpcml("score", "report", tmp_path / "job", "--json", "--no-html")
    assert p.returncode == 0, p.stderr
    rep = valid(json.loads(p.stdout), "score.report")
    assert rep["schema"] == "hpcml.score.report/1" and "version" not in rep and rep["gpus"] == 8


# --- the other --json outputs lead with their tag -------------------------------------------

def test_json_outputs_of_data_env_and_hang(shards, tmp_path):
    from tests.observe.test_hang import _dump, _entry
    (tmp_path / "edf.toml").write_text('image = "docker.io/library/python:3.12"\n')
    (tmp_path / "fr").mkdir()
    for rank in range(2):
        _dump(tmp_path / "fr" / f"r{rank}", [_entry(s) for s in range(3 + rank)], world=2)
    cases = [(("data", "doctor", shards, "--json"), "hpcml.data.doctor/1"),
             (("data", "stage", shards, "--to", tmp_path / "local", "--json"), "hpcml.data.stage/1"),
             (("data", "bench", shards, "--order", "shuffled", "--json"), "hpcml.data.bench/1"),
             (("env", "show", "./edf.toml", "--json"), "hpcml.env.edf/1"),
             (("env", "render", "-r", "podman", "./edf.toml", "--json", "--", "sh"), "hpcml.env.launch/1"),
             (("observe", "hang", "--json", tmp_path / "fr"), "hpcml.observe.hang/1")]
    for args, want in cases:
        p = hpcml(*args, cwd=tmp_path, env={"EDF_PATH": str(tmp_path)})
        assert p.returncode == 0, (args, p.stderr)
        doc = json.loads(p.stdout)
        assert next(iter(doc)) == "schema" and doc["schema"] == want, args


def test_every_tag_in_the_code_is_made_by_schemas_tag():
    """One way to write a schema tag (``hpcml.schemas.tag``): a literal ``"hpcml.x/1"`` in
    code drifts from its JSON schema's name unseen. Docstrings and help texts may quote them."""
    import re
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "src" / "hpcml"
    literal = re.compile(r'"hpcml\.[a-z_.]+/[0-9]+"')
    found = [f"{p.relative_to(src)}:{n}: {line.strip()}"
             for p in src.rglob("*.py") if "schemas" not in p.relative_to(src).parts
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if literal.search(line) and not line.lstrip().startswith("#") and "help=" not in line]
    assert not found, "\n".join(found)
