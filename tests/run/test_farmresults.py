"""``hpcml farm results``: each task's parameters, its optimizer steps and the last values it
logged through ``hpcml.observe.log`` or its framework's logger (real tasks: the real API, HF
Trainer, Lightning, a plain loop, none changed for hpcml), sorted, as JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import jsonschema
import pytest

from hpcml import schemas
from tests import needs
from tests.farm.farmtools import hpcml

TRAIN = """
import os, sys
from hpcml import observe
lr = float(sys.argv[1])
for step in range(3):
    observe.log(step=step, loss=lr * 10 - step, acc=step / 10)
"""


def _swept(tmp_path: Path, script: str, args: str, product: str) -> tuple[Path, dict]:
    """A farm of ``script`` over ``product``, run on 2 slots; its results by last loss, checked
    against the schema."""
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "s.yaml").write_text(f"command: {sys.executable} {tmp_path}/train.py {args}\nproduct: {product}\n")
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "s.yaml").returncode == 0
    p = hpcml("farm", "run", farm, "--slots", "2", extra={"HPCML_OBSERVE_FLUSH": "0.05"})
    assert p.returncode == 0, p.stderr
    doc = json.loads(hpcml("farm", "results", farm, "--json", "--sort", "loss").stdout)
    jsonschema.validate(doc, schemas.load("farm.results"), cls=jsonschema.Draft202012Validator)
    return farm, doc


def test_results_table_has_params_and_last_logged_values(tmp_path):
    farm, doc = _swept(tmp_path, TRAIN, "{lr} --bs {bs}", "{lr: [0.3, 0.1, 0.2], bs: [8]}")
    assert next(iter(doc)) == "schema" and doc["params"] == ["lr", "bs"] and doc["metrics"] == ["acc", "loss"]
    assert [r["params"]["lr"] for r in doc["rows"]] == [0.1, 0.2, 0.3]            # sorted by last loss
    assert [r["metrics"]["loss"] for r in doc["rows"]] == [-1.0, 0.0, 1.0]       # lr*10 - 2: the last step
    assert all(r["metrics"]["acc"] == 0.2 and r["state"] == "ok" for r in doc["rows"])
    desc = json.loads(hpcml("farm", "results", farm, "--json", "--sort", "-lr", "--limit", "1").stdout)
    assert [r["params"]["lr"] for r in desc["rows"]] == [0.3]
    rows = list(csv.DictReader(io.StringIO(hpcml("farm", "results", farm, "--csv").stdout)))
    assert [(r["id"], r["lr"], r["loss"]) for r in rows] == [("0", "0.3", "1.0"), ("1", "0.1", "-1.0"),
                                                            ("2", "0.2", "0.0")]
    table = hpcml("farm", "results", farm, "--sort", "loss")
    assert table.returncode == 0 and "loss" in table.stdout and "0.1" in table.stdout
    assert hpcml("farm", "status", farm).returncode == 0


DIVERGES = """
import math, sys
from hpcml import observe
lr = float(sys.argv[1])
for step in range(3):
    observe.log(step=step, loss=float("nan") if lr > 0.25 and step == 2 else lr * 10 - step)
"""


def test_a_task_whose_loss_diverged_shows_nan_last_not_its_loss_before(tmp_path):
    """The lr=0.3 task's last loss is NaN: its row says nan (null in --json, with
    metric_non_finite), sorts after the tasks that trained, and the CSV and the table say nan
    (was: 2.0, its loss a step before, ranked among the good ones)."""
    farm, doc = _swept(tmp_path, DIVERGES, "{lr}", "{lr: [0.3, 0.1]}")
    assert [(r["params"]["lr"], r["metrics"]["loss"], r["metric_non_finite"]) for r in doc["rows"]] == [
        (0.1, -1.0, {}), (0.3, None, {"loss": "nan"})]
    rows = list(csv.DictReader(io.StringIO(hpcml("farm", "results", farm, "--csv").stdout)))
    assert [(r["lr"], r["loss"]) for r in rows] == [("0.3", "nan"), ("0.1", "-1.0")]
    table = hpcml("farm", "results", farm).stdout
    assert "nan" in table and "2.0" not in table, table


RANKS = """
import os, time
from hpcml import observe
rank = int(os.environ["RANK"])
if rank == 1:
    time.sleep(0.5)                         # rank 1 writes last: its value must not win
    observe.log(step=1, val_loss=0.75)      # logged by rank 1 alone
