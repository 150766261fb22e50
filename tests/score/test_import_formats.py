"""dcgmi dmon, gssr JSON/SQLite importers and format detection, on samples in each tool's
own layout (tests/fixtures/score/README.md says where each comes from)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from hpcml.errors import UsageError
from hpcml.score import importers
from hpcml.score.importers import dmon, gssr_json
from tests.score.synth import score_job

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "score"
ROOT = Path(__file__).resolve().parents[2]
GSSR_DIR = DATA / "gssr_profile_out_JobID_777"
GSSR_STEP = GSSR_DIR / "unlabeled_job_777_step_0"
GSSR_SQLITE = DATA / "gssr_export_777.sqlite3"


def _fixture_module():
    spec = importlib.util.spec_from_file_location("gssr_fixture", ROOT / "benchmarks" / "gssr_fixture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- dcgmi dmon ------------------------------------------------------------------------------

def test_dmon_two_gpus_repeated_header_na_and_unknown_column():
    rec = dmon.load(DATA / "dmon_two_gpus.txt", interval=0.5)
    assert sorted(rec.gpus) == [("dmon_two_gpus", "0"), ("dmon_two_gpus", "1")]
    g0, g1 = rec.gpus[("dmon_two_gpus", "0")], rec.gpus[("dmon_two_gpus", "1")]
    # 20 ticks: the header reprinted after tick 15 neither adds nor splits a tick
    assert np.allclose(g0.t, np.arange(20) * 0.5) and np.allclose(g1.t, g0.t)
    assert set(g0.values) == {"sm_active", "pipe_tensor_active", "dram_active", "pipe_fp16_active",
                              "gpu_util", "tmptr"}
    assert np.isnan(g0.values["sm_active"][0]) and np.isnan(g1.values["pipe_tensor_active"][0])   # N/A
    assert g0.values["gpu_util"][0] == 0.0                          # a real 0 stays 0
    assert math.isclose(g0.values["sm_active"][3], 0.917, rel_tol=1e-6)
    assert math.isclose(g1.values["sm_active"][3], 0.553, rel_tol=1e-6)
    assert np.isnan(g1.values["dram_active"][7]) and not np.isnan(g0.values["dram_active"][7])
    assert g0.values["tmptr"][0] == 34 and g1.values["tmptr"][-1] == 45      # unknown tag kept
    assert any("no timestamps" in n and "0.5 s" in n for n in rec.notes)
    t, gpus = rec.aligned()
    job = score_job(gpus, {k: None for k in rec.gpus})
    assert {g.gpu for g in job.gpus} == {"dmon_two_gpus:0", "dmon_two_gpus:1"}


def test_dmon_mig_entities_and_strings_with_spaces():
    rec = dmon.load(DATA / "dmon_mig.txt", node="nid007")
    assert sorted(rec.gpus) == [("nid007", "0"), ("nid007", "GPU-CI0"), ("nid007", "GPU-I0")]
    assert np.allclose(rec.gpus[("nid007", "GPU-I0")].values["sm_active"], [0.82, 0.83, 0.84])
    assert np.allclose(rec.gpus[("nid007", "0")].t, [0, 1, 2])
    assert np.isnan(rec.gpus[("nid007", "GPU-CI0")].values["dvnam"]).all()      # strings are not numbers


def test_dmon_whitespace_layout_and_non_gpu_rows(tmp_path):
    f = tmp_path / "node3.txt"
    f.write_text("\n#Entity  SMACT  DRAMA  PCITX\nID\nGPU 0    0.5  0.25  1000\nSwitch 0  1  2  3\n"
                 "GPU 0    0.6  N/A  2000\n")
    rec = dmon.load(f)
    g = rec.gpus[("node3", "0")]
    assert list(g.t) == [0.0, 1.0] and list(g.values["pcie_tx_bytes"]) == [1000, 2000]
    assert np.isnan(g.values["dram_active"][1])
    assert any("Switch (1)" in n for n in rec.notes)


def test_dmon_old_header_units_id_and_mig_rows(tmp_path):
    """DCGM's user guide prints ``# Entity`` (a space) and the units line ``Id``, rows
    indented; GPU-I rows are instances of their own, each with its ticks."""
    f = tmp_path / "guide.txt"
    f.write_text("# Entity  GRACT  TENSO\n      Id\n    GPU 0  0.000  0.000\n  GPU-I 0  0.534  0.516\n"
                 "  GPU-CI 0  N/A  N/A\n    GPU 0  0.845  0.816\n  GPU-I 0  0.986  0.953\n")
    assert importers.detect(f) == "dmon"
    rec = dmon.load(f, node="n")
    assert {k[1]: len(g) for k, g in rec.gpus.items()} == {"0": 2, "GPU-I0": 2, "GPU-CI0": 1}
    assert rec.gpus[("n", "GPU-I0")].mig == {"gpu_i_id": "0"} and rec.gpus[("n", "GPU-CI0")].mig == {"gpu_ci_id": "0"}
    assert rec.gpus[("n", "0")].mig is None
    assert np.allclose(rec.gpus[("n", "GPU-I0")].values["pipe_tensor_active"], [0.516, 0.953])


def test_dmon_interleaved_elided_and_annotated(tmp_path):
    """``-i 7,0`` rows interleave, an entity may miss a tick, a ``...`` elides rows (noted)."""
    f = tmp_path / "h800.txt"
    f.write_text("#Entity   NVLTX      NVLRX\nID\nGPU 7     N/A        N/A\nGPU 0     N/A        N/A\n"
                 "GPU 7     10         20\n...\nGPU 7     30         40\nGPU 0     50         60\n")
    rec = dmon.load(f, node="n")
    assert rec.gpus[("n", "7")].t.tolist() == [0.0, 1.0, 2.0] and rec.gpus[("n", "0")].t.tolist() == [0.0, 2.0]
    assert any("left out at line 6" in n for n in rec.notes)
    f.write_text("#Entity   NVLTX      NVLRX\nID\nGPU 6     38735656050(36.07GB/s)      38739460219\n")
    with pytest.raises(UsageError, match=r":3: value .* has a note glued on"):
        dmon.load(f)


@pytest.mark.parametrize("text, words", [
    ("GPU 0  0.5\n", "no '#Entity' header"),
    ("#Entity  SMACT\nID\nGPU 0  0.5\nhello there\nGPU 0  0.6\n", r":4: not a dmon row"),
    ("#Entity  SMACT  DRAMA\nID\nGPU 0  0.5\nGPU 0  0.6  0.1\n", r":3: 1 values under 2 columns"),
    ("#Entity  SMACT\nID\nSwitch 0  0.5\n", "no GPU rows"),
])
def test_dmon_bad_input(tmp_path, text, words):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(UsageError, match=words):
        dmon.load(f)
    with pytest.raises(UsageError, match="above 0"):
        dmon.load(DATA / "dmon_two_gpus.txt", interval=0)


# --- gssr JSON ---------------------------------------------------------------------------------

def _gssr_docs() -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(GSSR_STEP.glob("*.json"))]


def test_gssr_json_values_time_and_several_gpus_per_file():
    rec = gssr_json.load(GSSR_DIR)
    assert sorted(rec.gpus) == [("nid00010", "0"), ("nid00010", "1"), ("nid00011", "2")]
    for doc in _gssr_docs():
        meta = doc["metadata"]
        for gpu, metrics in doc["data"].items():
            g = rec.gpus[(meta["hostname"], gpu)]
            assert np.allclose(g.t, meta["start_time"] + np.arange(10) * 0.5)
            for tag, values in metrics.items():
                assert np.array_equal(g.values[gssr_json.GSSR_TAGS[tag]], np.asarray(values, np.float32)), tag
    g = rec.gpus[("nid00010", "1")]
    assert {"pipe_tensor_active", "gpu_util", "fb_reserved", "nvlink_rx_bytes"} <= set(g.values)
    assert any("no timestamps" in n and "500 ms" in n for n in rec.notes)
    one = gssr_json.load(GSSR_STEP / "unlabeled_job_777_step_0_proc_1.json")      # a single file
    assert list(one.gpus) == [("nid00011", "2")]


def test_gssr_json_nan_and_unknown_tag(tmp_path):
    doc = _gssr_docs()[1]
    doc["data"]["2"]["sm_active"][3] = float("nan")           # json.dump writes NaN; orjson refuses it
    doc["data"]["2"]["power_usage_x"] = [1.0] * 10
    f = tmp_path / "x_proc_1.json"
    f.write_text(json.dumps(doc))
    g = gssr_json.load(f).gpus[("nid00011", "2")]
    assert np.isnan(g.values["sm_active"][3]) and not np.isnan(g.values["sm_active"][2])
    assert list(g.values["power_usage_x"]) == [1.0] * 10


def test_gssr_json_two_steps_of_one_gpu_are_joined(tmp_path):
    doc = _gssr_docs()[1]
    for step, offset in ((0, 0.0), (1, 100.0)):
        d = dict(doc, metadata=dict(doc["metadata"], step_id=step, start_time=doc["metadata"]["start_time"] + offset))
        _write(tmp_path / f"s{step}" / f"lbl_step_{step}_proc_1.json", json.dumps(d))
    rec = gssr_json.load(tmp_path)
    g = rec.gpus[("nid00011", "2")]
    assert len(g.t) == 20 and np.all(np.diff(g.t) > 0) and g.t[10] - g.t[0] == 100.0
    assert rec.meta["jobs"] == ["777.0", "777.1"]


def test_gssr_json_bad_files(tmp_path):
    src = (GSSR_STEP / "unlabeled_job_777_step_0_proc_0.json").read_bytes()
    cut = tmp_path / "run" / "lbl_proc_0.json"
    cut.parent.mkdir()
    cut.write_bytes(src[: len(src) // 2])                     # a profile cut short (job killed)
    with pytest.raises(UsageError, match=r"lbl_proc_0\.json: not valid JSON"):
        gssr_json.load(tmp_path / "run")
    shutil.copy(GSSR_STEP / "unlabeled_job_777_step_0_proc_1.json", tmp_path / "run" / "lbl_proc_1.json")
    with pytest.raises(UsageError, match=r"lbl_proc_0\.json: not valid JSON"):
        gssr_json.load(tmp_path / "run", workers=2)            # raised in a worker process
    cut.write_text("[1, 2]")
    with pytest.raises(UsageError, match="no 'metadata' and 'data'"):
        gssr_json.load(cut)
    doc = json.loads(src)
    del doc["metadata"]["sampling_time"]
    cut.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="key 'sampling_time'"):
        gssr_json.load(cut)
    doc = json.loads(src)
    doc["data"]["0"]["sm_active"][0] = "busy"
    cut.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=r"key '0\.sm_active'.*not a number"):
        gssr_json.load(cut)
    doc = json.loads(src)
    doc["data"]["0"]["dram_active"].pop()
    cut.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="9 values where"):
        gssr_json.load(cut)
    with pytest.raises(UsageError, match="no gssr"):
        gssr_json.load(tmp_path / "empty")


def test_gssr_fixture_round_trip_64_gpus(tmp_path):
    fx = _fixture_module()
    out, written = fx.write_gssr_json(tmp_path / "profile_out_JobID_4242", gpus=64, seconds=120,
                                      interval_ms=500, seed=3, return_values=True)
    files = sorted(out.rglob("*_proc_*.json"))
    assert len(files) == 64
    for f in files[:4]:                                       # byte for byte what json.dump writes
        raw = f.read_bytes()
        assert json.dumps(json.loads(raw)).encode() == raw
    assert importers.detect(out) == "gssr-json"
    for workers in (1, 2):
        rec = importers.load(out, workers=workers)
        assert len(rec.gpus) == 64 and {k[0] for k in rec.gpus} == {f"nid{i:05d}" for i in range(16)}
        for key, values in written.items():
            g = rec.gpus[key]
            assert len(g.t) == 240 and np.allclose(np.diff(g.t), 0.5)
            for tag, v in values.items():
                assert np.array_equal(g.values[gssr_json.GSSR_TAGS[tag]], v.astype(np.float32)), (key, tag)


# --- gssr SQLite ------------------------------------------------------------------------------

def test_gssr_sqlite_export_and_lost_gpus():
    rec = gssr_json.load_sqlite(GSSR_SQLITE)
    # gssr's exporter kept only the last GPU of task 0
    assert sorted(rec.gpus) == [("nid00010", "1"), ("nid00011", "2")]
    assert any("lost 1 GPU(s): nid00010 GPU 0 (proc 0)" in n for n in rec.notes)
    docs = {d["metadata"]["hostname"]: d for d in _gssr_docs()}
    for (host, gpu), g in rec.gpus.items():
        for tag, values in docs[host]["data"][gpu].items():
            assert np.array_equal(g.values[gssr_json.GSSR_TAGS[tag]], np.asarray(values, np.float32)), tag
        start = sqlite3.connect(GSSR_SQLITE).execute(
            "SELECT start_time FROM process_metadata WHERE hostname = ?", (host,)).fetchone()[0]
        t0 = datetime.strptime(start, "%Y-%m-%d %H:%M:%S").timestamp()
        assert np.allclose(g.t, t0 + np.arange(10) * 0.5)
    assert importers.load(GSSR_SQLITE).meta["format"] == "gssr-sqlite"


def _export_with_starts(tmp_path, starts: dict[int, object]):
    """The real gssr export with each named process's start_time rewritten (another writer's
    form of it, or none)."""
    db = tmp_path / "export.sqlite3"
    shutil.copy(GSSR_SQLITE, db)
    _edit(db, lambda con: con.executemany("UPDATE process_metadata SET start_time = ? WHERE proc_id = ?",
                                          [(v, k) for k, v in starts.items()]))
    return db


def _edit(db: Path, change) -> None:
    """``change(connection)`` made to the file and committed."""
    con = sqlite3.connect(db)
    try:
        change(con)
        con.commit()
    finally:
        con.close()


@pytest.mark.parametrize("form", ["2025-10-09T08:53:20", "2025-10-09 08:53:20.000000",
                                  "2025-10-09T08:53:20Z", "2025-10-09T10:53:20+02:00", "epoch"])
def test_gssr_sqlite_start_time_in_another_writers_form_is_the_same_time(tmp_path, form):
    """ISO 8601 (a T, a fraction, an offset) and an epoch number are read as the time they
    name; before, any form but gssr's own put the process at 1970."""
    utc = datetime(2025, 10, 9, 8, 53, 20).replace(tzinfo=__import__("datetime").timezone.utc).timestamp()
    local = datetime(2025, 10, 9, 8, 53, 20).timestamp()
    value: object = utc if form == "epoch" else form
    expected = utc if form == "epoch" or form.endswith(("Z", "+02:00")) else local
    rec = gssr_json.load_sqlite(_export_with_starts(tmp_path, {0: value, 1: value}))
    assert rec.meta["dated"] is True
    for g in rec.gpus.values():
        assert np.allclose(g.t, expected + np.arange(10) * 0.5)


