"""The rank's Flight Recorder dump holds NCCL's entries: torch keeps them in the NCCL
backend's own recorder, not the generic one (recorded on an H100, torch 2.11, in
tests/fixtures/gpu: ``fr/`` from benchmarks/gpu_check.py's ``fr`` part; ``run/train_fr.json``
says the generic dump of a DDP job under ``hpcml run`` held 0 entries, NCCL's 2,000).

The dumps are the real recorder's bytes; no GPU here, so ``_dump`` is driven with a stand-in
for ``torch._C._distributed_c10d`` that returns those recorded bytes (said here as the
module docstring asks of a mock)."""

from __future__ import annotations

import json
import pickle
import sys
import types
from pathlib import Path

import hpcml.run.inject.sitecustomize as site
from hpcml.observe.hang import analyse, load_dump

GPU = Path(__file__).parents[1] / "fixtures" / "gpu"
NCCL = (GPU / "fr" / "nccl_trace.pickle").read_bytes()
GENERIC = (GPU / "fr" / "fr_trace.pickle").read_bytes()


def _groups_of(doc: dict) -> set[str]:
    return {e["process_group"][0] for e in doc["entries"]}


def test_the_recording_shows_the_split_that_the_merge_is_for():
    run = json.loads((GPU / "run" / "train_fr.json").read_text())
    assert run["_dump_fr_trace"] == 0 and run["_dump_nccl_trace"] > 0
    assert _groups_of(pickle.loads(NCCL)) == {"0", "1", "2"} and _groups_of(pickle.loads(GENERIC)) == {"3"}


def test_merged_dump_holds_every_recorder_entry_in_time_order_and_reads_as_one(tmp_path):
    merged = site.merge_dumps([NCCL, GENERIC])
    (tmp_path / "rank-00000").write_bytes(merged)
    doc = load_dump(tmp_path / "rank-00000")             # the watch's own reader (restricted unpickler)
    n_nccl, n_generic = len(pickle.loads(NCCL)["entries"]), len(pickle.loads(GENERIC)["entries"])
    assert len(doc["entries"]) == n_nccl + n_generic == 94
    assert _groups_of(doc) == {"0", "1", "2", "3"}
    times = [e["time_created_ns"] for e in doc["entries"]]
    assert times == sorted(times)
    assert doc["pg_config"]["1"]["desc"] == "gpu_check_a"    # NCCL's real names kept
    assert doc["comm_lib_version"] == "2.28.9"
    report = analyse(tmp_path)
    assert not report.findings and report.dumps                # a finished job: nothing hung


def test_one_recorder_with_entries_is_written_as_it_came():
    assert pickle.loads(site.merge_dumps([NCCL, pickle.dumps({"entries": []})])) == pickle.loads(NCCL)
    empty = pickle.dumps({"version": "2.10", "entries": []})
    assert site.merge_dumps([empty]) == empty


def test_the_ranks_dump_takes_both_recorders(tmp_path, monkeypatch):
    calls = []

    def recorder(name, blob):
        def dump(*args):
            calls.append((name, args))
            return blob
        return dump

    c10d = types.SimpleNamespace(_dump_nccl_trace=recorder("nccl", NCCL), _dump_fr_trace=recorder("fr", GENERIC))
    torch = types.ModuleType("torch")
    torch._C = types.SimpleNamespace(_distributed_c10d=c10d)
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    site._dump(str(tmp_path), 0)
    assert sorted(name for name, _ in calls) == ["fr", "nccl"]
    doc = load_dump(tmp_path / "flight-recorder" / "rank-00003")
    assert len(doc["entries"]) == 94
    assert [p.name for p in (tmp_path / "flight-recorder").iterdir()] == ["rank-00003"]