observe.log(step=1, loss=2.4173 if rank == 0 else 2.301)
observe.flush()
"""


def test_a_task_of_several_ranks_shows_rank_0s_value_and_says_so(tmp_path):
    """A task that is an ``hpcml run`` of 2 ranks: the row shows rank 0's last loss (2.4173),
    not rank 1's written later (2.301); a metric only rank 1 logged says it is rank 1's; the
    JSON names the rule and the table says it."""
    (tmp_path / "ranks.py").write_text(RANKS)
    (tmp_path / "s.yaml").write_text(f"command: {sys.executable} -m hpcml run --ntasks 2 --no-report -- "
                                     f"{sys.executable} {tmp_path}/ranks.py\n")
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "s.yaml").returncode == 0
    p = hpcml("farm", "run", farm, "--slots", "1")
    assert p.returncode == 0, p.stderr
    doc = json.loads(hpcml("farm", "results", farm, "--json").stdout)
    jsonschema.validate(doc, schemas.load("farm.results"), cls=jsonschema.Draft202012Validator)
    row = doc["rows"][0]
    assert row["metrics"] == {"loss": 2.4173, "val_loss": 0.75} and row["metric_ranks"] == {"loss": 0, "val_loss": 1}
    assert doc["metric_rule"].startswith("rank 0's last logged value")
    table = hpcml("farm", "results", farm).stdout
    assert "2.417" in table and "2.301" not in table and "0.75 (rank 1)" in table and "rank 0's last" in table, table


SCRIPTS = Path(__file__).with_name("scripts")


def _ledger(path: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in path.read_text().splitlines():
        tid, step = map(int, line.split())
        out.setdefault(tid, []).append(step)
    return out


def _sweep(tmp_path: Path, script: str, lrs: list[float], extra: str = "") -> tuple[dict, Path]:
    ledger = tmp_path / "ledger"
    (tmp_path / "s.yaml").write_text(f"command: {sys.executable} {SCRIPTS / script} {{lr}}\n"
                                     f"product: {{lr: {json.dumps(lrs)}}}\n{extra}")
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "s.yaml").returncode == 0
    p = hpcml("farm", "run", farm, "--slots", "2", timeout=600,
              extra={"LEDGER": str(ledger), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(hpcml("farm", "results", farm, "--json").stdout)
    jsonschema.validate(doc, schemas.load("farm.results"), cls=jsonschema.Draft202012Validator)
    return doc, ledger


@pytest.mark.torch
def test_an_hf_trainer_sweep_shows_its_steps_and_the_loss_it_logged_without_a_script_change(tmp_path):
    """A sweep of an unchanged HF Trainer script: each row's steps are the script's own count
    (its ledger), with a rate, and its loss is the last one in the trainer_state.json HF wrote,
    said to come from there."""
    needs.module("transformers")
    doc, ledger = _sweep(tmp_path, "farm_hf.py", [0.001, 0.01])
    steps = _ledger(ledger)
    for row in doc["rows"]:
        assert row["state"] == "ok"
        assert row["steps"]["count"] == len(steps[row["id"]]) == 8 and row["steps"]["per_s"] > 0
        state = json.loads((tmp_path / "f" / "tasks" / str(row["id"]) / "out" / "checkpoint-8"
                            / "trainer_state.json").read_text())
        losses = [e["loss"] for e in state["log_history"] if "loss" in e]
        assert len(losses) == 4 and row["metrics"]["loss"] == losses[-1]
        assert row["metric_sources"]["loss"] == "out/checkpoint-8/trainer_state.json"
        assert row["metrics"]["learning_rate"] < row["params"]["lr"]          # HF's linear decay, as logged
        assert not {"total_flos", "train_runtime", "step"} & set(row["metrics"])
        assert [lg["kind"] for lg in row["logs"]] == ["hf_trainer"] and row["logs"][0]["step"] == 8
    table = hpcml("farm", "results", tmp_path / "f", "--sort", "loss").stdout
    assert "steps/s" in table and "trainer_state.json" in table, table


@pytest.mark.torch
def test_a_lightning_sweep_shows_its_steps_and_the_loss_from_its_csv_log(tmp_path):
    needs.module("lightning")
    doc, ledger = _sweep(tmp_path, "farm_lightning.py", [0.1, 0.01])
    steps = _ledger(ledger)
    for row in doc["rows"]:
        assert row["steps"]["count"] == len(steps[row["id"]]) == 12
        csv_path = tmp_path / "f" / "tasks" / str(row["id"]) / "lightning_logs" / "version_0" / "metrics.csv"
        last = [r for r in csv.DictReader(io.StringIO(csv_path.read_text())) if r["train_loss"]][-1]
        assert row["metrics"]["train_loss"] == float(last["train_loss"])
        assert row["metric_sources"]["train_loss"] == "lightning_logs/version_0/metrics.csv"
        assert row["logs"][0]["step"] == int(last["step"])


@pytest.mark.torch
def test_a_plain_loop_shows_its_steps_and_the_sweeps_metrics_file(tmp_path):
    """A plain torch loop writing JSON lines to the file the sweep names: steps counted by the
    optimizer hooks, the last loss from the file (text values are not metrics); with
    HPCML_RUN_OPTIMIZER_STEPS=0 in the farm's environment no step is counted."""
    doc, ledger = _sweep(tmp_path, "farm_plain.py", [0.1, 0.2], "metrics_file: out/metrics.jsonl\n")
    steps = _ledger(ledger)
    for row in doc["rows"]:
        assert row["steps"]["count"] == len(steps[row["id"]]) == 10
        lines = (tmp_path / "f" / "tasks" / str(row["id"]) / "out" / "metrics.jsonl").read_text().splitlines()
        assert row["metrics"] == {"loss": json.loads(lines[-1])["loss"]}
        assert row["metric_sources"] == {"loss": "out/metrics.jsonl"} and row["logs"][0]["step"] == 10
    off = tmp_path / "off"
    off.mkdir()
    (off / "s.yaml").write_text(f"command: {sys.executable} {SCRIPTS / 'farm_plain.py'} {{lr}}\nproduct: {{lr: [0.1]}}\n")
    assert hpcml("farm", "create", off / "f", off / "s.yaml").returncode == 0
    assert hpcml("farm", "run", off / "f", extra={"LEDGER": str(off / "ledger"),
                                                  "HPCML_RUN_OPTIMIZER_STEPS": "0"}).returncode == 0
    row = json.loads(hpcml("farm", "results", off / "f", "--json").stdout)["rows"][0]
    assert row["steps"] is None and len(_ledger(off / "ledger")[0]) == 10