def test_gssr_sqlite_with_no_start_time_is_not_dated_1970(tmp_path):
    """No process names a time (NULL, text that is no time): the times are seconds from each
    process's start, and the notes and the report say so; no 1970 anywhere."""
    db = _export_with_starts(tmp_path, {0: None, 1: "yesterday"})
    rec = gssr_json.load_sqlite(db)
    assert rec.meta["dated"] is False
    assert any("not dates" in n for n in rec.notes)
    for g in rec.gpus.values():
        assert np.allclose(g.t, np.arange(10) * 0.5)
    out = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(db), "--html", str(tmp_path / "r.html")],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr
    assert "not dates" in out.stdout and "1970" not in out.stdout
    assert "1970" not in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("bad", [None, "", "2025-13-45 99:99:99", b"\x00\x01", float("nan"), -5.0, "x" * 100_000])
def test_gssr_sqlite_one_process_undated_beside_dated_ones_is_refused(tmp_path, bad):
    """One process's start names no time while the other's does: its samples cannot be placed
    beside theirs (at 1970 they stretched the charts across 56 years): one line, exit 2,
    naming the process and the key; the value shown bounded."""
    db = _export_with_starts(tmp_path, {1: bad})
    with pytest.raises(UsageError, match=r"proc 1 has start_time .* names no time") as err:
        gssr_json.load_sqlite(db)
    assert "process_metadata.start_time" in str(err.value) and len(str(err.value)) < 600
    out = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(db)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_gssr_sqlite_samples_of_a_process_not_in_its_metadata_beside_dated_ones_are_refused(tmp_path):
    db = _export_with_starts(tmp_path, {})
    _edit(db, lambda con: con.execute("DELETE FROM process_metadata WHERE proc_id = 1"))
    with pytest.raises(UsageError, match="proc 1 is not in 'process_metadata'"):
        gssr_json.load_sqlite(db)


