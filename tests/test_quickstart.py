"""The quickstart of README.md and docs/run.md, run as written (issue 70): in a directory
holding a user's ``train.py`` (plain torch DDP over gloo, nothing of hpcml in it), its
``hpcml`` lines on this machine and its ``sbatch`` line on the local 2-node cluster.

The first two lines (make a venv, install hpcml and torch into it, activate it) are what
``scripts/test`` did for this suite's own venv: they are replaced by this venv's ``bin`` at
the head of ``PATH``, the only change; every other line runs as the page shows it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- quickstart:"
TRAIN = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    opt.zero_grad()
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    opt.step()
print(f"rank {dist.get_rank()} of {dist.get_world_size()} done, loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
"""


def quickstart() -> list[str]:
    """The quickstart's lines, the same on both pages, without their comments."""
    blocks = []
    for page in (ROOT / "README.md", ROOT / "docs" / "run.md"):
        text = page.read_text()
        assert MARK in text, f"{page.name}: no quickstart"
        block = re.search(r"```bash\n(.*?)```", text[text.index(MARK):], re.S)
        assert block, page.name
        blocks.append(block.group(1))
    assert blocks[0] == blocks[1], "README.md's and docs/run.md's quickstarts differ"
    return [line.split("   #")[0].rstrip() for line in blocks[0].splitlines() if line.strip()]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return {**env, **(extra or {})}


def test_the_quickstart_installs_then_runs_reports_and_submits():
    lines = quickstart()
    assert lines[0].startswith("python3 -m venv .venv && .venv/bin/pip install ./hpcml") and lines[1] == ". .venv/bin/activate"
    assert [ln.split()[0] for ln in lines[2:]] == ["hpcml", "hpcml", "sbatch"], lines


@pytest.mark.torch
def test_the_quickstart_runs_a_users_script_and_reports_it(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    run, report = quickstart()[2:4]
    p = subprocess.run(run, shell=True, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "did: 5 steps" in p.stdout and "html:" in p.stdout, p.stdout
    (job,) = tmp_path.glob("hpcml-run-local-*")
    assert "rank 1 of 2 done" in (job / "logs" / "rank-00001.out").read_text()
    again = subprocess.run(report, shell=True, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "did: 5 steps" in again.stdout and f"html: {job.name}/report.html" in again.stdout, \
        again.stdout + again.stderr


@pytest.mark.slurm
@pytest.mark.torch
def test_the_quickstarts_sbatch_line_runs_on_two_nodes(slurm_env, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    line = quickstart()[4]
    env = _env({**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"})
    p = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    job = re.search(r"Submitted batch job (\d+)", p.stdout)
    assert job, p.stdout
    from tests.slurmjobs import wait
    wait(job.group(1), env, timeout=300)
    out = (tmp_path / f"slurm-{job.group(1)}.out").read_text()
    assert "did: 5 steps" in out, out
    logs = tmp_path / f"hpcml-run-{job.group(1)}" / "logs"
    assert "rank 1 of 2 done" in (logs / "rank-00001.out").read_text()
