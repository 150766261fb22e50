"""The documented job scripts, taken from the documentation itself and run on the local 2-node cluster.

The documentation is README.md and the pages under docs/ (each component's detail lives on
its page). Each ``#!/bin/bash`` block there is found by the command it is about and
submitted as it is, except for what a 2-node cluster of virtual nodes without GPUs cannot
have. These substitutions are the only changes, made on the text, so the documentation
cannot drift from the code:

- ``#SBATCH`` lines are dropped: the test submits 2 nodes, 1 task per node;
- the GPU protocol becomes the CPU one (``examples/vet/cpu.yaml``), ``--min-nodes`` 1, and
  ``head -n 8`` (the 8 nodes needed of 9) ``head -n 2``;
- ``python train.py`` becomes a small script that prints its rank and data directory (the
  ``hpcml run`` script runs the real DDP example instead);
- ``/scratch/$USER`` becomes the test's directory, holding a generated 300-file dataset;
- ``./pytorch.toml`` / ``pytorch.toml`` becomes an EDF whose image is the host's root
  filesystem under bubblewrap (read-only), so its Python and hpcml run inside, with the
  test's directory mounted (the container's /tmp is its own).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests import needs
from tests.slurmjobs import run_job

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slurm


TRAIN = """import os, sys
print("train rank", os.environ.get("SLURM_PROCID"), "of", os.environ.get("SLURM_NTASKS"), "data", sys.argv[1:], flush=True)
"""


def documentation() -> list[tuple[str, str]]:
    """(name, text) of README.md and of every page under docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [(str(p.relative_to(ROOT)), p.read_text()) for p in pages]


def scripts() -> dict[str, str]:
    """The documented job scripts, by the first hpcml command in them. A script shown in two
    places (README.md and its component's page) must be the same in both."""
    out: dict[str, str] = {}
    for name, text in documentation():
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            if block.startswith("#!/bin/bash"):
                m = re.search(r"^(?:srun )?(hpcml \w+)", block, re.M)
                assert m, f"{name}: {block}"
                assert out.setdefault(m.group(1), block) == block, f"{name}: another {m.group(1)} job script"
    return out


def adapt(script: str, tmp: Path) -> str:
    s = "\n".join(line for line in script.splitlines() if not line.startswith("#SBATCH"))
    s = s.replace("examples/vet/gpu-training.yaml", str(ROOT / "examples/vet/cpu.yaml"))
    s = re.sub(r"(?<![\w/])gpu-training\.yaml", str(ROOT / "examples/vet/cpu.yaml"), s)
    s = re.sub(r"--min-nodes \d+", "--min-nodes 1", s).replace("head -n 8", "head -n 2")
    s = s.replace("python train.py", f"python {tmp / 'train.py'}")
    s = s.replace("/scratch/$USER", str(tmp / "scratch"))
    s = re.sub(r"\./pytorch\.toml|(?<![\w/])pytorch\.toml", str(tmp / "pytorch.toml"), s)
    return s


@pytest.fixture
def env(slurm_env):
    return {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}


@pytest.fixture
def site(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    # the container's /tmp is its own: the test's directory is mounted in, as a site's EDF mounts $SCRATCH
    from tests.env.rootfs import host_root_edf
    host_root_edf(tmp_path / "pytorch.toml", tmp_path)
    return tmp_path


def test_the_documentation_has_the_job_scripts_this_test_runs():
    assert {"hpcml run", "hpcml vet", "hpcml data", "hpcml env"} <= set(scripts())


def test_vet_job_script_runs_the_application_on_every_good_node(env, site):
    """Issue 19: its srun line failed when every node was good (no --ntasks)."""
    out = run_job(adapt(scripts()["hpcml vet"], site), site, env, timeout=180)
    assert "vetting says abort" not in out, out
    ranks = sorted(re.findall(r"train rank (\d+) of (\d+)", out))
    assert ranks == [("0", "2"), ("1", "2")], out


def test_data_job_script_packs_stages_and_reads(env, site):
    from tests.data.gen import make_files
    make_files(site / "scratch" / "raw", 300)
    (site / "tmp").mkdir()
    (site / "ram").mkdir()                  # stands in for /dev/shm, where the doctor places a small set
    out = run_job(adapt(scripts()["hpcml data"], site), site,
                  {**env, "TMPDIR": str(site / "tmp"), "HPCML_DATA_RAM_DIR": str(site / "ram")}, timeout=300)
    lines = re.findall(r"train rank (\d+) of 2 data \[.*'([^']+)'\]", out)
    assert sorted(r for r, _ in lines) == ["0", "1"], out
    assert Path(lines[0][1]).is_relative_to(site / "ram"), out           # staged in RAM, not streamed
    assert list((site / "ram").iterdir()) == [] and list((site / "tmp").iterdir()) == [], out   # cleaned up


def test_env_job_script_runs_one_container_per_task(env, site):
    needs.tool("bwrap", what="bubblewrap")
    out = run_job(adapt(scripts()["hpcml env"], site), site, env, timeout=180)
    assert sorted(re.findall(r"train rank (\d+) of 2", out)) == ["0", "1"], out


@pytest.mark.torch
def test_run_job_script_vets_trains_and_reports(env, site):
    script = adapt(scripts()["hpcml run"], site).replace(
        f"python {site / 'train.py'}",
        f"python {ROOT / 'examples/run/train_ddp.py'} --data {site / 'data'} --samples 256 --epochs 1")
    out = run_job(script, site, env, timeout=300)
    assert "vet: continue, 2 good, 0 bad" in out, out
    jobdir = next(site.glob("hpcml-run-*"))
    assert "trained 2 steps on 2 ranks" in (jobdir / "logs" / "rank-00000.out").read_text()
    assert (jobdir / "report.html").is_file() and "html:" in out


# -- every hpcml command line of the documentation names commands and options that exist ---------

def _command_lines() -> list[str]:
    out = []
    for block in (b for _, text in documentation() for b in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S)):
        for raw in block.splitlines():
            line = raw.split(" #", 1)[0].strip()
            for part in re.split(r"\s*(?:;|&&|\|\||\|)\s*", line):
                part = re.sub(r"^(?:\w+=\S+\s+)*(?:srun(?: -\S+)*\s+|exec\s+|\S*=\$\()", "", part).strip()
                if part.startswith("hpcml "):
                    out.append(part.rstrip(")"))
    return out


def test_documented_command_lines_name_real_commands_and_options():
    """Each `hpcml ...` line of a code block of README.md or docs/: its sub-commands exist and
    every --option it uses is one of that command's (parsed, not run)."""
    import shlex

    import typer

    from hpcml.cli_app import app
    root = typer.main.get_command(app)
    lines = _command_lines()
    assert len(lines) > 15
    bad = []
    for line in lines:
        words = shlex.split(line.replace("\\", " "))[1:]
        words = words[:words.index("--")] if "--" in words else words
        cmd = root
        while hasattr(cmd, "commands") and words and words[0] in cmd.commands:
            cmd = cmd.commands[words.pop(0)]
        if hasattr(cmd, "commands"):                # a default command (vet run, scan files)
            default = getattr(cmd, "default_command", None) or next(iter(cmd.commands))
            cmd = cmd.commands.get(default, cmd)
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        unknown = [w.split("=", 1)[0] for w in words if w.startswith("-") and w.split("=", 1)[0] not in known]
        if unknown:
            bad.append(f"{line}: {unknown}")
    assert bad == [], "\n".join(bad)