@pytest.mark.torch
def test_a_torchrun_task_counts_each_ranks_own_steps(tmp_path):
    """torchrun's agent imports torch and steps nothing: its two workers each count their own
    steps (the claim is taken at a process's first step, not at its import), rank 0's shown."""
    needs.module("torch")
    ledger = tmp_path / "ledger"
    (tmp_path / "s.yaml").write_text(f"command: {sys.executable} -m torch.distributed.run --standalone "
                                     f"--nproc-per-node 2 {SCRIPTS / 'farm_plain.py'} {{lr}}\nproduct: {{lr: [0.1]}}\n")
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "s.yaml").returncode == 0
    p = hpcml("farm", "run", farm, "--slots", "1", timeout=600, extra={"LEDGER": str(ledger), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    row = json.loads(hpcml("farm", "results", farm, "--json").stdout)["rows"][0]
    assert len(_ledger(ledger)[0]) == 20                       # the two workers' own count
    assert row["steps"]["count"] == 10 and row["steps"]["rank"] == 0
    assert {f.name.split(".")[0] for f in (farm / "observe" / "0.1").iterdir()} >= {"rank-00000", "rank-00001"}


def test_a_parameter_named_steps_keeps_its_name_in_the_sort_and_the_csv(tmp_path):
    (tmp_path / "s.yaml").write_text(f"command: {sys.executable} -c 'import sys' {{steps}}\n"
                                     "product: {steps: [300, 100, 200]}\n")
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "s.yaml").returncode == 0
    assert hpcml("farm", "run", farm, "--slots", "1").returncode == 0
    doc = json.loads(hpcml("farm", "results", farm, "--json", "--sort", "steps").stdout)
    assert [r["params"]["steps"] for r in doc["rows"]] == [100, 200, 300]
    header = next(csv.reader(io.StringIO(hpcml("farm", "results", farm, "--csv").stdout)))
    assert header.count("steps") == 1 and "optimizer_steps" in header


def test_a_store_results_cannot_read_is_skipped_not_the_farm_s_results(tmp_path, monkeypatch, capsys):
    """An attempt's store that fails to read (a rank file of another program's table: an
    ArrowInvalid from read_job once) is left out, said in one line; the other stores and the
    farm's results stand."""
    import pyarrow as pa

    from hpcml.observe import store
    from hpcml.run import farmresults
    d = tmp_path / "observe"
    d.mkdir()
    sch = pa.schema([("x", pa.int64())])
    with pa.OSFile(str(d / "rank-00000.arrows"), "wb") as fh:    # what the task's own program can write
        w = pa.ipc.new_stream(fh, sch)
        w.write_batch(pa.record_batch([pa.array([1])], schema=sch))
        w.close()
    assert farmresults._series(str(d)) == {}                      # rank 0's problem: no series, no exception
    out = farmresults.AttemptResults()
    out.add_store(str(d))
    assert out.metrics == {} and out.steps is None

    def broken(_path):
        raise pa.ArrowInvalid("Schema at index 0 was different:\nx: int64")
    monkeypatch.setattr(store, "read_job", broken)
    assert farmresults._series(str(d)) is None
    err = capsys.readouterr().err
    assert f"farm results: {d}: not read: ArrowInvalid: Schema at index 0 was different: x: int64\n" in err
