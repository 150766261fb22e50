"""Hostile and out-of-range recordings: each is refused in one line naming the file (exit
2), or read with what it cannot mean left unknown, never scored. Fixtures are written the
way each producer writes its files: dcgm-exporter's exposition text, gssr-record's CSV,
dcgmi dmon's columns, gssr's JSON, hpcml's own job directory (``archive.write_store``)."""

from __future__ import annotations

import io
import json
import math
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from hpcml.errors import UsageError
from hpcml.score import importers
from hpcml.score.recording import GRID_MAX_SAMPLES, Recording
from hpcml.score.report import build
from tests.needs import shared_testdata

LABELS = 'gpu="{gpu}",UUID="GPU-4b5c7b5e-0000-0000-0000-00000000000{gpu}",device="nvidia{gpu}",' \
         'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"'
FIELDS = {"DCGM_FI_PROF_SM_ACTIVE": "gauge", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
          "DCGM_FI_PROF_DRAM_ACTIVE": "gauge", "DCGM_FI_DEV_GPU_UTIL": "gauge",
          "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter"}


def scrape(values: dict[str, float], *, gpus=("0",), node="n1", extra="", ts: int | None = None,
           total_suffix: bool = False) -> str:
    """One /metrics response as dcgm-exporter writes it: # HELP, # TYPE, then a series per GPU.
    ``total_suffix``: counters named ``<name>_total`` (prometheus_client-style exposition)."""
    out = []
    for name, v in values.items():
        kind = FIELDS.get(name, "counter" if name.endswith("_BYTES") else "gauge")
        out += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}"]
        sample = f"{name}_total" if total_suffix and kind == "counter" else name
        for gpu in gpus:
            out.append(f"{sample}{{{LABELS.format(gpu=gpu, node=node)}{extra}}} {v:g}"
                       + (f" {ts}" if ts is not None else ""))
    return "\n".join(out) + "\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


class Blocked(BaseException):
    """Not an OSError (TimeoutError is one, and readers turn those into UsageErrors)."""


