"""``hpcml service up`` on this machine: start, wait until healthy, stop.

The service runs in its own session (``setsid``), so ``down`` stops its whole process
group (MLflow alone is ~10 processes: uvicorn workers, a job runner). Ports are free ones
(the previous ones again when still free, so URLs survive ``down``/``up``), bound to
127.0.0.1 unless ``bind`` says otherwise; binding elsewhere needs the service's own auth or
a token hpcml generates (the blueprint's ``auth``), and is refused for a service with none.

``service.json`` can be edited and a pid is reused once its process ended, so the pid it
holds is signalled only while that process is still the service: the node, the start time
and the command line recorded at start must all match (``identity_problem``).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from hpcml.errors import HpcmlError, UsageError
from hpcml.files import inside
from hpcml.files import tail_lines as tail_text
from hpcml.ports import free_port, port_free
from hpcml.proctree import start_time, stop_group
from hpcml.service import state as st
from hpcml.service.backends import choose
from hpcml.service.blueprint import Blueprint
from hpcml.service.checks import check_file_key
from hpcml.service.placeholders import Place, expand
from hpcml.words import printable


class ServiceFailed(HpcmlError):
    """The service exited, or did not answer its health check in time."""


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"



def choose_ports(bp: Blueprint, host: str, previous: dict[str, int]) -> dict[str, int]:
    ports: dict[str, int] = {}
    for p in bp.ports:
        old = previous.get(p.name)
        ports[p.name] = old if old and port_free(host, old) else free_port(host)
    return ports


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def here() -> str:
    """This node's name as Slurm and ``service.json`` know it."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def identity_problem(s: st.ServiceState) -> str | None:
    """Why the process ``s.pid`` is not this service (None when it is): it runs on another
    node, it started at another time (a reused pid) or runs another command (an edited file),
    or ``service.json`` records no identity to check."""
    if s.node and s.node != here():
        return f"it runs on {s.node}, not here ({here()})"
    if s.pid is None or s.pid_started is None or not s.cmdline:
        return f"service.json records no start time and command line for pid {s.pid} to check"
    started = start_time(s.pid)
    if started is None:
        return None                      # gone: nothing to signal, nothing to mistake
    if abs(started - s.pid_started) > 0.05:
        return f"pid {s.pid} is a later process (started {time.ctime(started)}, the service {time.ctime(s.pid_started)})"
    if _cmdline(s.pid) != s.cmdline:
        return f"pid {s.pid} runs {' '.join(_cmdline(s.pid))[:120]!r}, not the service"
    return None


def running(s: st.ServiceState) -> bool:
    """The service's process still runs: its pid is alive (a zombie is dead: PID 1 reaps
    slowly here) and is still the process that was started (``identity_problem``)."""
    if s.pid is None or s.stopped or start_time(s.pid) is None:
        return False
    return identity_problem(s) is None


def _identify(s: st.ServiceState) -> None:
    """Record the identity ``down`` checks: the process's start time and command line."""
    if s.pid is not None:
        s.pid_started, s.cmdline = start_time(s.pid), _cmdline(s.pid)


def _file_target(bp: Blueprint, directory: Path, i: int, name: str, key: str) -> Path:
    """Where the file ``key`` of ``files[i]`` goes: a file name (a ConfigMap key's rule, as in
    Kubernetes), never a path such as ``../../x`` or ``/tmp/x``; refused before anything runs."""
    check_file_key(bp, i, key)
    return _under(directory, "files", name, key)


def _under(directory: Path, *parts: str) -> Path:
    """``directory/parts`` if it resolves inside ``directory`` (a symlink placed there must
    not send a blueprint's file elsewhere), else one line, exit 2."""
    try:
        return inside(directory, Path(*parts))
    except ValueError as exc:
        raise UsageError(f"{'/'.join(parts)} {exc}", file=str(directory)) from None


