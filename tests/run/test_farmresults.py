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
