"""One worker per slot: take the next task, run it, record how it ended; until the farm is done.

A worker is a small process of its own (a fresh interpreter, not a fork of the CLI: a
small parent starts tasks 3x faster) with one thread, under a guard (guard.py: the guard
kills the task's whole tree when the worker or the agent dies, however). Its tasks carry
PR_SET_PDEATHSIG, set by util-linux's ``setpriv --pdeathsig KILL`` in front of the command
(or, without setpriv, a pre-exec hook, which costs ~3 ms a task: it forbids vfork).
Each task runs in its own process group in the worker's session (its group is what a time
limit kills; the session, recorded in the claim, is what a rerun on this host proves
gone first), and what it leaves behind is killed when it ends; with
stdin from /dev/null, stdout and stderr
in logs/ID.A.out|.err, and the worker's environment without the srun step's task identity
(taskenv.py: a task is rank 0 of 1) plus HPCML_FARM_DIR, HPCML_FARM_TASK_ID,
HPCML_FARM_ATTEMPT, HPCML_OBSERVE_DIR (observe/ID.A: what ``hpcml.observe.log`` writes,
read back by ``hpcml farm results``) and, on a GPU slot, CUDA_VISIBLE_DEVICES.

Waiting for a task is a poll() on its pidfd, woken by its exit or by the next heartbeat
or time limit, so a short task costs no polling delay. A command without shell syntax is
exec'd directly (no /bin/sh in between); anything else runs under ``/bin/sh -c``
(process.py). A node where tasks keep failing is retired (nodes.py).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from hpcml.cluster.taskenv import TASK_DIR, attempt_environment, task_environment
from hpcml.farm import guard
from hpcml.farm.claim import View, finish, load_end, try_claim
from hpcml.farm.lease import Liveness, identity
from hpcml.farm.model import CLAIM_SCHEMA, ENDS, FAILED, LOGS, LOST, NODES, OK, PARAMS, TASK_SCHEMA, TIMEOUT, WORKERS, Settings, Task
from hpcml.farm.nodes import retire, vet_this_node
from hpcml.farm.process import ExitWaiter, PidfdWaiter, SigchldPipe, argv_of, kill_leftovers
from hpcml.farm.store import Farm, load
from hpcml.files import write_atomic
from hpcml.proctree import die_with_parent, signal_group, start_time

log = logging.getLogger(__name__)

#: exit codes of a worker
DONE, NODE_RETIRED, DISK = 0, 3, 4
#: errors that stop a worker with one line instead of a traceback: the farm's disk, not a task
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
#: seconds between SIGTERM and SIGKILL when a task reaches its time limit, as Slurm's
#: KillWait gives a step: time for the task to save its state. A fenced copy (another
#: worker declared its attempt lost) gets SIGKILL at once: it must not write anything more.
TIME_LIMIT_GRACE = 10.0


def _own_group() -> dict[str, Any]:
    """Popen arguments: the task leads a process group of its own in the worker's session
    (``process_group`` keeps vfork; Python 3.10 has only a pre-exec hook for it)."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def _own_group_dying_with_parent() -> None:
    os.setpgrp()
    die_with_parent()


@dataclass
class SlotConfig:
    node: str
    job: str | None
    slot: int
    gpu: str | None = None
    poll: float = 0.05           # first idle wait; doubles up to max_poll
    max_poll: float = 1.0


