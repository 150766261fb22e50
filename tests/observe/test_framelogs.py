"""``hpcml.observe.framelogs``: the last values of a framework's own log, read from files
made the way HF Trainer, Lightning's CSVLogger and a JSON-lines writer make them (the real
producers are run in tests/run/test_farmresults.py), and hostile ones: links out of the
task's directory, a log larger than the read budget, a row being written, values that are
not finite numbers."""

from __future__ import annotations

import json
import os

from hpcml.observe import framelogs
from hpcml.observe.framelogs import read_task_logs


def _state(path, history, step):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": step, "log_history": history}))


def test_the_trainer_state_furthest_along_is_read_and_hfs_bookkeeping_is_not_a_metric(tmp_path):
    _state(tmp_path / "out" / "checkpoint-4" / "trainer_state.json", [{"loss": 3.0, "step": 2}], 4)
    _state(tmp_path / "out" / "checkpoint-8" / "trainer_state.json",
           [{"loss": 3.0, "grad_norm": 1.5, "step": 2}, {"eval_loss": 2.5, "eval_runtime": 0.1, "step": 4},
            {"loss": 2.0, "learning_rate": 1e-4, "epoch": 0.5, "step": 8},
            {"train_runtime": 9.0, "train_loss": 2.4, "total_flos": 1e9, "train_samples_per_second": 7.0, "step": 8}], 8)
    os.utime(tmp_path / "out" / "checkpoint-4" / "trainer_state.json", (2e9, 2e9))     # newer, but behind
    [got] = read_task_logs(tmp_path)
    assert got.kind == "hf_trainer" and got.source == "out/checkpoint-8/trainer_state.json" and got.step == 8
    assert got.values == {"loss": 2.0, "grad_norm": 1.5, "eval_loss": 2.5, "learning_rate": 1e-4, "epoch": 0.5,
                          "train_loss": 2.4}


