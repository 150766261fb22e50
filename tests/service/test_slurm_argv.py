"""``hpcml.service.slurm.sbatch_argv``: the sbatch command line of a service job.

The unit tests read the argv; the last one gives it to the local cluster's real sbatch,
so what Slurm makes of the options (``--output`` is a filename pattern) is Slurm's word.
"""

from __future__ import annotations

import subprocess

from hpcml.service import catalogue
from hpcml.service.blueprint import load
from hpcml.service.slurm import sbatch_argv
from tests.slurmjobs import wait


def mlflow():
    return load(catalogue.find("mlflow"))


def options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def test_the_blueprint_s_resources_and_the_flags_that_override_them(tmp_path):
    bp = mlflow()
    base = options(sbatch_argv(bp, "ml", tmp_path, time_limit=None, partition=None, nodelist=None, gpus=None))
    assert base["job-name"] == "hpcml-service-ml" and base["nodes"] == base["ntasks"] == "1"
    assert base["time"] == bp.slurm.time and int(base["cpus-per-task"]) >= 1
    assert base["chdir"] == str(tmp_path) and base["output"] == f"{tmp_path}/slurm-%j.out"
    assert ("gpus" in base) == bool(bp.resources.gpus)
    over = options(sbatch_argv(bp, "ml", tmp_path, time_limit="00:10:00", partition="debug", nodelist="n2", gpus=2))
    assert (over["time"], over["partition"], over["nodelist"], over["gpus"]) == ("00:10:00", "debug", "n2", "2")
    assert "gpus" not in options(sbatch_argv(bp, "ml", tmp_path, time_limit=None, partition=None, nodelist=None,
                                             gpus=0))


def test_hostile_values_stay_one_argument_each(tmp_path):
    """No shell: a value with spaces, quotes or ``;`` is one argv element, never two options."""
    argv = sbatch_argv(mlflow(), "ml", tmp_path / "a b;rm -rf ~", time_limit="1:00 --wrap=id",
                       partition="p'q", nodelist=None, gpus=None)
    assert "--time=1:00 --wrap=id" in argv and "--partition=p'q" in argv
    assert not any(a.startswith("--wrap") for a in argv)


def test_a_percent_in_the_directory_reaches_real_sbatch_literally(tmp_path, slurm_cluster, slurm_env):
    """sbatch expands %j, %u, ... in --output: a directory named ``run%j`` must stay that."""
    directory = tmp_path / "run%j 50%"
    directory.mkdir()
    script = directory / "job.sh"
    script.write_text("#!/bin/sh\necho service-output\n")
    argv = sbatch_argv(mlflow(), "pct", directory, time_limit="00:05:00", partition=None, nodelist=None, gpus=0)
    argv = [a for a in argv if not a.startswith("--cpus-per-task")] + ["--cpus-per-task=1", str(script)]
    job = subprocess.run(argv, capture_output=True, text=True, env=slurm_env, timeout=30,
                         check=True).stdout.strip().split(";")[0]
    wait(job, slurm_env)
    assert (directory / f"slurm-{job}.out").read_text().strip() == "service-output"
