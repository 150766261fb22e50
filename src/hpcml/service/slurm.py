"""``hpcml service up --slurm``: the service as a long-running Slurm job.

The job runs ``python -m hpcml service up BLUEPRINT --foreground`` on its node, which
starts the service there exactly as on this machine (free ports, bound to the node's
loopback) and writes its state to the instance directory (shared storage); ``scancel``
(``down``) stops it. The submitting side waits for the state to say ready and prints how
to reach it: the node, the port, and an SSH tunnel through the login node to the node's
loopback (``ssh -J``), so nothing listens on the cluster's network.
"""

from __future__ import annotations

import math
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from hpcml import logs
from hpcml.cluster import slurm
from hpcml.errors import HpcmlError
from hpcml.files import write_atomic
from hpcml.service import state as st
from hpcml.service.blueprint import Blueprint
from hpcml.service.envs import build_note, is_built
from hpcml.service.local import tail_lines

log = logs.get(__name__)


class ServiceJobFailed(HpcmlError):
    """The service job ended before its service was ready."""


class ServiceNotReady(HpcmlError):
    """``--wait`` ran out: the job stays queued (or starting), recorded, for ``status``/``down``."""


def script(bp: Blueprint, ref: str, name: str, root: Path, *, options: dict[str, str], backend: str) -> str:
    argv = [sys.executable, "-m", "hpcml", "service", "up", ref, "--foreground", "--name", name,
            "--state-dir", str(root), "--backend", backend]
    for key, value in options.items():
        argv += ["--set", f"{key}={value}"]
    return "#!/bin/bash\n" + f"exec {shlex.join(argv)}\n"


def sbatch_argv(bp: Blueprint, name: str, directory: Path, *, time_limit: str | None, partition: str | None,
                nodelist: str | None, gpus: int | None) -> list[str]:
    # --output is a filename pattern: a '%' of the directory's own name is written '%%'
    argv = ["sbatch", "--parsable", f"--job-name=hpcml-service-{name}", "--nodes=1", "--ntasks=1",
            f"--cpus-per-task={max(1, math.ceil(bp.resources.cpu))}", f"--time={time_limit or bp.slurm.time}",
            f"--output={str(directory).replace('%', '%%')}/slurm-%j.out", f"--chdir={directory}"]
    partition = partition or bp.slurm.partition
    if partition:
        argv.append(f"--partition={partition}")
    if nodelist:
        argv.append(f"--nodelist={nodelist}")
    n_gpus = bp.resources.gpus if gpus is None else gpus
    if n_gpus:
        argv.append(f"--gpus={n_gpus}")
    return argv


def submit(bp: Blueprint, ref: str, name: str, root: Path, *, options: dict[str, str], backend: str = "auto",
           time_limit: str | None = None, partition: str | None = None, nodelist: str | None = None,
           gpus: int | None = None, wait: float = 300.0) -> st.ServiceState:
    """Submit the service job and wait (up to ``wait`` s) until its service is ready. The
    job is recorded (pending) as soon as it is submitted, under the instance's lock, so a
    second ``up`` at the same time finds it instead of submitting another."""
    from hpcml.service.lifecycle import Interrupted, refuse_running
    # absolute: the job runs with --chdir into the instance directory, where a relative
    # state dir would name another one (state/web/state/web) the submitter never reads
    root = Path(root).absolute()
    directory = st.instance_dir(name, root)
    with st.starting(directory):
        refuse_running(st.read(directory))
        if backend in ("auto", "process") and bp.python is not None and not bp.python.own \
                and not is_built(bp.name, bp.python.packages):
            log.info(f"hpcml service: {build_note(bp.name, bp.python.packages, 'the service job first builds')} "
                  f"(up waits {wait:g} s: hpcml service status {name} tells when it is ready)")
        path = directory / "job.sh"
        write_atomic(path, script(bp, ref, name, root, options=options, backend=backend))
        argv = sbatch_argv(bp, name, directory, time_limit=time_limit, partition=partition, nodelist=nodelist,
                           gpus=gpus)
        job_id = slurm.run([*argv, str(path)]).stdout.strip().split(";")[0]
        pending = st.ServiceState(name=name, blueprint=bp.source, mode="slurm", backend=backend,
                                  directory=str(directory), job_id=job_id, started=time.time())
        current = st.read(directory)
        if current is None or current.job_id != job_id:     # the job itself may have written it already
            st.write(pending)
    try:
        return _wait(directory, name, job_id, wait)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while waiting: Slurm job {job_id} was submitted and is still starting "
                          f"(hpcml service status {name}; hpcml service down {name} cancels it)") from None


def _wait(directory: Path, name: str, job_id: str, wait: float) -> st.ServiceState:
    """The job's state once its service is ready; ``ServiceJobFailed`` if the job ends first,
    ``ServiceNotReady`` (one line: the job, how to follow or cancel it) when ``wait`` runs out."""
    deadline = time.monotonic() + wait
    state: str | None = None
    while True:
        s = st.read(directory)
        if s is not None and s.job_id == job_id and s.ready:
            return s
        state = slurm.job_state(job_id)
        if state is not None and state not in slurm.ALIVE:      # None: Slurm cannot say now; ask again
            out = directory / f"slurm-{job_id}.out"
            last = tail_lines(out, 1)         # from the end: a job's output may be GBs
            raise ServiceJobFailed(f"service job {job_id} ended ({state or 'gone'}) before {name} was ready"
                                   + (f": {last[0]}" if last else f" (see {out})"))
        if time.monotonic() >= deadline:
            break
        time.sleep(0.3)
    where = f"is still {state.lower()}" if state else "is of unknown state (Slurm did not answer)"
    raise ServiceNotReady(f"{name} not ready after {wait:g} s: Slurm job {job_id} {where} and stays submitted "
                          f"(hpcml service status {name} tells when it is ready; hpcml service down {name} "
                          "cancels it)")


def tunnel(s: st.ServiceState, login: str | None = None) -> str:
    """How to reach the service from a laptop: an SSH tunnel to the node's loopback."""
    login = login or os.environ.get("HPCML_LOGIN_HOST") or socket.getfqdn()
    port = next(iter(s.ports.values()), 0)
    return f"ssh -J {login} -N -L {port}:127.0.0.1:{port} {s.node}"