def healthy(bp: Blueprint, host: str, ports: dict[str, int], timeout: float = 2.0) -> bool:
    """The health check answers now: HTTP 2xx/3xx on its path, or the port accepts."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    port = ports[bp.health.port]
    if bp.health.http is None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{bp.health.http}", timeout=timeout) as r:
            return 200 <= r.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _secrets_env(bp: Blueprint) -> dict[str, str]:
    """Secrets locally come from the caller's environment, by the variable's name."""
    out = {}
    for i, s in enumerate(bp.secrets):
        if s.env in os.environ:
            out[s.env] = os.environ[s.env]
        elif not s.optional:
            raise UsageError(f"secret {s.secret}/{s.key}: set {s.env} in the environment to run it here",
                             file=bp.source or None, key=f"secrets[{i}]")
    return out


def _auth_env(bp: Blueprint, host: str, directory: Path) -> tuple[dict[str, str], str | None]:
    if _loopback(host):
        return {}, None
    if bp.auth.kind == "none":
        raise UsageError(f"{bp.name} has no authentication of its own: it binds 127.0.0.1 only "
                         "(reach it through an SSH tunnel)", key="bind")
    if bp.auth.kind == "service":
        return {}, None
    token_file = _under(directory, "token")
    if not token_file.exists():
        token_file.touch(mode=0o600)
        token_file.write_text(secrets.token_urlsafe(32))
    assert bp.auth.env is not None
    return {bp.auth.env: token_file.read_text().strip()}, str(token_file)


def start(bp: Blueprint, directory: Path, *, host: str = "127.0.0.1", backend: str = "auto",
          services: dict[str, dict[str, str]] | None = None, mode: str = "local",
          options: dict[str, str] | None = None) -> tuple[st.ServiceState, subprocess.Popen]:
    """Start ``bp`` with its state in ``directory``; returns at once (see ``wait_ready``)."""
    chosen = choose(bp, backend)
    directory.mkdir(parents=True, exist_ok=True)
    old = st.read(directory)
    log = _under(directory, "service.log")
    volumes = {v.name: str(_under(directory, "volumes", v.name)) for v in bp.volumes}
    files = {f.name: str(_under(directory, "files", f.name)) for f in bp.files}
    targets = {(f.name, key): _file_target(bp, directory, i, f.name, key)
               for i, f in enumerate(bp.files) for key in f.content}
    chosen.prepare(bp, log)
    ports = choose_ports(bp, host, old.ports if old else {})
    for d in volumes.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    ex = expand(bp, Place(host=host, ports=ports, volumes=volumes, files=files, services=services or {}))
    for name, content in ex.files.items():
        Path(files[name]).mkdir(parents=True, exist_ok=True)
        for fname, text in content.items():
            targets[name, fname].write_text(text, encoding="utf-8")
    auth_env, token_file = _auth_env(bp, host, directory)
    mounts = {**{volumes[v.name]: v.mount for v in bp.volumes}, **{files[f.name]: f.mount for f in bp.files}}
    launch = chosen.launch(bp, ex, mounts)
    environ = {**os.environ, **launch.env, **_secrets_env(bp), **auth_env}
    with open(log, "ab") as out:
        out.write(f"\n== hpcml service up {bp.name} {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(launch.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(launch.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=environ, cwd=directory, start_new_session=True)
    s = st.ServiceState(name=directory.name, blueprint=bp.source, mode=mode, backend=chosen.name,
                        directory=str(directory), host=host, ports=ports, pid=proc.pid, pgid=proc.pid,
                        started=time.time(), options=options or {}, token_file=token_file,
                        node=here(),
                        job_id=os.environ.get("SLURM_JOB_ID") if mode == "slurm" else None)
    _identify(s)
    st.write(s)
    return s, proc


#: the bytes read from a log's end for the lines an error quotes: service.log gains a
#: section on every ``up`` and a job's output may be GBs; never read whole
TAIL_BYTES = 64 << 10


def tail_lines(path: Path, lines: int = 3, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last ``lines`` non-blank lines of a log, from its last ``max_bytes`` only (memory
    bounded whatever its size), control characters escaped (the service's output, printed
    in our one-line error); [] when it cannot be read."""
    return [printable(t.strip(), 500) for t in tail_text(path, max_bytes) if t.strip()][-lines:]


def _log_tail(s: st.ServiceState, lines: int = 3) -> str:
    return " | ".join(tail_lines(s.log, lines))


def wait_ready(bp: Blueprint, s: st.ServiceState, proc: subprocess.Popen | None = None,
               timeout: float | None = None) -> st.ServiceState:
    """Poll the health check until it answers; the service exiting or the blueprint's
    ``health.timeout`` passing is ``ServiceFailed`` (the service is stopped then)."""
    deadline = time.monotonic() + (bp.health.timeout if timeout is None else timeout)
    while True:
        if healthy(bp, s.host, s.ports, timeout=1.0):
            s.ready, s.ready_after_s = True, round(time.time() - s.started, 3)
            if start_time(s.pid or 0) == s.pid_started:
                s.cmdline = _cmdline(s.pid or 0)      # as it runs now (a start script may exec)
            st.write(s)
            return s
        exited = proc.poll() is not None if proc is not None else not running(s)
        if exited or time.monotonic() > deadline:
            what = "exited" if exited else f"did not answer its health check within {bp.health.timeout:g} s"
            stop(s, proc=proc)
            raise ServiceFailed(f"{s.name} {what} (log {s.log}: {_log_tail(s)})")
        time.sleep(0.1)


def stop(s: st.ServiceState, grace: float = 20.0, proc: subprocess.Popen | None = None) -> str | None:
    """TERM the process group, KILL it after ``grace`` seconds; mark the state stopped.
    Returns why nothing was signalled when the pid is alive but not the service. ``proc``:
    the service is this process's own child (unreaped, so its pid cannot have been reused),
    whatever it runs now (a start script may have exec'd since)."""
    if proc is not None and proc.poll() is None and s.pid == proc.pid:
        s.cmdline = _cmdline(proc.pid)
    problem = identity_problem(s) if s.pid is not None and start_time(s.pid) is not None else None
    if s.pgid is not None and problem is None and running(s):
        stop_group(s.pgid, grace, lambda: not running(s))     # then KILL the group's rest (workers)
    s.stopped, s.ready = True, False
    st.write(s)
    return problem
