"""Submitting batch jobs to the local cluster and waiting for them, with bounded polls
(``sbatch --wait`` polls slowly and adds up to 10 s)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpcml.testing.localslurm import LocalSlurm


def submit(script: str, workdir: Path, env: dict[str, str], nodes: int = 2,
           tasks_per_node: int = 1, extra: tuple[str, ...] = ()) -> str:
    """``extra``: more sbatch options (``-w n[1-3]``, ``--no-kill``)."""
    path = workdir / "job.sh"
    path.write_text(script)
    out = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}",
                          f"--output={workdir}/job.out", f"--chdir={workdir}", *extra, str(path)],
                         capture_output=True, text=True, env=env, timeout=30, check=True)
    return out.stdout.strip().split(";")[0]


def wait(job_id: str, env: dict[str, str], timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                           text=True, env=env, timeout=10)
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(0.2)
    subprocess.run(["scancel", job_id], env=env, timeout=10)
    raise TimeoutError(f"job {job_id} still queued or running after {timeout} s")


def job_processes(job_id: str, part: str) -> list[int]:
    """The live processes of Slurm job ``job_id`` whose command line holds ``part``
    (``tests.leftovers``). ``python -m tests.slurmjobs JOB PART`` prints their count."""
    import psutil

    from tests.leftovers import running
    out = []
    for p in running(part, job_id=job_id):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def run_job(script: str, workdir: Path, env: dict[str, str], timeout: float = 120.0,
            tasks_per_node: int = 1) -> str:
    wait(submit(script, workdir, env, tasks_per_node=tasks_per_node), env, timeout)
    return (workdir / "job.out").read_text()


@contextmanager
def own_cluster(name: str, offset: int, **options: Any) -> Iterator[LocalSlurm]:
    """A started LocalSlurm on a root and ports of its own (the suite's, suffixed and shifted)."""
    port = int(os.environ.get("HPCML_SLURM_PORT", "6917")) + offset
    root = Path(os.environ.get("HPCML_SLURM_ROOT", "/tmp/hpcml-slurm") + f"-{name}")
    cluster = LocalSlurm(root, ctld_port=port, first_slurmd_port=port + 4, **options)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":
    import sys
    print(len(job_processes(sys.argv[1], sys.argv[2])))
