"""``hpcml farm results``: each task's parameters and the last values it logged through
``hpcml.observe.log`` (real tasks writing through the real API), sorted, as JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
import sys

import jsonschema

from hpcml import schemas
from tests.farm.farmtools import hpcml

TRAIN = """
import os, sys
from hpcml import observe
lr = float(sys.argv[1])
for step in range(3):
    observe.log(step=step, loss=lr * 10 - step, acc=step / 10)
"""


def test_results_table_has_params_and_last_logged_values(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "s.yaml").write_text(f"command: {sys.executable} {tmp_path}/train.py {{lr}} --bs {{bs}}\n"
                                     "product: {lr: [0.3, 0.1, 0.2], bs: [8]}\n")
    farm = tmp_path / "f"
    assert hpcml("farm", "create", farm, tmp_path / "s.yaml").returncode == 0
    p = hpcml("farm", "run", farm, "--slots", "2", extra={"HPCML_OBSERVE_FLUSH": "0.05"})
    assert p.returncode == 0, p.stderr
    doc = json.loads(hpcml("farm", "results", farm, "--json", "--sort", "loss").stdout)
    jsonschema.validate(doc, schemas.load("farm.results"), cls=jsonschema.Draft202012Validator)
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
