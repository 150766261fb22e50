"""``hpcml service up``, ``down``, ``status`` and ``logs``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from hpcml.schemas import tag
from hpcml.service.cli.options import JSON, SET, STATE_DIR, parse_set


def _describe(s, slurm: bool = False) -> None:
    for port, url in s.urls().items():
        print(f"{s.name}: {port} {url}" + (f"  (ready after {s.ready_after_s:g} s)" if s.ready_after_s else ""))
    if s.token_file:
        print(f"  token: {s.token_file}")
    if slurm:
        from hpcml.service.slurm import tunnel
        print(f"  job {s.job_id} on node {s.node}; tunnel: {tunnel(s)}")


def up(
    blueprint: str = typer.Argument(..., help="A blueprint: a NAME from the catalogue or a path to a .yaml file."),
    name: Optional[str] = typer.Option(None, "--name", help="The instance's name (default: the blueprint's)."),
    options: Optional[list[str]] = SET,
    bind: str = typer.Option("127.0.0.1", "--bind", help="The address to listen on; anything but loopback needs "
                                                         "the service's own auth or a generated token."),
    backend: str = typer.Option("auto", "--backend", help="process (its own venv), container (hpcml env), or auto."),
    state_dir: Optional[Path] = STATE_DIR,
    slurm: bool = typer.Option(False, "--slurm", help="Run it as a long-running Slurm job."),
    time_limit: Optional[str] = typer.Option(None, "--time", help="--slurm: the job's time limit (default: the blueprint's)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="--slurm: the partition."),
    nodelist: Optional[str] = typer.Option(None, "--nodelist", help="--slurm: the node(s) to run on."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="--slurm: GPUs to request (default: the blueprint's)."),
    wait: float = typer.Option(300.0, "--wait", help="--slurm: seconds to wait for the job's service to be ready."),
    foreground: bool = typer.Option(False, "--foreground", help="Stay until the service exits or a signal stops it "
                                                                "(what a Slurm service job runs)."),
    as_json: bool = JSON,
) -> None:
    """Start a service (and what it depends on) and wait until its health check answers.

        hpcml service up mlflow                       # a venv with MLflow, state survives down/up
        hpcml service up mlflow --slurm --time 8:00:00

    State (volumes, log, service.json) lives under --state-dir/NAME. The venv of a Python
    service is built once (minutes, about 1 GB) and cached in $HPCML_CACHE_DIR/service-envs
    (default ~/.cache/hpcml/service-envs; $HPCML_SERVICE_ENVS names the directory itself).

    Exit codes: 0 ready, 1 the service failed or did not become healthy, 2 bad blueprint or option.
    """
    from hpcml.service import lifecycle
    from hpcml.service import state as st
    sets = parse_set(options)
    if slurm:
        from hpcml.service import slurm as service_slurm
        from hpcml.service.catalogue import find
        from hpcml.service.resolve import with_dependencies
        chain = with_dependencies(blueprint, sets)
        ref = str(find(blueprint).resolve())
        s = service_slurm.submit(chain[-1], ref, name or chain[-1].name, st.state_root(state_dir), options=sets,
                                 backend=backend, time_limit=time_limit, partition=partition, nodelist=nodelist,
                                 gpus=gpus, wait=wait)
        if as_json:              # ready: a wait that ran out is ServiceNotReady, one line, exit 1
            print(json.dumps(s.to_json(), indent=2))
        else:
            _describe(s, slurm=True)
        return
    if foreground:
        import os
        mode = "slurm" if os.environ.get("SLURM_JOB_ID") else "local"
        raise typer.Exit(lifecycle.serve(blueprint, name=name, root=state_dir, host=bind, backend=backend,
                                         options=sets, mode=mode))
    states, _ = lifecycle.up(blueprint, name=name, root=state_dir, host=bind, backend=backend, options=sets)
    if as_json:
        print(json.dumps([s.to_json() for s in states], indent=2))
        return
    for s in states:
        _describe(s)


def down(name: str = typer.Argument(..., help="The instance's name (see hpcml service status)."),
         state_dir: Optional[Path] = STATE_DIR) -> None:
    """Stop a service (its Slurm job with --slurm); its volumes stay for the next up.

        hpcml service down mlflow
    """
    from hpcml.service import lifecycle
    s, problem = lifecycle.down(name, state_dir)
    if problem:
        print(f"{s.name}: nothing signalled: {problem}; marked stopped", file=sys.stderr)
        return
    print(f"{s.name}: stopped" + (f" (job {s.job_id} cancelled)" if s.job_id else ""))


def status(name: Optional[str] = typer.Argument(None, help="One instance (default: all)."),
           state_dir: Optional[Path] = STATE_DIR, as_json: bool = JSON) -> None:
    """Show the service instances: running or not, where, on which ports.

        hpcml service status
        hpcml service status mlflow --json
    """
    from hpcml.service import lifecycle
    found = [(r, now) for r, now in lifecycle.conditions(state_dir) if name is None or r["name"] == name]
    if name is not None and not found:
        lifecycle.find(name, state_dir)          # the one-line error naming the known ones
    if as_json:
        print(json.dumps({"schema": tag("service.status", 1), "services": [r for r, _ in found]}, indent=2))
        return
    for r, now in found:
        where = f"pid {r['pid']}" if r["mode"] != "slurm" else \
            f"job {r['job_id']}" + (f" on {r['node']}" if r["node"] else "")
        urls = " ".join(r["urls"].values())
        print(f"{r['name']:<14} {now:<8} {where:<22} {urls}")


def logs(name: str = typer.Argument(..., help="The instance's name."),
         lines: int = typer.Option(50, "-n", "--lines", help="How many of the last lines to print (0: all)."),
         state_dir: Optional[Path] = STATE_DIR) -> None:
    """Print the end of a service's log.

        hpcml service logs mlflow -n 100

    Exit codes: 0 printed, 1 no log yet (a Slurm instance still pending), 2 no such instance.
    """
    import shutil

    from hpcml.errors import HpcmlError, UsageError
    from hpcml.service import lifecycle
    if lines < 0:                       # here, not typer's min=: its refusal is a box, not one line
        raise UsageError(f"must be at least 0, got {lines}", key="--lines")
    s = lifecycle.find(name, state_dir)
    try:
        with open(s.log, "rb") as f:
            if not lines:
                shutil.copyfileobj(f, sys.stdout.buffer)
                return
            size = f.seek(0, 2)
            f.seek(max(0, size - max(lines * 1024, 1 << 16)))   # the tail only: a log may be GBs
            text = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        why = ""
        if s.mode == "slurm" and s.job_id:
            from hpcml.cluster import slurm
            state = slurm.job_state(s.job_id)
            why = f": Slurm job {s.job_id} is " + (state.lower() if state else
                                                   "no longer queued" if state == "" else "of unknown state")
        raise HpcmlError(f"{name} has no log yet{why} (it will be {s.log})") from None
    sys.stdout.write("\n".join(text[-lines:]) + "\n")