def test_gssr_sqlite_undated_steps_on_one_gpu_are_said_to_overlay(tmp_path):
    """Two job steps of the real export, neither dated: each step's samples start at 0, laid
    over each other on the GPUs both used, and the notes say so; a lost GPU names its step."""
    db = _export_with_starts(tmp_path, {0: None, 1: None})

    def second_step(con: sqlite3.Connection) -> None:
        for table in ("data", "process_metadata"):
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            sel = ", ".join("1" if c == "step_id" else f'"{c}"' for c in cols)
            con.execute(f"INSERT INTO {table} SELECT {sel} FROM {table}")
    _edit(db, second_step)
    rec = gssr_json.load_sqlite(db)
    assert any("2 GPU(s) hold samples of several processes" in n for n in rec.notes), rec.notes
    assert any("(step 0, proc 0)" in n and "(step 1, proc 0)" in n for n in rec.notes), rec.notes


def test_gssr_sqlite_not_an_export(tmp_path):
    db = tmp_path / "other.sqlite3"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE data (x)")
    con.commit()
    con.close()
    with pytest.raises(UsageError, match="no table job_metadata, process_metadata"):
        gssr_json.load_sqlite(db)
    with pytest.raises(UsageError, match="formats known: store, gssr-json"):
        importers.detect(db)


