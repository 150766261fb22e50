"""``python -m hpcml.run.worker -- CMD...``: a launcher's worker, watched as a rank.

A launcher (torchrun, ``accelerate launch``: ``hpcml.run.launchers``) under ``hpcml run``
starts its workers itself. Each worker is a Python process, and hpcml's sitecustomize
(``hpcml.run.inject``) sees at its start that its rank variables are not those of the
process hpcml wraps: it execs this module in its place, with the same pid (the launcher's
handle on its worker stays right) and the worker's own command line as CMD. From here the
worker is a rank as ``hpcml.run.task`` makes one: its stdout and stderr in the job's
``logs/rank-NNNNN``, the observe recorder around it (steps counted, heartbeats signed with
its rank's key, the host and GPU rows, py-spy stacks and Flight Recorder dumps on the
watch's request), and its exit told as a rank's, which the launcher sees as the worker's.

The launcher's signals (its TERM to stop the workers, then KILL) reach this process, which
forwards them to the worker (the recorder's forwarding) and dies with the launcher.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from hpcml import logs
from hpcml.cluster.ranks import ranks
from hpcml.proctree import become_subreaper, die_with_parent, stop_descendants
from hpcml.run.jobpaths import log_path, observe_dir
from hpcml.run.launchers import ENV_WRAPPED, identity
from hpcml.run.workerkeys import ENV_SOCKET, ask

log = logs.get("hpcml.run.worker")         # not __name__: run as __main__ (python -m), its logger is hpcml's

ENV_WORKER = "HPCML_RUN_WORKER"     # the task's settings for its workers' recorders (JSON, no secret)


def settings(d: Path, attempt: int, interval: str, gpu_metrics: str, kill_grace: str) -> str:
    return json.dumps({"dir": str(d.absolute()), "attempt": attempt, "interval": float(interval),
                       "gpu_metrics": gpu_metrics, "kill_grace": float(kill_grace)})


def _redirect(d: Path, rank: int) -> None:
    (d / "logs").mkdir(parents=True, exist_ok=True)
    for fd, stream in ((1, "out"), (2, "err")):
        f = os.open(log_path(d, rank, stream), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)


def main(argv: list[str]) -> int:
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    cfg = json.loads(os.environ[ENV_WORKER])
    d, attempt = Path(cfg["dir"]), int(cfg["attempt"])
    rank = ranks(dist=False).rank
    die_with_parent(signal.SIGTERM)             # the launcher gone: stop the worker (forwarded)
    become_subreaper()                          # the worker's orphans stay ours: stopped with it below
    from hpcml.observe.beat import sign_with
    key = ask(os.environ.get(ENV_SOCKET, ""))
    if key is None:
        log.info(f"hpcml run: rank {rank}: no heartbeat key from the task (its records will be refused)")
    sign_with(key)
    os.environ[ENV_WRAPPED] = identity(os.environ)    # the worker's own processes are this rank
    _redirect(d, rank)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    for sig in (signal.SIGINT, signal.SIGHUP):  # TERM: the launcher's stop, forwarded while the worker runs
        signal.signal(sig, signal.SIG_IGN)
    from hpcml.observe.recorder import record
    try:
        return record(cmd, observe_dir(d, attempt), float(cfg["interval"]), gpu_metrics=cfg["gpu_metrics"],
                      exec_via=[sys.executable, "-m", "hpcml.run.rankexec"])
    finally:
        stop_descendants(float(cfg["kill_grace"]))


if __name__ == "__main__":
    from hpcml.errors import HpcmlError
    try:
        sys.exit(main(sys.argv[1:]))
    except HpcmlError as exc:
        log.info(f"hpcml run: rank {os.environ.get('RANK', '?')}: error: {exc}")
        sys.exit(exc.exit_code)
