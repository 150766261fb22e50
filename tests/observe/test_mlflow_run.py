"""The MLflow run's name, tags and params as the recorder builds them (no server: the
server side is tests/service/test_mlflow_local.py)."""

from __future__ import annotations

import json

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
