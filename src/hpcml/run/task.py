"""One task of ``hpcml run`` (``python -m hpcml.run.task JOBDIR [--env EDF] -- CMD``).

Started by srun (or by the local launcher), it sets the rendezvous variables from Slurm's,
sends its stdout and stderr to ``JOBDIR/logs/rank-NNNNN.{out,err}``, and runs CMD under the
observe recorder (GPU sampler ``auto``), in the EDF's container when one is given. Exits
with CMD's exit code. ``--attempt N`` (a requeued Slurm job, or a restart after a fault): the attempt's own observe
store, a header line in the appended logs, and ``HPCML_RUN_DIR`` naming where the
Checkpointer notes a requeue (``hpcml.cluster.requeue``).

It owns what it started (``hpcml.proctree``): it is a child subreaper, so a rank's
orphaned children stay its descendants; ``STOP`` (the launcher's parent-death signal, and
its escalation after ``--kill-grace``) kills every descendant at once; and when the rank
ends, whatever it left running gets SIGTERM, then SIGKILL after the grace period.

Its recorder signs the rank's heartbeats (``hpcml.observe.beat``) with the key of its rank,
which the launcher gives this wrapper and no one it starts: locally through a pipe
(``--beat-fd FD``, read and closed before the rank starts), under srun as the attempt's
secret in ``HPCML_RUN_BEAT_KEY``, removed from the environment before the rank starts.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpcml import logs
from hpcml.cluster.ranks import ranks
from hpcml.cluster.requeue import ENV_ATTEMPT, ENV_DIR
from hpcml.errors import UsageError
from hpcml.proctree import become_subreaper, stop_descendants
from hpcml.run.jobpaths import attempt_dir, log_path, observe_dir
from hpcml.run.rendezvous import task_env

if TYPE_CHECKING:
    from hpcml.run.launchers import Launch
from hpcml.signals import install

log = logs.get("hpcml.run.task")           # not __name__: run as __main__ (python -m), its logger is hpcml's

#: "kill your rank now": not a signal Slurm or the recorder forwards, so it means only this
STOP = signal.SIGRTMIN + 1
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FR_ENTRIES = 2000            # collectives the Flight Recorder keeps per rank (torch's own default when armed)
ENV_BEAT_KEY = "HPCML_RUN_BEAT_KEY"    # srun's tasks: the attempt's secret, hex (local tasks: --beat-fd)


def flight_recorder_env(env: Mapping[str, str], observe: Path) -> dict[str, str]:
    """What arms PyTorch's Flight Recorder in the rank and lets the watch ask for its dump:
    the ring buffer's size (``TORCH_FR_BUFFER_SIZE``; ``TORCH_NCCL_TRACE_BUFFER_SIZE`` for
    torch before 2.5; a value the user set in either is kept, 0 turns it off), NCCL's
    per-collective CUDA events (``TORCH_NCCL_ENABLE_TIMING=1`` unless set: the recorder's
    ``duration_ms``, the only measure of a rank's arrival NCCL leaves, ``hpcml.observe.arrivals``)
    and hpcml's ``sitecustomize`` first on PYTHONPATH (``hpcml.run.inject``)."""
    from hpcml.run.inject import sitecustomize
    here = os.path.dirname(os.path.abspath(sitecustomize.__file__))
    path = env.get("PYTHONPATH", "")
    out = {sitecustomize.ENV: str(observe.absolute()),
           "PYTHONPATH": here + (os.pathsep + path if path else "")}
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        out[_fr_variable()] = str(FR_ENTRIES)
    if "TORCH_NCCL_ENABLE_TIMING" not in env:
        out["TORCH_NCCL_ENABLE_TIMING"] = "1"
    return out


def _fr_variable() -> str:
    """torch 2.5 renamed the Flight Recorder's size variable and warns on every rank about
    the old one: the installed torch's own ``version.py`` picks one, read as text (~1 ms;
    neither torch nor importlib.metadata, ~26 ms, is imported on every rank's start)."""
    import importlib.util
    import re
    try:
        spec = importlib.util.find_spec("torch")
        text = Path(spec.origin).with_name("version.py").read_text() if spec and spec.origin else ""
    except (ImportError, OSError, ValueError):
        text = ""
    m = re.search(r"""__version__\s*=\s*['"](\d+)\.(\d+)""", text)
    return "TORCH_NCCL_TRACE_BUFFER_SIZE" if m and (int(m[1]), int(m[2])) < (2, 5) else "TORCH_FR_BUFFER_SIZE"


def _redirect(d: Path, rank: int, attempt: int, name: str = "rank") -> None:
    """stdout and stderr into ``logs/rank-NNNNN`` (``name`` launcher: the launcher's own)."""
    from hpcml.run.ranklog import header
    logs = d / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for fd, stream in ((1, "out"), (2, "err")):
        path = log_path(d, rank, stream) if name == "rank" else logs / f"{name}-{rank:05d}.{stream}"
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if attempt:                         # where the requeued job's lines begin
            os.write(f, header(attempt).encode())
        os.dup2(f, fd)
        os.close(f)


def beat_material(opts: Mapping[str, str]) -> tuple[str, bytes] | None:
    """What the launcher gave this wrapper to sign with, taken where it put it so that the
    rank does not inherit it: ("key", its rank's key) or ("secret", the attempt's secret),
    read from ``--beat-fd`` (then closed; a secret is marked ``s:``), or the secret in
    ``HPCML_RUN_BEAT_KEY`` (then removed from this process's environment). None: nothing
    (a wrapper started by hand); its records are then refused by a launcher that has one."""
    secret = os.environ.pop(ENV_BEAT_KEY, None)
    fd = opts.get("--beat-fd")
    try:
        if fd is not None:
            with os.fdopen(int(fd), "rb") as f:
                text = f.read(256).decode()
            return ("secret", bytes.fromhex(text[2:])) if text.startswith("s:") else ("key", bytes.fromhex(text))
        return ("secret", bytes.fromhex(secret)) if secret else None
    except (ValueError, OSError) as exc:
        raise UsageError(f"no heartbeat key from the launcher ({exc})", key="beat_fd" if fd else ENV_BEAT_KEY) \
            from None


def beat_key(opts: Mapping[str, str], rank: int) -> bytes | None:
    """This rank's heartbeat key (``beat_material``)."""
    from hpcml.observe.beat import rank_key
    got = beat_material(opts)
    if got is None:
        return None
    kind, value = got
    return rank_key(value, rank) if kind == "secret" else value


def _stop(*_) -> None:
    """STOP: kill every descendant, now and until this wrapper exits. It may come before the
    recorder starts the rank; the rank is then killed as soon as it appears, and the
    recorder still writes what it saw."""
    def reaper() -> None:
        while True:
            stop_descendants(0.0)
            time.sleep(0.1)
    stop_descendants(0.0)
    if not any(t.name == "hpcml-stop" for t in threading.enumerate()):
        threading.Thread(target=reaper, name="hpcml-stop", daemon=True).start()


def _owning(cmd: list[str], opts: Mapping[str, str]) -> list[str]:
    """This wrapper owns what it starts: a subreaper, ``STOP`` kills every descendant, and
    TERM, INT and HUP are ignored outside the forwarding (which restores them when the
    command ends), so a late TERM cannot cut the last sweep short (``hpcml.run.rankexec``
    sets them back to default for the command). The command, in the EDF's container when
    ``--env`` gives one."""
    if opts.get("--env"):
        cmd = [sys.executable, "-m", "hpcml", "env", "run", opts["--env"], "--", *cmd]
    become_subreaper()
    # what STOP's kill imports (proctree's psutil) is loaded before STOP can come: imported
    # first inside the handler, it could find its module half-imported by the interrupted
    # code (the recorder imports its samplers once the rank runs) and fail, leaving the rank
    import psutil  # noqa: F401
    install((STOP,), _stop)
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    return cmd


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        log.info("usage: python -m hpcml.run.task JOBDIR [--env EDF] [--interval S] [--mlflow URL] [--kill-grace S] "
              "[--attempt N] [--beat-fd FD] -- CMD...")
        return 2
    head, cmd = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    d = Path(head[0])
    opts = dict(zip(head[1::2], head[2::2]))
    attempt = int(opts.get("--attempt", "0"))
    os.environ.update(task_env(os.environ))
    rank = ranks(dist=False).rank
    from hpcml.run.launchers import recognise
    launch = recognise(cmd)
    if launch is not None and launch.workers is not None:
        return _launcher(cmd, launch, d, opts, attempt, rank)
    from hpcml.observe.beat import sign_with
    sign_with(beat_key(opts, rank))                  # before anything is started: no child inherits it
    os.environ.update({ENV_DIR: str(attempt_dir(d, attempt)), ENV_ATTEMPT: str(attempt)})
    os.environ.update(flight_recorder_env(os.environ, observe_dir(d, attempt)))
    _redirect(d, rank, attempt)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    cmd = _owning(cmd, opts)
    from hpcml.observe.recorder import record
    from hpcml.run.rankexec import become_rank, startable
    # a command found is set up between the recorder's fork and its exec; one that is not goes
    # through rankexec, which says why in the rank's stderr with a shell's exit code
    how: dict = {"preexec": become_rank} if startable(cmd) else {"exec_via": [sys.executable, "-m", "hpcml.run.rankexec"]}
    try:
        return record(cmd, observe_dir(d, attempt),
                      float(opts.get("--interval", "1.0")), gpu_metrics=opts.get("--gpu-metrics", "auto"),
                      mlflow=opts.get("--mlflow"), **how)
    finally:
        stop_descendants(float(opts.get("--kill-grace", "10")))         # what the rank left running


def _launcher(cmd: list[str], launch: Launch, d: Path, opts: Mapping[str, str], attempt: int, rank: int) -> int:
    """The task's command is a launcher (``hpcml.run.launchers``): it runs here without a
    recorder of its own (its workers are the ranks, ``hpcml.run.worker``), its output in
    ``logs/launcher-NNNNN``; this wrapper hands its workers their heartbeat keys
    (``hpcml.run.workerkeys``) and sets the rendezvous its launch line leaves open."""
    import subprocess

    from hpcml.observe.beat import rank_key
    from hpcml.observe.recorder import FORWARDED
    from hpcml.run.launchers import ENV_LAUNCHER, ENV_WRAPPED, identity
    from hpcml.run.worker import ENV_WORKER, settings
    from hpcml.run.workerkeys import ENV_SOCKET, KeyServer
    from hpcml.signals import forwarding
    world = ranks(dist=False).world_size * (launch.workers or 1)
    got = beat_material(opts)
    server = None
    if got is not None:
        kind, value = got
        if kind == "secret":
            server = KeyServer(lambda r: rank_key(value, r), world)
        else:
            log.info(f"hpcml run: task {rank}: the launcher gave a rank's key, not the attempt's secret: "
                     "the workers' records will be refused")
    os.environ.update({ENV_DIR: str(attempt_dir(d, attempt)), ENV_ATTEMPT: str(attempt)})
    os.environ.update(flight_recorder_env(os.environ, observe_dir(d, attempt)))
    given = launch.rendezvous_env(os.environ)
    os.environ.update({**given, ENV_LAUNCHER: launch.name, ENV_WRAPPED: identity(os.environ),
                       ENV_WORKER: settings(d, attempt, opts.get("--interval", "1.0"),
                                            opts.get("--gpu-metrics", "auto"), opts.get("--kill-grace", "10")),
                       **({ENV_SOCKET: server.name} if server else {})})
    _redirect(d, rank, attempt, name="launcher")
    log.info(f"hpcml run: task {rank}: {launch.name} starts {launch.workers} workers here, ranks of {world}"
             + ("; set " + " ".join(f"{k}={v}" for k, v in sorted(given.items())) if given else ""))
    cmd = _owning(cmd, opts)
    try:
        child = subprocess.Popen([sys.executable, "-m", "hpcml.run.rankexec", *cmd])
        with forwarding(lambda: (child,), FORWARDED):
            rc = child.wait()
        return rc if rc >= 0 else 128 - rc
    finally:
        stop_descendants(float(opts.get("--kill-grace", "10")))
        if server is not None:
            server.close()


if __name__ == "__main__":
    from hpcml.errors import HpcmlError
    try:
        sys.exit(main(sys.argv[1:]))
    except HpcmlError as exc:             # into this rank's log, one line
        log.info(f"hpcml run: rank {os.environ.get('RANK', '?')}: error: {exc}")
        sys.exit(exc.exit_code)