# --- detect / load ----------------------------------------------------------------------------

def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_detect_every_format(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "rank-0.arrows").write_bytes(b"")
    record = _write(tmp_path / "rec" / "clariden_1" / "step_0" / "proc_0.csv",
                    "timestamp,gpuId,DCGM_FI_PROF_SM_ACTIVE_avg\n1700000000,0,0.5\n")
    prom = _write(tmp_path / "scrape.txt", "# HELP DCGM_FI_PROF_SM_ACTIVE x\n# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
                  'DCGM_FI_PROF_SM_ACTIVE{gpu="0"} 0.5\n')
    bare = _write(tmp_path / "bare.prom", 'DCGM_FI_PROF_SM_ACTIVE{gpu="0"} 0.5\n')
    smi = _write(tmp_path / "smi.txt", "# gpu    sm   mem\n# Idx     %     %\n    0    97    41\n")
    dmon_copy = _write(tmp_path / "dmon.log", "\n\n" + (DATA / "dmon_two_gpus.txt").read_text())
    gssr_file = tmp_path / "renamed.json"                     # content, not the name, tells
    shutil.copy(GSSR_STEP / "unlabeled_job_777_step_0_proc_0.json", gssr_file)
    expected = {store: "store", GSSR_DIR: "gssr-json", gssr_file: "gssr-json", GSSR_SQLITE: "gssr-sqlite",
                tmp_path / "rec": "gssr-record", record: "gssr-record", dmon_copy: "dmon",
                DATA / "dmon_mig.txt": "dmon", prom: "exporter", bare: "exporter", smi: "nvidia-smi-dmon"}
    assert {p: importers.detect(p) for p in expected} == expected
    assert set(importers.FORMATS) == set(expected.values())


