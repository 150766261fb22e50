"""What a test's job left running, looked for among that job's processes only.

The suite runs tests side by side (pytest-xdist, scripts/test): a scan of the whole process
table by command line would count, or kill, the processes of a test beside this one. A job
is told by its working directory (a test's ``tmp_path``; nothing in hpcml changes it) or by
its Slurm job id (``SLURM_JOB_ID`` in the environment srun gives its tasks).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def running(part: str, *, cwd: Path | None = None, job_id: str | None = None) -> list[psutil.Process]:
    """Processes other than this one whose command line holds ``part``, started in ``cwd``
    and of Slurm job ``job_id`` (where given)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid() or part not in " ".join(p.info["cmdline"] or []):
                continue
            if (cwd is None or p.cwd() == str(cwd)) and (job_id is None or p.environ().get("SLURM_JOB_ID") == job_id):
                out.append(p)
        except psutil.Error:
            continue
    return out