class Worker:
    """The loop of one slot (see the module docstring)."""

    def __init__(self, farm: Farm, settings: Settings, cfg: SlotConfig):
        self.farm, self.settings, self.cfg = farm, settings, cfg
        self.path = farm.path
        self.wid = f"{cfg.node}.{cfg.job or 'local'}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        self.view = View(farm)
        self.alive = Liveness(self.path, settings.lease, cfg.job)
        self.env = task_environment(os.environ, self.path, cfg.gpu)    # once: not per task
        setpriv = shutil.which("setpriv")
        self.prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
        self.fails_in_a_row: list[int] = []
        self._said_code = False                  # "the tasks' failure, not the node's" said once
        self._vetted_at = 0                      # the streak's length when this node last vetted good
        self._beat_file = self.path / WORKERS / self.wid
        self._next_beat = 0.0
        self._sigchld: SigchldPipe | None = None
        self._current: str | None = None         # the end record the running attempt will have
        self._task: subprocess.Popen | None = None  # the running attempt's process
        self.stopping = False                    # the guard asked this worker to stop (guard.STOP)
        self.ran = 0
        session = os.getsid(0)
        self.tree = {"boot": self.alive.boot, "pidns": self.alive.pidns, "session": session,
                     "since": start_time(session)}

    # -- heartbeat ----------------------------------------------------------------------
    def beat(self, now: float | None = None) -> bool:
        """Touch the heartbeat when it is due; True if it was (then, while a task runs,
        the caller also checks that its attempt has not been declared lost)."""
        now = time.monotonic() if now is None else now
        if now >= self._next_beat:
            os.utime(self._beat_file)
            self._next_beat = now + self.settings.heartbeat
            return True
        return False

    def _on_stop(self, *_: object) -> None:
        """The guard is stopping (the farm was killed): start nothing more, and kill the
        running task (its attempt is lost: no end), unless it has already exited, whose
        end ``_run`` then records before this worker exits (guard.py)."""
        self.stopping = True
        task = self._task
        if task is not None and task.returncode is None:
            signal_group(task.pid, signal.SIGKILL)

    def node_retired(self) -> bool:
        return (self.path / NODES / f"{self.cfg.node}.bad").exists()

    # -- the loop -------------------------------------------------------------------------
    def run(self, report: int | None = None) -> int:
        """The loop; a full (or read-only) farm disk ends it with one line, written to the
        ``report`` fd (the agent shows it once for all its workers) or stderr, and DISK."""
        before = signal.signal(guard.STOP, self._on_stop)
        try:
            write_atomic(self._beat_file, json.dumps(identity(self.wid, self.cfg.node, self.cfg.job,
                                                              (self.cfg.gpu,) if self.cfg.gpu else ())))
            return self._loop()
        except OSError as exc:
            if exc.errno not in DISK_ERRORS:
                raise
            line = f"{exc.filename or self.path}: {exc.strerror}\n".encode()
            os.write(report if report is not None else 2, line)
            return DISK
        finally:
            signal.signal(guard.STOP, before)
            self._beat_file.unlink(missing_ok=True)

    def _loop(self) -> int:
        view, settings = self.view, self.settings
        view.refresh()
        cursor, wait = 0, self.cfg.poll
        # an idle worker lists claims/ and ends/ (N entries each) at most every max_poll s:
        # growing with N keeps the metadata load of idle workers flat as farms grow
        max_poll = max(self.cfg.max_poll, len(view.order) / 10_000)
        while True:
            if self.stopping:
                return DONE
            if self.node_retired():
                return NODE_RETIRED
            picked = None
            now = time.time()
            while cursor < len(view.order):
                tid = view.order[cursor]
                st = view.state(tid)
                if st.ok or st.running or st.gave_up(settings):
                    cursor += 1
                    continue
                if view.deps(tid, settings) != "ok" or st.retry_at(settings) > now:
                    cursor += 1            # revisited after the next refresh
                    continue
                attempt = st.claimed + 1
                if self._claim(tid, attempt):
                    picked = (tid, attempt)
                    break
                st.claimed = attempt       # someone else has it
                cursor += 1
            if picked is not None:
                wait = self.cfg.poll
                if not self._run(*picked):
                    return NODE_RETIRED
                continue
            self.beat()
            view.reap(self.alive, settings.lease, self._bury)
            view.refresh()
            if self.fails_in_a_row and not self._judge(refresh=False):  # evidence after its last failure
                return NODE_RETIRED
            if view.all_final(settings):
                return DONE
            if cursor >= len(view.order):
                cursor = 0
                if self._claimable(now):
                    continue
            time.sleep(wait)
            wait = min(wait * 2, max_poll)

    def _claimable(self, now: float) -> bool:
        view, s = self.view, self.settings
        return any(not st.ok and not st.running and not st.gave_up(s) and st.retry_at(s) <= now
                   and view.deps(tid, s) == "ok" for tid in view.order for st in (view.state(tid),))

    def _bury(self, tid: int, attempt: int, owner: dict[str, Any]) -> bool:
        """Before a lost attempt is rerun: kill what is left of it on this host (its
        worker's session, if that was here; any process with its task variables) and say
        whether it is proven gone (claim.py)."""
        tree = owner.get("tree") or {}
        here = tree.get("boot") == self.alive.boot and tree.get("pidns") == self.alive.pidns
        return guard.sweep(tree.get("session") if here else None, tree.get("since"),
                           guard.attempt_marker(self.path, tid, attempt))

    def _claim(self, tid: int, attempt: int) -> bool:
        doc = {"schema": CLAIM_SCHEMA, "id": tid, "attempt": attempt, "worker": self.wid, "node": self.cfg.node,
               "gpu": self.cfg.gpu, "job": self.cfg.job, "start": time.time(), "tree": self.tree}
        if not try_claim(self.path, tid, attempt, doc):
            return False
        self.view.state(tid).claimed = attempt
        self.view.state(tid).mine = attempt
        return True

    # -- one attempt ----------------------------------------------------------------------
    def _run(self, tid: int, attempt: int) -> bool:
        """Run one claimed attempt; False when this node should take no more tasks."""
        if self.stopping:
            return True                        # claimed, never started: lost, rerun later
        task = self.view.tasks[tid]
        name = f"{tid}.{attempt}"
        env = attempt_environment(self.env, tid, attempt)
        start = time.time()
        self._current = f"{self.path}/{ENDS}/{name}"
        cwd = self._task_dir(task, env[TASK_DIR])
        code, timed_out = self._execute(argv_of(task.command), env, f"{self.path}/{LOGS}/{name}",
                                        cwd if self.settings.task_dirs else None)
        self._current = None
        end = time.time()
        if self.stopping and code == -signal.SIGKILL and not timed_out:
            return True                        # killed by the stop, not ended: lost, rerun later
        outcome = OK if code == 0 else (TIMEOUT if timed_out else FAILED)
        record = {"outcome": outcome, "exit_code": code if code >= 0 else None,
                  "signal": -code if code < 0 else None, "start": start, "end": end,
                  "node": self.cfg.node, "gpu": self.cfg.gpu, "worker": self.wid, "job": self.cfg.job,
                  "retries": self.settings.retries}
        st = self.view.state(tid)
        st.mine = 0
        self.ran += 1
        self.beat()
        if not finish(self.path, tid, attempt, record):
            # fenced: declared lost meanwhile; that record stands (claim.py), not ours
            st.ends[attempt] = load_end(f"{self.path}/{ENDS}/{name}") or {**record, "outcome": LOST}
            return True
        st.ends[attempt] = record
        return self._count_failure(tid, outcome)

    def _task_dir(self, task: Task, path: str) -> str:
        """The task's own directory, made on its first attempt with its parameters beside
        it (params.json), so its relative paths (a checkpoint, outputs) are its own."""
        os.makedirs(path, exist_ok=True)
        params = os.path.join(path, PARAMS)
        if not os.path.exists(params):
            write_atomic(params, json.dumps({"schema": TASK_SCHEMA, **task.to_json()}, indent=1, default=str) + "\n")
        return path

    def _execute(self, argv: list[str], env: dict[str, str], log: str, cwd: str | None = None) -> tuple[int, bool]:
        out = os.open(log + ".out", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        err = os.open(log + ".err", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        try:
            group = _own_group() if self.prefix else {"preexec_fn": _own_group_dying_with_parent}
            try:
                proc = subprocess.Popen(self.prefix + argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        env=env, cwd=cwd, **group)
                self._task = proc
                if self.stopping:                 # stopped between the check in _run and now
                    signal_group(proc.pid, signal.SIGKILL)
            except (FileNotFoundError, PermissionError) as exc:
                if argv[0] != "/bin/sh":
                    return self._execute(["/bin/sh", "-c", shlex.join(argv)], env, log, cwd)
                os.write(err, f"hpcml farm: cannot start: {exc}\n".encode())
                return 127, False
            except (ValueError, OSError) as exc:     # a NUL byte, a command over 128 KiB: it never can
                logging.getLogger(__name__).warning("task %s cannot start: %s", os.path.basename(log), exc)
                os.write(err, f"hpcml farm: cannot start: {exc}\n".encode())
                return 127, False
        finally:
            os.close(out)
            os.close(err)
        try:
            return self._wait_for(proc)
        finally:                          # every way out: nothing of the task outlives it
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            self._task = None
            kill_leftovers()

    def _wait_for(self, proc: subprocess.Popen) -> tuple[int, bool]:
        """Wait for the task, beating and enforcing its time limit on the way."""
        limit = self.settings.time_limit
        deadline = time.monotonic() + limit if limit else None
        timed_out = False
        kill_at: float | None = None
        exited = self._exit_waiter(proc)
        try:
            while True:
                now = time.monotonic()
                until = min(t for t in (self._next_beat, deadline, kill_at) if t is not None)
                if exited.wait(max(0, int((until - now) * 1000) + 1)):
                    break
                if self.stopping:                  # a stop before the task was known to _on_stop
                    signal_group(proc.pid, signal.SIGKILL)
                now = time.monotonic()
                if self.beat(now) and self._current and os.path.exists(self._current):
                    # fenced: another worker judged us dead and declared this attempt lost
                    # (a false suspicion, e.g. a stalled filesystem): stop our copy now
                    kill_at, deadline = now, None
                if deadline is not None and now >= deadline:
                    timed_out = True
                    signal_group(proc.pid, signal.SIGTERM)
                    kill_at, deadline = now + TIME_LIMIT_GRACE, None
                if kill_at is not None and now >= kill_at:
                    signal_group(proc.pid, signal.SIGKILL)
                    kill_at = None
        finally:
            exited.close()
        signal_group(proc.pid, signal.SIGKILL)     # the group's rest (a background job), its leader unreaped
        return proc.wait(), timed_out

    def _exit_waiter(self, proc: subprocess.Popen) -> ExitWaiter:
        try:
            return PidfdWaiter(proc)
        except (AttributeError, OSError):       # kernels before 5.3 (RHEL 8's 4.18): no pidfd_open
            if self._sigchld is None:
                self._sigchld = SigchldPipe()
            return self._sigchld.waiter(proc)

    def _count_failure(self, tid: int, outcome: str) -> bool:
        """Node or code: a task that failed here counts against this node unless it also
        failed the same way (exit code or signal) on another node: then the command is at
        fault, on every node. Once ``node_failures`` different tasks in a row failed here and
        not elsewhere, the node is retired as soon as one of them passed on another node (the
        same command works elsewhere), or, where nothing ran them elsewhere, if ``hpcml vet
        --prolog`` finds the node bad; a node that vets good keeps working (the tasks'
        failure, said once) and is vetted again after as many failures more. False once retired."""
        if outcome == OK:
            self.fails_in_a_row.clear()
            self._vetted_at = 0
            return True
        if tid not in self.fails_in_a_row:
            self.fails_in_a_row.append(tid)
        return self._judge()

    def _judge(self, refresh: bool = True) -> bool:
        """The node's failures in a row, judged as they stand now (after a failure here, and
        while idle: a task that failed here may pass on another node after this node's last
        failure, as the farm ends); ``refresh``: list the farm first (the idle loop just
        did). False once retired."""
        limit = self.settings.node_failures
        if not limit or len(self.fails_in_a_row) < limit:
            return True
        if refresh:
            self.view.refresh()
        kinds = {t: self._blame(t) for t in self.fails_in_a_row}
        self.fails_in_a_row = [t for t in self.fails_in_a_row if kinds[t] != "code"]
        if len(self.fails_in_a_row) < limit:
            return True
        mine = self.fails_in_a_row
        elsewhere = [t for t in mine if kinds[t] == "node"]
        if not elsewhere and len(mine) - self._vetted_at < limit:
            return True                          # vetted good: wait for evidence (or as many failures again)
        verdict = vet_this_node()
        if not elsewhere and verdict.get("exit_code") != 1:
            self._vetted_at = len(mine)
            if not self._said_code:
                self._said_code = True
                log.warning("hpcml farm: %d different tasks failed in a row on %s, which vets good and where "
                            "nothing ran them elsewhere: the tasks' failure, not the node's; it keeps working",
                            len(mine), self.cfg.node)
            return True
        why = (f"{len(mine)} different tasks failed in a row here (last: {', '.join(map(str, mine[-5:]))})"
               + (f"; {len(elsewhere)} of them passed on another node ({', '.join(map(str, elsewhere[:5]))})"
                  if elsewhere else "; hpcml vet --prolog finds the node bad"))
        retire(self.path, self.cfg.node, self.wid, why, verdict)
        return False

    def _blame(self, tid: int) -> str:
        """"code": the task also failed on another node with this node's exit code or signal;
        "node": it passed on another node; else "unknown"."""
        ends = list(self.view.state(tid).ends.values())
        here = [(e.get("exit_code"), e.get("signal")) for e in ends
                if e.get("node") == self.cfg.node and e.get("outcome") in (FAILED, TIMEOUT)]
        other = [e for e in ends if e.get("node") != self.cfg.node]
        if any(e.get("outcome") in (FAILED, TIMEOUT) and (e.get("exit_code"), e.get("signal")) in here for e in other):
            return "code"
        if any(e.get("outcome") == OK for e in other):
            return "node"
        return "unknown"


def main(argv: list[str]) -> int:
    """A worker process: ``python -c 'from hpcml.farm.worker import main...' CONFIG`` where
    CONFIG is the JSON of {farm, overrides, node, job, slot, gpu, report} (started by
    agent.py); it forks into guard and worker (guard.py) and ends the way the worker did."""
    cfg = json.loads(argv[0])
    farm = load(cfg["farm"], cfg.get("overrides"))

    def work() -> int:
        try:
            return Worker(farm, farm.settings, SlotConfig(node=cfg["node"], job=cfg.get("job"),
                                                          slot=int(cfg["slot"]), gpu=cfg.get("gpu"))).run(cfg.get("report"))
        except KeyboardInterrupt:
            return 130
    return guard.exit_like(guard.guarded(work))


LAUNCH = "import sys; from hpcml.farm.worker import main; sys.exit(main(sys.argv[1:]))"


def launch_argv(config: dict[str, Any]) -> list[str]:
    return [sys.executable, "-c", LAUNCH, json.dumps(config)]

