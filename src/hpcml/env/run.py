"""Run a command in a resolved environment: pick the runtime, render, prepare, run,
clean up, and return the command's exit code.

Under ``srun hpcml env run …`` each task runs this once, so each task gets its own
container and its own Slurm variables (inherited by bubblewrap, charliecloud and
enroot, forwarded by name to podman)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import replace

from hpcml.env.model import Environment, Mount
from hpcml.env.runtimes import Launch, Runtime, auto, get, installed
from hpcml.errors import HpcmlError, UsageError


class RuntimeFailed(HpcmlError):
    """A prepare step (image import, squashfuse mount) failed: the command did not run."""

    exit_code = 1


def choose(env: Environment, runtime: str = "auto", environ: Mapping[str, str] | None = None) -> Runtime:
    """The runtime to use; ``auto`` picks an installed one, a named one must be installed."""
    if not env.image:
        raise UsageError("the environment has no image", key="image")
    if runtime == "auto":
        return auto(env.image, environ)
    chosen = get(runtime)
    if not chosen.available():
        raise UsageError(f"runtime {runtime!r} is not installed here; installed: "
                         f"{', '.join(installed()) or 'none'}", key="runtime")
    return chosen


def render(env: Environment, command: list[str], runtime: str = "auto",
           environ: Mapping[str, str] | None = None) -> Launch:
    """The launch for a runtime by name (``auto``: an installed one); rendering for a
    named runtime works where it is not installed."""
    if not command:
        raise UsageError("no command given (put it after --)")
    chosen = choose(env, runtime, environ) if runtime == "auto" else get(runtime)
    return chosen.render(env, command, environ=environ)


PODMAN_FAILED = 125      # podman run: "the error is with podman itself"


def under_recorder(env: Environment, environ: Mapping[str, str]) -> Environment:
    """``hpcml observe record -- hpcml env run EDF -- python train.py``: the recorder hands
    the application a pipe (``HPCML_OBSERVE_FD``) that no container runtime carries inside,
    and a number that in the container names another file or nothing. So the container
    gets no ``HPCML_OBSERVE_FD``; it gets the job directory, bind-mounted at the same path,
    and the API there writes its own segment of the rank's stream (``rank-N.1.arrows``),
    which the store joins with the recorder's. Under ``hpcml run`` the attempt's directory
    (``HPCML_RUN_DIR``, where the Checkpointer notes a requeue) is mounted and named the
    same way, or the note lands in the container's own /tmp and the run calls a clean
    requeue "requeued by Slurm". Outside a recorder and a run: unchanged."""
    mounts, extra = list(env.mounts), dict[str, str | None]()
    run_dir = environ.get("HPCML_RUN_DIR")
    if run_dir:
        run_dir = os.path.abspath(run_dir)
        _mount(mounts, run_dir)
        extra.update(HPCML_RUN_DIR=run_dir, HPCML_RUN_ATTEMPT=environ.get("HPCML_RUN_ATTEMPT", "0"))
    job_dir = environ.get("HPCML_OBSERVE_DIR")
    if environ.get("HPCML_OBSERVE_FD") and job_dir:
        job_dir = os.path.abspath(job_dir)
        _mount(mounts, job_dir)
        extra.update(HPCML_OBSERVE_FD=None, HPCML_OBSERVE_DIR=job_dir)
    return replace(env, mounts=mounts, env={**env.env, **extra}) if extra else env


def _mount(mounts: list[Mount], path: str) -> None:
    """Bind ``path`` at the same path, once (a parent is bound before its children)."""
    if not any(m.target == path for m in mounts):
        mounts.append(Mount(path, path))


def run(env: Environment, command: list[str], runtime: str = "auto") -> int:
    """Run ``command`` in ``env``; the container command's exit code (128+N for signal N)."""
    if not command:
        raise UsageError("no command given (put it after --)")
    env = under_recorder(env, os.environ)
    launch = choose(env, runtime).render(env, command)
    environ = dict(os.environ)
    for key, value in launch.environ.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    done: list[list[str]] = []
    try:
        for step in launch.prepare:
            prepared = subprocess.run(step, capture_output=True, text=True)
            if prepared.returncode != 0:
                detail = (prepared.stderr or prepared.stdout).strip().splitlines()
                raise RuntimeFailed(f"{launch.runtime}: {' '.join(step)} failed with exit code "
                                    f"{prepared.returncode}" + (f": {detail[-1]}" if detail else ""))
            done.append(step)
        proc = subprocess.Popen(launch.argv, env=environ)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
    except FileNotFoundError as exc:
        raise RuntimeFailed(f"{launch.runtime}: cannot run {exc.filename}: not installed") from None
    finally:
        if done:
            for step in launch.cleanup:
                subprocess.run(step, capture_output=True)
    if launch.runtime == "podman" and code == PODMAN_FAILED:
        # podman's own failure (an image it cannot pull, a bad option), not the command's
        raise RuntimeFailed("podman could not start the container (its exit code 125; its message is above)")
    return 128 - code if code < 0 else code