@contextmanager
def deadline(seconds: int = 5):
    """Fail, not hang, where a reader waits on a FIFO."""
    def fired(*_):
        raise Blocked("blocked reading")
    old = signal.signal(signal.SIGALRM, fired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line(exc: pytest.ExceptionInfo, path: Path) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg, msg
    assert exc.value.exit_code == 2
    return msg


BUSY = {"DCGM_FI_PROF_SM_ACTIVE": 0.9, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.8, "DCGM_FI_PROF_DRAM_ACTIVE": 0.3}


# 1. the time grid: finite timestamps, a bounded span, a sane interval

def test_mixed_timestamped_and_bare_samples_refused(tmp_path):
    p = write(tmp_path, "mixed.prom", scrape(BUSY, gpus=("0",), ts=1_700_000_000_000) + scrape(BUSY, gpus=("1",)))
    with pytest.raises(UsageError) as exc:
        importers.load(p).grid()
    assert "timestamp" in one_line(exc, p)


def test_a_sample_a_year_later_is_refused_not_allocated(tmp_path):
    t0 = 1_700_000_000_000
    p = write(tmp_path, "far.prom", "".join(scrape(BUSY, ts=t0 + k * 1000) for k in range(10))
              + scrape(BUSY, ts=t0 + 365 * 86400_000))
    rec = importers.load(p)
    with pytest.raises(UsageError) as exc:
        build(rec)
    one_line(exc, p)


def test_grid_over_its_bound_refused(tmp_path):
    """Within 30 days, but 20 days at a 10-ms interval: 173 million grid points per series."""
    t0 = 1_700_000_000_000
    p = write(tmp_path, "dense.prom", "".join(scrape(BUSY, ts=t0 + k * 10) for k in range(10))
              + scrape(BUSY, ts=t0 + 20 * 86400_000))
    with pytest.raises(UsageError) as exc:
        build(importers.load(p))
    assert str(GRID_MAX_SAMPLES) in one_line(exc, p)


def test_few_samples_with_a_stray_one_refused(tmp_path):
    """Three samples, the last in the year 5138: the median interval is the gap itself, so
    the grid is small, and only the span says it is no job's recording."""
    t0 = 1_700_000_000_000
    p = write(tmp_path, "few.prom", scrape(BUSY, ts=t0) + scrape(BUSY, ts=t0 + 1000) + scrape(BUSY, ts=99999999999999))
    with pytest.raises(UsageError) as exc:
        build(importers.load(p))
    assert "30 days" in one_line(exc, p)


def gssr_csv(rows: list[tuple], pipes=("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
                                       "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
                                       "DCGM_FI_PROF_DRAM_ACTIVE")) -> str:
    """gssr-record.c's CSV: timestamp, gpuId, then min/avg/max per field (%.2f), one row per GPU and second."""
    head = ["timestamp", "gpuId"] + [f"{f}_{s}" for f in pipes for s in ("min", "avg", "max")]
    lines = [",".join(head)]
    for t, gpu, *vals in rows:
        lines.append(",".join([str(t), str(gpu)] + [f"{v:.2f}" if isinstance(v, float) else str(v)
                                                    for v in vals for _ in range(3)]))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_gssr_record_non_finite_timestamp_refused(tmp_path, bad):
    d = tmp_path / "job" / "step_0"
    d.mkdir(parents=True)
    f = d / "proc_0.csv"
    f.write_text(gssr_csv([(1_700_000_000, 0, 0.9, 0.0, 0.5, 0.0, 0.2), (bad, 0, 0.9, 0.0, 0.5, 0.0, 0.2)]))
    with pytest.raises(UsageError) as exc:
        importers.load(tmp_path / "job").grid()
    assert "finite" in one_line(exc, f) and ":3:" in str(exc.value)


def test_gssr_record_far_timestamp_refused(tmp_path):
    d = tmp_path / "job" / "step_0"
    d.mkdir(parents=True)
    (d / "proc_0.csv").write_text(gssr_csv([(t, 0, 0.9, 0, 0.5, 0, 0.2) for t in range(10)]
                                           + [(1e9, 0, 0.9, 0, 0.5, 0, 0.2)]))
    with pytest.raises(UsageError) as exc:
        build(importers.load(tmp_path / "job"))
    one_line(exc, tmp_path / "job")


@pytest.mark.parametrize("interval", [math.nan, math.inf, 1e308, -1.0, 0.0])
@pytest.mark.parametrize("fmt", ["exporter", "dmon"])
def test_interval_must_be_finite_and_positive(tmp_path, interval, fmt):
    p = (write(tmp_path, "s.prom", scrape(BUSY) * 3) if fmt == "exporter" else
         write(tmp_path, "d.txt", "#Entity   SMACT        TENSO\nID\nGPU 0     0.912        0.471\n"
                                  "GPU 0     0.912        0.471\n"))
    with pytest.raises(UsageError) as exc:
        importers.load(p, interval=interval).grid()
    assert exc.value.key == "interval" and "\n" not in str(exc.value)


# 2. bounded, non-blocking reads

def _gssr_json_dir(tmp_path: Path) -> Path:
    d = tmp_path / "profile_out_JobID_1" / "train"
    d.mkdir(parents=True)
    return d / "train_proc_0.json"


@pytest.mark.parametrize("fmt,name", [("exporter", "s.prom"), ("dmon", "d.txt"), ("gssr-json", "x_proc_0.json"),
                                      ("gssr-record", "proc_0.csv"), (None, "s.prom")])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_fifo_and_device_refused_unread(tmp_path, fmt, name, kind):
    p = tmp_path / name
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to("/dev/zero")
    with deadline(), pytest.raises(UsageError) as exc:
        importers.load(p, fmt=fmt)
    one_line(exc, p)


def test_fifo_in_a_gssr_record_directory_refused(tmp_path):
    d = tmp_path / "job" / "step_0"
    d.mkdir(parents=True)
    os.mkfifo(d / "proc_0.csv")
    with deadline(), pytest.raises(UsageError) as exc:
        importers.load(tmp_path / "job")
    one_line(exc, d / "proc_0.csv")


def test_file_over_the_bound_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(importers, "FILE_MAX", 1000)
    p = write(tmp_path, "s.prom", scrape(BUSY) * 20)
    with pytest.raises(UsageError) as exc:
        importers.load(p, fmt="exporter")
    assert "larger than 1000 bytes" in one_line(exc, p)


# 3. counters exposed as <name>_total

def test_energy_counter_with_total_suffix_is_read(tmp_path):
    p = write(tmp_path, "s.prom", "".join(scrape({**BUSY, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e9 + k * 7e5,
                                                  "DCGM_FI_PROF_PCIE_TX_BYTES": 1e6}, total_suffix=True)
                                          for k in range(3)))
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total{" in p.read_text()
    rec = importers.load(p)
    g = rec.gpus[("n1", "0")].freeze()
    assert list(g.values["total_energy_consumption"]) == pytest.approx([1e9, 1e9 + 7e5, 1e9 + 1.4e6], rel=1e-6)
    assert "pcie_tx_bytes" in g.values and not any(k.endswith("_total") for k in g.values)
    rep = build(rec)
    assert rep["energy_gpus"] == 1 and rep["energy_wh"] is not None and rep["energy_wh"] > 0


def test_energy_total_without_type_line_is_read(tmp_path):
    text = "".join(f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total{{{LABELS.format(gpu=0, node="n1")}}} {v}\n'
                   for v in (1000, 2000))
    g = importers.load(write(tmp_path, "s.prom", text), fmt="exporter").gpus[("n1", "0")].freeze()
    assert list(g.values) == ["total_energy_consumption"]


# 4. impossible shares are unknown, never scored

@pytest.mark.parametrize("values,field", [
    ({"DCGM_FI_PROF_SM_ACTIVE": 0.9, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 37.5, "DCGM_FI_PROF_DRAM_ACTIVE": 0.2},
     "pipe_tensor_active"),
    ({"DCGM_FI_PROF_SM_ACTIVE": 0.9, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": -0.5, "DCGM_FI_PROF_DRAM_ACTIVE": -0.4},
     "pipe_tensor_active"),
    ({"DCGM_FI_DEV_GPU_UTIL": 450}, "gpu_util"),
])
def test_out_of_range_values_are_unknown(tmp_path, values, field):
    p = write(tmp_path, "s.prom", scrape(values) * 1 + "".join(scrape(values) for _ in range(4)))
    rep = build(importers.load(p))
    assert rep["score"] is None or 0 <= rep["score"] <= 1
    if field == "pipe_tensor_active" and values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] > 1:
        assert rep["score"] != pytest.approx(37.5)
    assert any(n.startswith("values outside their possible range") and f"5 {field}" in n for n in rep["notes"]), \
        rep["notes"]


def test_rounding_above_one_is_clipped_not_dropped():
    rec = Recording(source="test:x")
    g = rec.gpu("n", "0")
    g.add(0.0, "sm_active", 1.004)
    g.add(1.0, "sm_active", 0.5)
    rec.freeze()
    assert list(g.values["sm_active"]) == [1.0, 0.5] and not rec.notes


# 5. gssr-record's tensor sub-pipes

def test_gssr_record_tensor_from_sub_pipes(tmp_path):
    d = tmp_path / "job" / "step_0"
    d.mkdir(parents=True)
    # SM busy, HMMA 0.9: a GEMM-bound job; IMMA + HMMA over 1 is impossible: unknown
    (d / "proc_0.csv").write_text(gssr_csv([(t, 0, 0.95, 0.0, 0.9, 0.0, 0.3) for t in range(10)]
                                           + [(10, 0, 0.95, 0.6, 0.7, 0.0, 0.3)]))
    rec = importers.load(tmp_path / "job")
    tensor = rec.gpus[("proc0", "0")].freeze().values["pipe_tensor_active"]
    assert tensor[:10] == pytest.approx([0.9] * 10) and math.isnan(tensor[10])
    assert any(n.startswith("1 sample(s) whose tensor sub-pipes summed above 1") for n in rec.notes)
    rep = build(rec)
    assert rep["bound"] == "compute"
    assert not any("not recorded: tensor" in n for n in rep["notes"])


def test_gssr_record_impossible_sub_pipe_not_summed(tmp_path):
    d = tmp_path / "job" / "step_0"
    d.mkdir(parents=True)
    (d / "proc_0.csv").write_text(gssr_csv([(0, 0, 0.9, 0.0, 7.0, 0.0, 0.3), (1, 0, 0.9, 0.0, 0.5, 0.0, 0.3)]))
    rec = importers.load(tmp_path / "job").freeze()
    tensor = rec.gpus[("proc0", "0")].values["pipe_tensor_active"]
    assert np.isnan(tensor[0]) and tensor[1] == pytest.approx(0.5)
    assert any("1 pipe_tensor_active" in n for n in rec.notes)


GSSR = shared_testdata("gpu-telemetry") / "gssr-record"


@pytest.mark.parametrize("name", ["short-n1-g1", "short-n100-g1", "fake-n100-g4", "gendata-layout"])
def test_real_gssr_record_directories_record_tensor(name):
    """The tensor pipe comes from the sub-pipes gssr-record records. These directories are
    generated (random values): where every sample's sub-pipes sum above 1, which one pipe's
    shares cannot, tensor is unknown and a note says why, never a capped 1."""
    rep = build(importers.load(GSSR / name))
    assert any(n.startswith("tensor activity is the sum") for n in rep["notes"])
    if any("not recorded: tensor" in n for n in rep["notes"]):
        assert any("summed above 1" in n for n in rep["notes"]), rep["notes"]
    assert rep["score"] is not None and 0 <= rep["score"] <= 1


# 6. hpcml job directories: values type-checked beyond the schema tag

def _store(tmp_path: Path) -> Path:
    from hpcml.score.archive import write_store
    rec = importers.load(write(tmp_path, "s.prom", "".join(scrape(BUSY, gpus=("0", "1")) for _ in range(3))))
    out = tmp_path / "job"
    write_store(rec.freeze(), out)
    return out


@pytest.mark.parametrize("file,key,value", [
    ("job.json", "ntasks", "abc"), ("job.json", "ntasks", 10**10), ("job.json", "ntasks", -1),
    ("job.json", "ntasks", True), ("job.json", "notes", 5), ("job.json", "notes", [1]),
    ("rank-00000.json", "gpu_ids", [1]), ("rank-00000.json", "gpu_models", "x"),
    ("rank-00000.json", "gpu_ids", {"0": [1]}), ("rank-00000.json", "gpu_models", {"0": 5}),
    ("rank-00000.json", "node", 5), ("rank-00000.json", "gpu_mig", "x"),
])
def test_store_values_are_type_checked(tmp_path, file, key, value):
    job = _store(tmp_path)
    assert importers.load(job).gpus                        # the unedited store reads
    doc = json.loads((job / file).read_text())
    doc[key] = value
    (job / file).write_text(json.dumps(doc))
    with deadline(20), pytest.raises(UsageError) as exc:
        importers.load(job)
    one_line(exc, job / file)
    assert exc.value.key is not None and exc.value.key.split(".")[0] == key


# 7. dmon header without a bare Entity cell

def test_dmon_header_entity_with_colon_refused(tmp_path):
    p = write(tmp_path, "d.txt", "#Entity: GRACT\nID\nGPU 0     0.912\n")
    with pytest.raises(UsageError) as exc:
        importers.load(p, fmt="dmon")
    assert one_line(exc, p).startswith(f"{p}:1:")


# 8. one sample per scrape per GPU per metric

def test_duplicate_series_with_other_labels_is_one_sample(tmp_path):
    text = "".join(scrape(BUSY, extra=',namespace="default",pod="a"')
                   + "\n".join(line for line in scrape(BUSY, extra=',namespace="default",pod="b"').splitlines()
                               if not line.startswith("#")) + "\n"
                   for _ in range(2))
    rec = importers.load(write(tmp_path, "dup.prom", text))
    assert "2 scrapes" in rec.notes
    assert any(n.startswith("6 duplicate series") for n in rec.notes), rec.notes
    assert len(rec.gpus[("n1", "0")]) == 2


def test_real_kubernetes_scrape_still_one_scrape():
    path = shared_testdata("gpu-telemetry") / "dcgm-exporter-derived" / "dcgm-exporter_README_L68-78.no-ellipsis.prom"
    rec = importers.load(path)
    assert "1 scrape" in rec.notes and not any("duplicate" in n for n in rec.notes)


# 9. deep JSON nesting

def test_gssr_json_nested_too_deeply_refused(tmp_path):
    f = _gssr_json_dir(tmp_path)
    f.write_text('{"metadata": {"sampling_time": 500}, "data": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(UsageError) as exc:
        importers.load(f, fmt="gssr-json")
    assert "nested too deeply" in one_line(exc, f)


def test_gssr_json_infinity_and_overflow_are_missing(tmp_path, recwarn):
    f = _gssr_json_dir(tmp_path)
    # gssr's json.dump writes Infinity; 1e300 overflows float32
    meta = {"job_id": 1, "step_id": 0, "label": "train", "hostname": "nid001", "proc_id": 0, "n_gpus": 1,
            "gpu_ids": [0], "start_time": 1_700_000_000.0, "end_time": 1_700_000_010.0, "elapsed": 10.0,
            "sampling_time": 1000, "n_samples": 10, "cmd": "python train.py"}
    sm = [0.9] * 5 + [float("inf"), 1e300] + [0.9] * 3
    f.write_text(json.dumps({"metadata": meta, "data": {"0": {"sm_active": sm, "tensor_active": [0.8] * 10,
                                                             "power_usage": [float("inf")] + [300.0] * 9}}}))
    rec = importers.load(f.parent).freeze()
    g = rec.gpus[("nid001", "0")]
    assert np.isnan(g.values["sm_active"][5:7]).all() and np.isnan(g.values["power_usage"][0])
    assert not any("outside their possible range" in n for n in rec.notes)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


# 10. a score with no bound prints none

def test_terminal_prints_no_bound_when_none(tmp_path):
    from hpcml.score.terminal import print_summary
    low = {"DCGM_FI_PROF_SM_ACTIVE": 0.6, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.01, "DCGM_FI_PROF_DRAM_ACTIVE": 0.01}
    rep = build(importers.load(write(tmp_path, "low.prom", "".join(scrape(low) for _ in range(5)))))
    assert rep["score"] is not None and rep["bound"] is None
    out = io.StringIO()
    print_summary(rep, None, console=Console(file=out, width=200))
    text = out.getvalue()
    assert "GPU saturation score" in text and "None" not in text and "-bound" not in text.splitlines()[0]