def test_a_lightning_csv_keeps_each_columns_last_value_and_drops_a_row_being_written(tmp_path):
    d = tmp_path / "lightning_logs" / "version_1"
    d.mkdir(parents=True)
    (d / "metrics.csv").write_text("epoch,step,train_loss,val_loss\n0,0,1.5,\n0,1,1.25,\n0,1,,0.9\n0,2,1.")
    (tmp_path / "lightning_logs" / "version_0").mkdir()
    (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").write_text("epoch,step,train_loss\n0,9,9.0\n")
    os.utime(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", (1e9, 1e9))     # an older run
    [got] = read_task_logs(tmp_path)
    assert got.source == "lightning_logs/version_1/metrics.csv"
    assert got.values == {"epoch": 0.0, "train_loss": 1.25, "val_loss": 0.9} and got.step == 1


def test_a_log_larger_than_the_budget_is_read_from_its_header_and_its_end(tmp_path, monkeypatch):
    monkeypatch.setattr(framelogs, "TAIL", 4096)
    d = tmp_path / "lightning_logs" / "version_0"
    d.mkdir(parents=True)
    rows = "".join(f"0,{i},{i / 10}\n" for i in range(100_000))
    (d / "metrics.csv").write_text("epoch,step,train_loss\n" + rows)
    [got] = read_task_logs(tmp_path)
    assert got.step == 99_999 and got.values["train_loss"] == 9999.9
    (tmp_path / "m.jsonl").write_text("".join(json.dumps({"step": i, "loss": -i}) + "\n" for i in range(50_000)))
    [_, got] = read_task_logs(tmp_path, "m.jsonl")
    assert got.values == {"loss": -49_999.0} and got.step == 49_999


def test_values_that_are_not_numbers_are_not_metrics_and_a_last_nan_is_said_as_logged(tmp_path):
    """A last value of NaN or Infinity (as Python's json writes them: a loss that diverged) is
    the metric's last value, said as that, never the finite one before it (was: loss 1.0)."""
    (tmp_path / "m.jsonl").write_text('{"loss": 1.0, "acc": 0.5}\n{"loss": NaN, "acc": Infinity, "ok": true}\n'
                                      '{"big": ' + "9" * 4000 + ', "name": "x", "nested": {"loss": 7}}\n'
                                      '[1, 2]\nnot json\n{"loss": 0.5')
    [got] = read_task_logs(tmp_path, "m.jsonl")
    assert got.values == {} and got.non_finite == {"loss": "nan", "acc": "inf"} and got.step is None
    (tmp_path / "m.jsonl").write_text('{"loss": NaN}\n{"loss": 0.75, "step": 3}\n')
    [got] = read_task_logs(tmp_path, "m.jsonl")
    assert got.values == {"loss": 0.75} and got.non_finite == {} and got.step == 3


def test_a_diverged_run_s_lightning_and_hf_logs_say_nan_last(tmp_path):
    """Lightning's CSVLogger writes a NaN loss as ``nan``; HF Trainer's trainer_state.json as
    ``NaN`` (json.dump's default): the last value is that, not the finite one before."""
    d = tmp_path / "a" / "lightning_logs" / "version_0"
    d.mkdir(parents=True)
    (d / "metrics.csv").write_text("epoch,step,train_loss\n0,0,1.5\n0,1,nan\n")
    [got] = read_task_logs(tmp_path / "a")
    assert got.values == {"epoch": 0.0} and got.non_finite == {"train_loss": "nan"} and got.step == 1
    _state(tmp_path / "b" / "out" / "checkpoint-2" / "trainer_state.json",
           [{"loss": 2.0, "step": 1}, {"loss": float("nan"), "grad_norm": float("inf"), "step": 2}], 2)
    [got] = read_task_logs(tmp_path / "b")
    assert got.values == {} and got.non_finite == {"loss": "nan", "grad_norm": "inf"}
    assert got.to_json()["non_finite"] == {"loss": "nan", "grad_norm": "inf"}


def test_nothing_is_read_through_a_link_out_of_the_tasks_directory(tmp_path):
    outside = tmp_path / "outside"
    _state(outside / "trainer_state.json", [{"loss": 1.0}], 1)
    (outside / "m.jsonl").write_text('{"loss": 1.0}\n')
    task = tmp_path / "task"
    task.mkdir()
    (task / "out").symlink_to(outside)                          # a linked directory is not walked
    (task / "m.jsonl").symlink_to(outside / "m.jsonl")          # the sweep's file may not lead out
    (task / "trainer_state.json").symlink_to(outside / "trainer_state.json")   # a found file is not read through a link
    assert read_task_logs(task, "m.jsonl") == []
    assert read_task_logs(task, "../outside/m.jsonl") == []
    fifo = task / "f.jsonl"
    os.mkfifo(fifo)                                             # never waited on
    assert read_task_logs(task, "f.jsonl") == []
    assert read_task_logs(tmp_path / "missing") == []


def test_a_directory_of_thousands_is_looked_at_within_its_bounds(tmp_path, monkeypatch):
    monkeypatch.setattr(framelogs, "MAX_DIRS", 50)
    for i in range(200):
        (tmp_path / "data" / f"d{i:03d}").mkdir(parents=True)
    deep = tmp_path / "a" / "b" / "c" / "d" / "e" / "f"
    _state(deep / "trainer_state.json", [{"loss": 1.0}], 1)     # below MAX_DEPTH: not looked for
    assert read_task_logs(tmp_path) == []


def test_a_csv_that_is_not_lightnings_is_left_or_read_row_by_row(tmp_path):
    d = tmp_path / "lightning_logs" / "version_0"
    d.mkdir(parents=True)
    (d / "metrics.csv").write_text("epoch,step,loss\n0,1," + "1" * 200_000 + "\n")    # over csv's field limit
    assert read_task_logs(tmp_path) == []
    (d / "metrics.csv").write_bytes(b"\xef\xbb\xbfstep,loss\n1,\"2.0\n2,1.5\n3,1.25\n")  # a BOM, a stray quote
    [got] = read_task_logs(tmp_path)
    assert got.values == {"loss": 1.25} and got.step == 3


def test_a_link_loop_or_a_linked_task_directory_is_not_read(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "m.jsonl").symlink_to("m.jsonl")                      # a loop
    assert read_task_logs(tmp_path, "out/m.jsonl") == []
    real = tmp_path / "real"
    _state(real / "trainer_state.json", [{"loss": 1.0}], 1)
    (tmp_path / "task").symlink_to(real)
    assert read_task_logs(tmp_path / "task") == []


def test_the_logs_are_found_before_a_dataset_of_thousands_of_folders(tmp_path, monkeypatch):
    """Breadth first, the directories frameworks write first: a task directory whose
    dataset has more folders than the budget still shows its log."""
    monkeypatch.setattr(framelogs, "MAX_DIRS", 100)
    for i in range(300):
        (tmp_path / "a_dataset" / f"n{i:05d}").mkdir(parents=True)
    _state(tmp_path / "zz_out" / "checkpoint-8" / "trainer_state.json", [{"loss": 0.5}], 8)
    [got] = read_task_logs(tmp_path)
    assert got.source == "zz_out/checkpoint-8/trainer_state.json"