def test_detect_and_load_refuse(tmp_path):
    junk = _write(tmp_path / "notes.txt", "hello\n")
    with pytest.raises(UsageError, match=r"notes\.txt: cannot tell the recording format of this file; "
                                         r"formats known: store, gssr-json, gssr-sqlite, gssr-record, dmon, nvidia-smi-dmon, exporter$"
                       ) as err:
        importers.detect(junk)
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="this directory"):
        importers.detect(tmp_path)
    with pytest.raises(UsageError, match="no such file"):
        importers.detect(tmp_path / "missing")
    with pytest.raises(UsageError, match="no such file"):
        importers.load(tmp_path / "missing")
    with pytest.raises(UsageError, match="unknown recording format 'nvsmi'; formats known: store"):
        importers.load(junk, fmt="nvsmi")


def test_load_dispatches_with_options():
    rec = importers.load(DATA / "dmon_two_gpus.txt", interval=2.0, node="nid042")
    assert rec.meta["format"] == "dmon" and rec.gpus[("nid042", "1")].t[-1] == 38.0
    rec = importers.load(GSSR_DIR, interval=2.0, node=None)  # gssr files carry their own interval
    assert rec.meta["format"] == "gssr-json"
    assert any("interval" in n and "ignored" in n for n in rec.notes)


def _hostile_export(tmp_path, data: str, host: str = "'nid1'", added: str = ""):
    """A gssr-shaped export with 50 rows; ``added``: a column added after them (a generated
    one is then never computed while the file is made)."""
    db = tmp_path / "hostile.sqlite3"
    con = sqlite3.connect(db)
    con.executescript(f"""
        CREATE TABLE data {data};
        CREATE TABLE process_metadata(job_id, step_id, proc_id, hostname, gpu_ids, start_time, sampling_time);
        CREATE TABLE job_metadata(job_id);
        INSERT INTO process_metadata VALUES (1, 0, 0, {host}, '0', '2026-01-01 00:00:00', 0.5);
    """)
    con.executemany("INSERT INTO data(job_id, step_id, proc_id, gpu_id, sample_index, time) VALUES (1, 0, 0, 0, ?, ?)",
                    [(i, i * 0.5) for i in range(50)])
    if added:
        con.execute(f"ALTER TABLE data ADD COLUMN {added}")
    con.commit()
    con.close()
    return db


