"""The MLflow run's name, tags and params as the recorder builds them (no server: the
server side is tests/service/test_mlflow_local.py)."""

from __future__ import annotations

import json
import sys

from hpcml.observe.mlflow_run import MAX_PARAM_VALUE, describe


def test_a_requeued_hpcml_run_attempt_is_named_by_job_and_attempt_and_tags_the_job_directory(tmp_path):
    job = tmp_path / "hpcml-run-77"
    env = {"HPCML_RUN_DIR": str(job / "attempts" / "2"), "HPCML_RUN_ATTEMPT": "2", "SLURM_RESTART_COUNT": "2"}
    meta = describe(["python", "train.py", "--lr", "0.1 x"], job / "attempts" / "2" / "observe", "77", "n[1-2]", env)
    assert meta.name == "77-a2" and meta.params == {}
    assert meta.tags["hpcml.job_dir"] == str(job) and meta.tags["hpcml.command"] == "python train.py --lr '0.1 x'"
    local = describe(["python"], tmp_path / "obs", "local", "vm", {})
    assert local.name == "obs-a0" and local.tags["hpcml.job_dir"] == str(tmp_path / "obs")


def test_a_farm_task_s_parameters_are_valid_mlflow_params_and_a_damaged_task_file_is_said(tmp_path):
    farm = tmp_path / "f"
    farm.mkdir()
    lines = [{"schema": "hpcml.farm.task/1", "id": 0, "command": "x", "params": {"lr": 1}},
             {"schema": "hpcml.farm.task/1", "id": 3, "command": "x",
              "params": {"model/name": "a", "layers": [1, 2], "prompt": "p" * 9000}}]
    (farm / "tasks.jsonl").write_text("not json\n" + "".join(json.dumps(d) + "\n" for d in lines))
    env = {"HPCML_FARM_DIR": str(farm), "HPCML_FARM_TASK_ID": "3", "HPCML_FARM_ATTEMPT": "2"}
    meta = describe(["x"], tmp_path / "obs", "local", "vm", env)
    assert meta.name == "f-task3.2" and meta.tags["hpcml.farm.task"] == "3"
    second = describe(["x"], farm / "runs" / "3.2-1" / "observe", "local", "vm",
                      {**env, "HPCML_RUN_DIR": str(farm / "runs" / "3.2-1"), "HPCML_RUN_ATTEMPT": "0"})
    assert second.name == "f-task3.2-1"            # the attempt's second hpcml run
    assert meta.params["model_name"] == "a" and meta.params["layers"] == "[1, 2]"
    assert len(meta.params["prompt"]) == MAX_PARAM_VALUE
    (farm / "tasks.jsonl").unlink()
    (farm / "tasks.jsonl").mkdir()
    meta = describe(["x"], tmp_path / "obs", "local", "vm", env)
    assert meta.params == {} and "tasks.jsonl" in meta.problems[0] and "a directory" in meta.problems[0]


def test_hpcml_run_to_an_mlflow_address_where_nothing_listens_says_so_and_counts_every_dropped_metric(tmp_path):
    """Was: ``hpcml run --mlflow`` at a wrong address exited 0 and said nothing anywhere. Now
    the recorder's probe warns once naming the URL, and the run's report (its terminal
    summary, JSON and HTML) says the server was unreachable and how many metrics were lost."""

    from hpcml.ports import free_port
    from hpcml.run.jobdir import log_path
    from tests.run.test_local_run import hpcml, valid
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"      # free a moment ago: nothing listens there now
    (tmp_path / "train.py").write_text("from hpcml.observe import api\nfor s in range(20): api.log(step=s, loss=1.0)\n"
                                       "api.flush()\n")
    out = hpcml("run", "--ntasks", "1", "--dir", "job", "--mlflow", url, "--", sys.executable, "train.py",
                cwd=tmp_path)
    said = f"mlflow: unreachable at {url}, 20 metrics dropped"
    assert out.returncode == 0 and said in out.stdout, out.stdout + out.stderr
    warnings = [line for line in log_path(tmp_path / "job", 0, "err").read_text().splitlines() if "MLflow" in line]
    assert len(warnings) == 1 and url in warnings[0] and "refused" in warnings[0], warnings
    rep = valid(json.loads(hpcml("report", "job", "--json", cwd=tmp_path).stdout), "run.report")
    assert rep["mlflow"]["dropped"] == 20 and rep["mlflow"]["sent"] == 0
    assert any(f["kind"] == "mlflow_dropped" and "Connection refused" in f["advice"] for f in rep["findings"])
    assert said.removeprefix("mlflow: ") in (tmp_path / "job" / "report.html").read_text()
