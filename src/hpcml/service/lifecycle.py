"""``up`` / ``down`` / ``status`` of a service and the services it depends on.

A dependency runs as an instance of its own (named after its blueprint) and is started
first unless it already runs; the service then gets its URLs (``${services.DEP.PORT}``).
``down`` stops one instance, never its dependencies (others may use them).

One ``up`` at a time per instance (``state.starting``); an instance that already runs, here
or as a Slurm job, is reported, not started twice. Ctrl-C stops what this ``up`` started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from hpcml.errors import HpcmlError, UsageError
from hpcml.service import local
from hpcml.service import state as st
from hpcml.service.resolve import with_dependencies
from hpcml.signals import handling


class Interrupted(HpcmlError):
    """Ctrl-C (or SIGTERM) while ``up`` was starting: what it started is stopped again."""

    exit_code = 130


def refuse_running(old: st.ServiceState | None) -> None:
    """A second server on the same volumes is never started: say where the first one runs."""
    if old is None:
        return
    if old.job_id and old.job_id == os.environ.get("SLURM_JOB_ID"):
        # this very service job's record: pending (no server yet) or an earlier run's (a requeue):
        # replaced, unless its server still runs here (a second up in the same job)
        if old.pid is None or old.stopped or old.node != local.here() or not local.running(old):
            return
        raise UsageError(f"{old.name} already runs in this job (pid {old.pid} on {old.node}): "
                         f"hpcml service down {old.name} first")
    if old.mode == "local" and not old.stopped and old.node and old.node != local.here():
        raise UsageError(f"{old.name} was started on {old.node} (pid {old.pid}) and not stopped: hpcml service "
                         f"down {old.name} there first (if {old.node} is gone: remove {old.directory}/service.json)")
    now = condition(old)
    if now == "pending":
        raise UsageError(f"{old.name} is already submitted (Slurm job {old.job_id}, pending): hpcml service status "
                         f"{old.name} tells when it is ready; hpcml service down {old.name} cancels it")
    if now != "stopped":
        where = f"Slurm job {old.job_id}" if old.mode == "slurm" and old.job_id else f"pid {old.pid}"
        ports = ", ".join(f"{k} {v}" for k, v in old.ports.items())
        raise UsageError(f"{old.name} already runs ({where}{', port ' + ports if ports else ''}): "
                         f"hpcml service down {old.name} first")


def up(ref: str, *, name: str | None = None, root: str | os.PathLike[str] | None = None, host: str = "127.0.0.1",
       backend: str = "auto", options: dict[str, str] | None = None, mode: str = "local",
       on_start: Callable[[st.ServiceState], None] | None = None,
       ) -> tuple[list[st.ServiceState], list[subprocess.Popen]]:
    """Start the blueprint ``ref`` (and its dependencies) and wait until each is healthy."""
    chain = with_dependencies(ref, options)
    services: dict[str, dict[str, str]] = {}
    states: list[st.ServiceState] = []
    procs: list[subprocess.Popen] = []
    current = ""
    try:
        for i, bp in enumerate(chain):
            last = i == len(chain) - 1
            directory = st.instance_dir(name if last and name else bp.name, root)
            current = f"{directory.name}'s environment"
            with st.starting(directory, wait=st.SUBMITTER_WAIT_S if mode == "slurm" and last else 0.0):
                old = st.read(directory)
                if not last and old and old.ready and local.running(old):
                    services[bp.name] = old.urls()
                    continue
                refuse_running(old)
                s, proc = local.start(bp, directory, host=host, backend=backend, services=services, mode=mode,
                                      options=options if last else None)
                states.append(s)
                procs.append(proc)
                current = f"{s.name} (pid {s.pid})"
                if on_start:
                    on_start(s)
                states[-1] = s = local.wait_ready(bp, s, proc)
                services[bp.name] = s.urls()
    except KeyboardInterrupt:
        for s, proc in reversed(list(zip(states, procs))):
            local.stop(s, proc=proc)
        stopped = ", ".join(s.name for s in states)
        raise Interrupted(f"interrupted while starting {current}: "
                          + (f"stopped {stopped} again" if stopped else "nothing was started")) from None
    return states, procs


def serve(ref: str, **kw) -> int:
    """Start like ``up`` and stay in the foreground until the service exits or this process
    is told to stop (SIGTERM from ``scancel``, SIGINT): the body of a Slurm service job."""
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    with handling((signal.SIGTERM, signal.SIGINT), on_signal):
        states, procs = up(ref, **kw)
        try:
            while not stopping and procs[-1].poll() is None:
                time.sleep(0.2)
        finally:
            for s, proc in reversed(list(zip(states, procs))):
                local.stop(s, proc=proc)
    return 0 if stopping else (procs[-1].returncode or 0)


def find(name: str, root: str | os.PathLike[str] | None = None) -> st.ServiceState:
    s = st.read(st.instance_dir(name, root))
    if s is None:
        known = ", ".join(x.name for x in st.instances(root)) or "none"
        raise UsageError(f"no service instance called '{name}' in {st.state_root(root)} (known: {known})")
    return s


def condition(s: st.ServiceState) -> str:
    """``running``, ``stopped``, or for a Slurm instance also ``pending`` (its job queued:
    recorded at submission, so ``status`` shows it and ``down`` cancels it) and
    ``starting`` (the job runs, its service is not ready yet)."""
    if s.mode == "slurm" and s.job_id:
        from hpcml.cluster import slurm
        state = None if s.stopped else slurm.job_state(s.job_id)
        if state not in slurm.ALIVE:
            return "stopped"
        return "pending" if state == "PENDING" else "running" if s.ready else "starting"
    return "running" if local.running(s) else "stopped"


def is_up(s: st.ServiceState) -> bool:
    return condition(s) != "stopped"


def down(name: str, root: str | os.PathLike[str] | None = None) -> tuple[st.ServiceState, str | None]:
    """Stop the instance ``name``; its volumes stay. A local instance is signalled only while
    its pid is still the service; otherwise nothing is, and the second value says why."""
    s = find(name, root)
    if s.mode == "slurm" and s.job_id:
        from hpcml.cluster.slurm import cancel
        cancel(s.job_id)
        s = find(name, root)
        s.stopped, s.ready = True, False
        st.write(s)
        return s, None
    if s.node and s.node != local.here() and not s.stopped:
        raise UsageError(f"{name} runs on {s.node}, not here: run hpcml service down {name} there")
    return s, local.stop(s)


def status(root: str | os.PathLike[str] | None = None) -> list[dict]:
    return [row for row, _ in conditions(root)]


def conditions(root: str | os.PathLike[str] | None = None) -> list[tuple[dict, str]]:
    """Each instance's ``status`` row and its ``condition`` (one Slurm query each)."""
    out = []
    for s in st.instances(root):
        now = condition(s)
        out.append(({**s.to_json(), "running": now != "stopped"}, now))
    return out


def log_path(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    return find(name, root).log