def test_a_gssr_export_that_computes_as_it_is_read_is_refused(tmp_path):
    """A generated column runs its expression at each SELECT: this 8 KB file once built a
    400 MB string per row (seconds and gigabytes for a few rows)."""
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time)",
                         added="sm_active GENERATED ALWAYS AS (length(printf('%.*c', 400000000, 'x'))) VIRTUAL")
    assert db.stat().st_size < 64 << 10
    with pytest.raises(UsageError, match="'data' has a generated column") as err:
        gssr_json.load_sqlite(db)
    assert str(db) in str(err.value)


def test_a_gssr_export_cell_longer_than_any_host_name_is_refused(tmp_path):
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active)",
                         host="printf('%.*c', 3000000, 'n')")
    with pytest.raises(UsageError, match="not a gssr SQLite export: string or blob too big"):
        gssr_json.load_sqlite(db)


def test_a_gssr_export_that_is_a_fifo_is_refused_unopened(tmp_path):
    fifo = tmp_path / "export.sqlite3"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        gssr_json.load_sqlite(fifo)


def test_a_gssr_export_with_more_values_than_the_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active, dram_active)")
    gssr_json.load_sqlite(db)                                  # 50 rows x 4 values: read
    monkeypatch.setattr(gssr_json, "SQLITE_CELLS_MAX", 199)
    with pytest.raises(UsageError, match="holds more than 199 values \\(2 metrics a row\\)"):
        gssr_json.load_sqlite(db)


def test_a_column_name_is_never_part_of_the_query(tmp_path):
    """A ``"`` in a column's name once ended the quoted identifier: this name ran a recursive
    query that never ends. It is a (strange) metric's name now, read as such."""
    name = 'm", (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c) AS "z'
    db = _hostile_export(tmp_path, f'(job_id, step_id, proc_id, gpu_id, sample_index, time, "{name.replace(chr(34), 2 * chr(34))}")')
    rec = gssr_json.load_sqlite(db)
    (gpu,) = rec.gpus.values()
    assert len(gpu.t) == 50 and any("with recursive" in k.lower() for k in gpu.values), list(gpu.values)


def test_a_fifo_where_sqlite_would_look_for_a_journal_hangs_nothing(tmp_path):
    """SQLite looks beside a database for a hot journal and opens it: a FIFO there waited for
    ever. The export is read immutable, from the descriptor that was checked."""
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active)")
    os.mkfifo(f"{db}-journal")
    p = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(db), "--json"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_an_export_whose_schema_is_not_utf8_is_one_line(tmp_path):
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active)")
    db.write_bytes(db.read_bytes().replace(b"process_metadata", b"process_met\xe6data"))
    p = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(db), "--format", "gssr-sqlite"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert str(db) in p.stderr or db.name in p.stderr, p.stderr


def test_lost_gpus_are_counted_not_listed_as_long_as_the_file_makes_them(tmp_path):
    """One process naming one GPU 20,000 times beside a 100 KB host name once built 15.7 GB
    of note; each GPU is counted once, and the note names a few."""
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active)")
    con = sqlite3.connect(db)
    con.execute("INSERT INTO process_metadata VALUES (1, 0, 1, ?, ?, '2026-01-01 00:00:00', 0.5)",
                ("h" * 100_000, ",".join(["7"] * 20_000 + [str(g) for g in range(100, 140)])))
    con.commit()
    con.close()
    rec = gssr_json.load_sqlite(db)
    assert rec.meta["lost_gpus_count"] == 41 and len(rec.meta["lost_gpus"]) == gssr_json.LOST_NAMED
    (note,) = [n for n in rec.notes if "lost 41 GPU(s)" in n]
    assert note.endswith(" and 31 more") and len(note) < 3000, note[:300]


