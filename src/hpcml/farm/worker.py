"""One worker per slot: take the next task, run it, record how it ended; until the farm is done.

A worker is a small process of its own (a fresh interpreter, not a fork of the CLI: a
small parent starts tasks 3x faster) with one thread. Its tasks carry PR_SET_PDEATHSIG,
set by util-linux's ``setpriv --pdeathsig KILL`` in front of the command (or, without
setpriv, a pre-exec hook, which costs ~3 ms a task: it forbids vfork), so a task dies with
its worker (kill -9 of the worker, of the agent that started the workers, or of the
allocation), which is what lets another worker rerun it without two copies running.
Each task runs in its own session (its process group is what a time limit kills), with
stdin from /dev/null, stdout and stderr
in logs/ID.A.out|.err, and these variables: HPCML_FARM_DIR, HPCML_FARM_TASK_ID,
HPCML_FARM_ATTEMPT, HPCML_OBSERVE_DIR (observe/ID.A: what ``hpcml.observe.log`` writes,
read back by ``hpcml farm results``) and, on a GPU slot, CUDA_VISIBLE_DEVICES.

Waiting for a task is a poll() on its pidfd, woken by its exit or by the next heartbeat
or time limit, so a short task costs no polling delay. A command without shell syntax is
exec'd directly (no /bin/sh in between); anything else runs under ``/bin/sh -c``
(process.py). A node where tasks keep failing is retired (nodes.py).
"""

from __future__ import annotations

import json
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

from hpcml.farm.claim import View, finish, read_record, try_claim
from hpcml.farm.lease import Liveness, identity
from hpcml.farm.model import CLAIM_SCHEMA, ENDS, FAILED, LOGS, LOST, NODES, OBSERVE, OK, TIMEOUT, WORKERS, Settings
from hpcml.farm.nodes import retire
from hpcml.farm.process import ExitWaiter, PidfdWaiter, SigchldPipe, argv_of, die_with_parent, load_libc
from hpcml.farm.store import Farm, load
from hpcml.files import write_atomic

#: exit codes of a worker
DONE, NODE_RETIRED = 0, 3


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
        load_libc()
        self.farm, self.settings, self.cfg = farm, settings, cfg
        self.path = farm.path
        self.wid = f"{cfg.node}.{cfg.job or 'local'}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        self.view = View(farm)
        self.alive = Liveness(self.path, settings.lease, cfg.job)
        self.env = {k: v for k, v in os.environ.items() if k != "HPCML_OBSERVE_FD"}
        self.env["HPCML_FARM_DIR"] = str(self.path.absolute())
        if cfg.gpu is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = cfg.gpu
        setpriv = shutil.which("setpriv")
        self.prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
        self.fails_in_a_row: list[int] = []
        self._beat_file = self.path / WORKERS / self.wid
        self._next_beat = 0.0
        self._sigchld: SigchldPipe | None = None
        self._current: str | None = None         # the end record the running attempt will have
        self.ran = 0

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

    def node_retired(self) -> bool:
        return (self.path / NODES / f"{self.cfg.node}.bad").exists()

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> int:
        write_atomic(self._beat_file, json.dumps(identity(self.wid, self.cfg.node, self.cfg.job,
                                                          (self.cfg.gpu,) if self.cfg.gpu else ())))
        try:
            return self._loop()
        finally:
            self._beat_file.unlink(missing_ok=True)

    def _loop(self) -> int:
        view, settings = self.view, self.settings
        view.refresh()
        cursor, wait = 0, self.cfg.poll
        # an idle worker lists claims/ and ends/ (N entries each) at most every max_poll s:
        # growing with N keeps the metadata load of idle workers flat as farms grow
        max_poll = max(self.cfg.max_poll, len(view.order) / 10_000)
        while True:
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
            view.reap(self.alive, self.wid, settings.lease)
            view.refresh()
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

    def _claim(self, tid: int, attempt: int) -> bool:
        payload = json.dumps({"schema": CLAIM_SCHEMA, "id": tid, "attempt": attempt, "worker": self.wid,
                              "node": self.cfg.node, "gpu": self.cfg.gpu, "job": self.cfg.job,
                              "start": time.time()}).encode()
        if not try_claim(self.path, tid, attempt, payload):
            return False
        self.view.state(tid).claimed = attempt
        self.view.state(tid).mine = attempt
        return True

    # -- one attempt ----------------------------------------------------------------------
    def _run(self, tid: int, attempt: int) -> bool:
        """Run one claimed attempt; False when this node should take no more tasks."""
        task = self.view.tasks[tid]
        name = f"{tid}.{attempt}"
        env = self.env.copy()
        env["HPCML_FARM_TASK_ID"] = str(tid)
        env["HPCML_FARM_ATTEMPT"] = str(attempt)
        env["HPCML_OBSERVE_DIR"] = f"{self.env['HPCML_FARM_DIR']}/{OBSERVE}/{name}"
        start = time.time()
        self._current = f"{self.path}/{ENDS}/{name}"
        code, timed_out = self._execute(argv_of(task.command), env, f"{self.path}/{LOGS}/{name}")
        self._current = None
        end = time.time()
        outcome = OK if code == 0 else (TIMEOUT if timed_out else FAILED)
        record = {"outcome": outcome, "exit_code": code if code >= 0 else None,
                  "signal": -code if code < 0 else None, "start": start, "end": end,
                  "node": self.cfg.node, "gpu": self.cfg.gpu, "worker": self.wid, "job": self.cfg.job}
        st = self.view.state(tid)
        st.mine = 0
        self.ran += 1
        self.beat()
        if not finish(self.path, tid, attempt, record, self.wid):
            # fenced: declared lost meanwhile; that record stands (claim.py), not ours
            st.ends[attempt] = read_record(f"{self.path}/{ENDS}/{name}") or {**record, "outcome": LOST}
            return True
        st.ends[attempt] = record
        return self._count_failure(tid, outcome)

    def _execute(self, argv: list[str], env: dict[str, str], log: str) -> tuple[int, bool]:
        out = os.open(log + ".out", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        err = os.open(log + ".err", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        try:
            try:
                proc = subprocess.Popen(self.prefix + argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        env=env, start_new_session=True,
                                        preexec_fn=None if self.prefix else die_with_parent)
            except (FileNotFoundError, PermissionError) as exc:
                if argv[0] != "/bin/sh":
                    return self._execute(["/bin/sh", "-c", shlex.join(argv)], env, log)
                os.write(err, f"hpcml farm: cannot start: {exc}\n".encode())
                return 127, False
        finally:
            os.close(out)
            os.close(err)
        return self._wait_for(proc)

    def _wait_for(self, proc: subprocess.Popen) -> tuple[int, bool]:
        """Wait for the task, beating and enforcing its time limit on the way."""
        limit = self.settings.time_limit
        deadline = time.monotonic() + limit if limit else None
        timed_out = False
        exited = self._exit_waiter(proc)
        try:
            while True:
                now = time.monotonic()
                until = self._next_beat if deadline is None else min(self._next_beat, deadline)
                if exited.wait(max(0, int((until - now) * 1000) + 1)):
                    break
                now = time.monotonic()
                if self.beat(now) and self._current and os.path.exists(self._current):
                    # fenced: another worker judged us dead and declared this attempt lost
                    # (a false suspicion, e.g. a stalled filesystem): stop our copy now
                    deadline = now
                if deadline is not None and now >= deadline and not timed_out:
                    timed_out = True
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    deadline = None
        finally:
            exited.close()
        return proc.wait(), timed_out

    def _exit_waiter(self, proc: subprocess.Popen) -> ExitWaiter:
        try:
            return PidfdWaiter(proc)
        except (AttributeError, OSError):       # kernels before 5.3 (RHEL 8's 4.18): no pidfd_open
            if self._sigchld is None:
                self._sigchld = SigchldPipe()
            return self._sigchld.waiter(proc)

    def _count_failure(self, tid: int, outcome: str) -> bool:
        """A node where different tasks keep failing in a row is retired; False then."""
        if outcome == OK:
            self.fails_in_a_row.clear()
            return True
        if tid not in self.fails_in_a_row:
            self.fails_in_a_row.append(tid)
        limit = self.settings.node_failures
        if limit and len(self.fails_in_a_row) >= limit:
            retire(self.path, self.cfg.node, self.wid,
                   f"{len(self.fails_in_a_row)} different tasks failed in a row here "
                   f"(last: {', '.join(map(str, self.fails_in_a_row[-5:]))})")
            return False
        return True


def main(argv: list[str]) -> int:
    """A worker process: ``python -c 'from hpcml.farm.worker import main...' CONFIG`` where
    CONFIG is the JSON of {farm, overrides, node, job, slot, gpu} (started by agent.py)."""
    cfg = json.loads(argv[0])
    farm = load(cfg["farm"], cfg.get("overrides"))
    try:
        return Worker(farm, farm.settings, SlotConfig(node=cfg["node"], job=cfg.get("job"), slot=int(cfg["slot"]),
                                                      gpu=cfg.get("gpu"))).run()
    except KeyboardInterrupt:
        return 130


LAUNCH = "import sys; from hpcml.farm.worker import main; sys.exit(main(sys.argv[1:]))"


def launch_argv(config: dict[str, Any]) -> list[str]:
    return [sys.executable, "-c", LAUNCH, json.dumps(config)]