def test_more_processes_or_sqlite_work_than_the_bounds_is_refused(tmp_path, monkeypatch):
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active)")
    monkeypatch.setattr(gssr_json, "SQLITE_PROCS_MAX", 0)
    with pytest.raises(UsageError, match="'process_metadata' table holds more than 0 processes"):
        gssr_json.load_sqlite(db)
    monkeypatch.undo()
    monkeypatch.setattr(gssr_json, "SQLITE_STEPS_FLOOR", 0)
    monkeypatch.setattr(gssr_json, "SQLITE_STEPS_PER_BYTE", 0)
    monkeypatch.setattr(importers, "SQLITE_STEP_EVERY", 10)
    with pytest.raises(UsageError, match="more work than a file of its size needs"):
        gssr_json.load_sqlite(db)


def _shared_child_btree(path, depth: int = 4, fanout: int = 500) -> None:
    """A gssr-shaped export whose ``data`` b-tree is a DAG: ``depth`` interior pages, each of
    whose ``fanout`` cells points at the same child, over one real leaf of 20 rows: a 32 KB
    file that claims 20 x 500^4 rows (SQLite's file format: interior table pages, type 5)."""
    import struct
    ps = 4096
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size={ps}")
    con.execute("CREATE TABLE data(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active)")
    con.execute("CREATE TABLE process_metadata(job_id, step_id, proc_id, hostname, gpu_ids, start_time)")
    con.execute("CREATE TABLE job_metadata(job_id, step_id)")
    con.executemany("INSERT INTO data VALUES (1, 0, 0, 0, ?, ?, 0.5)", [(i, i * 0.1) for i in range(20)])
    con.execute("INSERT INTO process_metadata VALUES (1, 0, 0, 'nid001', '0', '2024-01-01 00:00:00')")
    con.commit()
    leaf = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'data'").fetchone()[0]
    pages = os.path.getsize(path) // ps
    con.execute("PRAGMA writable_schema=ON")
    con.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = 'data'", (pages + depth,))
    con.commit()
    con.close()
    pages = os.path.getsize(path) // ps
    with open(path, "r+b") as f:
        child = leaf
        for d in range(depth):
            cells = [struct.pack(">I", child) + (bytes([k]) if k < 128 else bytes([0x80 | k >> 7, k & 0x7F]))
                     for k in range(1, fanout + 1)]
            page, end, ptrs = bytearray(ps), ps, []
            for c in cells:
                end -= len(c)
                page[end:end + len(c)] = c
                ptrs.append(end)
            page[0:12] = struct.pack(">BHHHBI", 0x05, 0, fanout, end, 0, child)
            for i, ptr in enumerate(ptrs):
                page[12 + 2 * i:14 + 2 * i] = struct.pack(">H", ptr)
            f.seek((pages + d) * ps)
            f.write(page)
            child = pages + 1 + d
        f.seek(28)
        f.write(struct.pack(">I", pages + depth))               # the header's page count
        f.seek(24)
        counter = f.read(4)
        f.seek(92)
        f.write(counter)                                        # its count valid for this change counter


def test_an_export_whose_pages_share_a_child_is_refused_not_walked_for_ever(tmp_path):
    """count(*) over this 32 KB file walked 10^12 rows in one SQLite step, past any step
    budget, in detection too; ``PRAGMA quick_check`` finds the page referenced twice."""
    db = tmp_path / "dag.sqlite3"
    _shared_child_btree(db)
    assert db.stat().st_size < 64 << 10
    for fmt in ([], ["--format", "gssr-sqlite"]):
        p = subprocess.run([sys.executable, "-m", "hpcml", "score", "report", str(db), *fmt], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_a_column_default_every_row_reads_back_is_refused(tmp_path):
    """A column added with a 1 MB default: each of the rows stored before it reads the
    default back (a 1.6 MB file asked for 32 GB a batch)."""
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time)",
                         added="sm_active DEFAULT '" + "9" * 1000 + "'")
    with pytest.raises(UsageError, match="'data' has a column with a default"):
        gssr_json.load_sqlite(db)


def test_a_value_past_float32_is_unknown_and_says_nothing_on_stderr(tmp_path, recwarn):
    db = _hostile_export(tmp_path, "(job_id, step_id, proc_id, gpu_id, sample_index, time, sm_active)")
    con = sqlite3.connect(db)
    con.execute("UPDATE data SET sm_active = 1e300")
    con.commit()
    con.close()
    (gpu,) = gssr_json.load_sqlite(db).gpus.values()
    assert np.isnan(gpu.values["sm_active"]).all() and not [w for w in recwarn if "overflow" in str(w.message)]
