"""How ``hpcml run`` starts an attempt's ranks: one ``Backend`` per way (srun, local).

The shape is torch elastic's agent (``_start``/``_monitor``/``_stop`` hooks under one loop)
and submitit's one executor contract per backend: a backend knows how to plan the ranks
(how many, where, the rendezvous), start them, tell whether they still run, and kill what is
left after the grace period; the loop that forwards signals, polls the watch, stops an
attempt and counts the grace is ``hpcml.run.attempt``'s, once for every backend.

A new backend (flux, mpirun, a container launcher) is one class with these methods and
class attributes, built as ``Backend(settings, nodes, allocation, watch_lost)``, found
through the registry (``BACKENDS``; a site package adds one with an entry point in the
``hpcml.run_backends`` group). The run's mode is the backend's name: ``$HPCML_RUN_BACKEND``
names one, else the first built-in that ``applies`` (``choose``). Nothing outside the
backends asks which one runs: the launcher asks ``spans_nodes``.

Each plan has a fresh ``secret``: ``start`` gives every task wrapper its rank's heartbeat key
(``hpcml.observe.beat.rank_key``) where the rank's program does not inherit it, so the watch
believes only records its ranks' recorders signed (``hpcml.run.task.beat_key``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from hpcml import logs
from hpcml.errors import SlurmError
from hpcml.jobmodel import LostNode, RunRecord
from hpcml.ports import free_port
from hpcml.proctree import ExitWatch, become_subreaper, die_with_parent, kill_orphans, reap_orphans, signal_group
from hpcml.registry import Registry
from hpcml.run.task import ENV_BEAT_KEY, STOP

log = logs.get(__name__)

STOPPING = (signal.SIGTERM, signal.SIGINT)      # the ones after which --kill-grace counts


class Target(Protocol):
    """What a signal is forwarded to."""

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


def _launches(task: list[str]) -> bool:
    """Whether the task command runs a launcher whose workers are the ranks
    (``hpcml.run.launchers``): one task per node then, not one per GPU."""
    from hpcml.run.launchers import recognise
    launch = recognise(task[task.index("--") + 1:] if "--" in task else task)
    return launch is not None and launch.workers is not None


class NoRendezvous(Exception):
    """Rank 0's node gave no free port: the attempt cannot start (not bad input, and not
    hpcml's end: the launcher records the attempt's end and goes on)."""


@dataclass(frozen=True)
class Plan:
    """Where and how an attempt's ranks run: what run.json records before they start."""

    nodes: list[str]
    ntasks: int
    ntasks_per_node: int
    master: str                        # MASTER_ADDR:MASTER_PORT
    launch: list[str]                  # the srun command line (local: the task command)
    env: Mapping[str, str] = field(repr=False, default_factory=dict)
    secret: bytes = field(repr=False, default_factory=lambda: os.urandom(32))   # the attempt's heartbeat secret


class Backend(Protocol):
    """One way to run the ranks. ``start`` returns once they were started; ``poll`` is
    called every ``POLL`` seconds until it says they all ended."""

    mode: ClassVar[str]
    #: the ranks run across the allocation's nodes, which the scheduler gave and may requeue:
    #: vetting covers them, spare nodes and restarts elsewhere are possible (else: this host)
    spans_nodes: ClassVar[bool]

    def __init__(self, settings: Settings, nodes: list[str], allocation: Any, watch_lost: bool = False) -> None: ...

    @classmethod
    def applies(cls, allocation: Any, in_farm: bool) -> bool:
        """Whether this backend is the one for ``allocation`` when none is named."""
        ...

    def where(self, plan: Plan) -> str:
        """The ranks' place, for the start line: "4 tasks on n[1-2]"."""
        ...

    def plan(self, task: list[str], record: RunRecord) -> Plan: ...

    def start(self, plan: Plan) -> None: ...

    def targets(self) -> list[Target]: ...

    def lost(self) -> dict[str, LostNode]:
        """Every node lost so far when this call found a new one, else nothing (checked at
        the backend's own pace)."""
        ...

    def poll(self, failed: Any) -> bool:
        """True while ranks run; ``failed()`` when one failed (the rest get TERM here)."""
        ...

    def kill(self) -> None:
        """The grace period is over: SIGKILL what still runs."""
        ...

    def overdue(self, since_kill: float, grace: float) -> None: ...

    def returncode(self) -> int: ...

    def close(self, record: RunRecord) -> None: ...


@dataclass(frozen=True)
class Settings:
    """What the backends need of the validated options (``hpcml.run.config.Config``)."""

    ntasks: int | None
    ntasks_per_node: int | None
    gpus_per_task: int | None
    env: Mapping[str, str]                 # added to the ranks' environment (--remote-write's URL)


# -------------------------------------------------------------------------------- srun

class SrunStep:
    """srun as a signal target. srun ends its step with SIGKILL at once when it gets TERM
    (INT: twice), leaving the ranks no time to stop; so TERM and INT go to the step's tasks
    through ``scancel --signal``, as the time limit's TERM does, and srun gets TERM only as
    the SIGKILL after the grace period. The rest srun passes on itself."""

    def __init__(self, proc: subprocess.Popen, job_id: str, name: str) -> None:
        self.proc, self.job_id, self.name = proc, job_id, name

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        if sig in STOPPING:
            from hpcml.cluster.slurm import signal_step, step_id
            try:
                step = step_id(self.job_id, self.name)
                if step:
                    signal_step(step, sig)
                    return
            except SlurmError:
                pass
            sig = signal.SIGTERM                        # no step yet: srun ends what it started
        self.proc.send_signal(sig)


class Srun:
    """One ``srun --kill-on-bad-exit`` step over the attempt's nodes, rank 0 on the first."""

    mode: ClassVar[str] = "slurm"
    spans_nodes: ClassVar[bool] = True

    @classmethod
    def applies(cls, allocation: Any, in_farm: bool) -> bool:
        """Inside an allocation, not inside one of its steps (and not a farm task's slot)."""
        return bool(allocation.job_id) and allocation.step_id is None and not in_farm

    def where(self, plan: Plan) -> str:
        from hpcml.cluster.hostlist import fold
        return f"{plan.ntasks} tasks on {fold(plan.nodes)}"

    def __init__(self, settings: Settings, nodes: list[str], allocation: Any, watch_lost: bool = False) -> None:
        from hpcml.run.recovery import LostNodes
        self.settings, self.nodes, self.allocation = settings, nodes, allocation
        self._lost = LostNodes(nodes) if watch_lost else None
        self.proc: subprocess.Popen | None = None
        self.step: SrunStep | None = None
        self._ended: ExitWatch | None = None
        #: a port each vetted node's worker found free (``hpcml.vet.worker``): rank 0's rendezvous
        #: without an srun step to ask its node, where the launcher runs elsewhere (salloc)
        self.ports: dict[str, int] = {}

    def plan(self, task: list[str], record: RunRecord) -> Plan:
        from hpcml.cluster.allocation import step_order
        from hpcml.cluster.hostlist import fold
        from hpcml.cluster.slurm import free_port_on
        from hpcml.run.rendezvous import node_address
        per_node = self.settings.ntasks_per_node or int(os.environ.get("SLURM_NTASKS_PER_NODE", "0") or 0)
        gpus_per_task = self.settings.gpus_per_task
        if not per_node and _launches(task):
            per_node = 1                                # a launcher per node starts the GPUs' workers itself
        if not per_node and int(os.environ.get("SLURM_GPUS_ON_NODE", "0") or 0):
            per_node = int(os.environ["SLURM_GPUS_ON_NODE"])        # one task per GPU, each bound to its GPU
            gpus_per_task = gpus_per_task or 1
        per_node = per_node or 1
        fits = per_node * len(self.nodes)               # fewer after a shrink than the --ntasks asked for
        ntasks = min(self.settings.ntasks or fits, fits)
        nodes = step_order(self.nodes, self.allocation.nodes)   # a spare put back last may come first here
        master = nodes[0]                               # srun gives rank 0 the first in the job's order
        try:
            found, self.ports = self.ports.get(master), {}                # found while vetting ran: used once
            port = free_port() if master == self.allocation.node else found or free_port_on(master, sys.executable)
        except SlurmError as exc:
            raise NoRendezvous(f"no rendezvous port on {master}, rank 0's node: {exc}") from None
        addr = node_address(master)
        gpus = [f"--gpus-per-task={gpus_per_task}"] if gpus_per_task else []
        self.name = f"hpcml-run-{os.getpid()}" + (f"-{record.attempt}" if record.attempt else "")
        argv = ["srun", f"--job-name={self.name}", f"--nodes={len(nodes)}", f"--nodelist={fold(nodes)}",
                f"--ntasks={ntasks}", f"--ntasks-per-node={per_node}", *gpus, "--kill-on-bad-exit=1", *task]
        env = {**os.environ, **self.settings.env, "MASTER_ADDR": addr, "MASTER_PORT": str(port),
               "TORCHELASTIC_RUN_ID": f"hpcml-run-{self.allocation.job_id}",
               "TORCHELASTIC_RESTART_COUNT": str(record.attempt)}
        return Plan(nodes, ntasks, per_node, f"{addr}:{port}", argv, env)

    def start(self, plan: Plan) -> None:
        # its own session: a terminal's Ctrl-C reaches srun once, through the launcher; TERM
        # when the launcher dies (even by SIGKILL), on which srun kills its step. The secret
        # reaches the wrappers in their environment (srun has no other way to each task);
        # each removes it before its rank starts
        env = {**plan.env, ENV_BEAT_KEY: plan.secret.hex()}
        import hpcml.cluster.slurm  # noqa: F401 - SrunStep.send_signal's, imported before a handler needs it
        self.proc = subprocess.Popen(plan.launch, env=env, start_new_session=True,
                                     preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        self.step = SrunStep(self.proc, str(self.allocation.job_id), self.name)

    def targets(self) -> list[Target]:
        return [self.step] if self.step is not None else []

    def lost(self) -> dict[str, LostNode]:
        if self._lost is None or not self._lost.poll():
            return {}
        return self._lost_nodes()

    def _lost_nodes(self) -> dict[str, LostNode]:
        assert self._lost is not None
        return {n: LostNode.model_validate(v) for n, v in self._lost.lost.items()}

    def poll(self, failed: Any) -> bool:
        assert self.proc is not None
        return self.proc.poll() is None

    def wait_ended(self, timeout: float) -> None:
        """Until srun ends or ``timeout`` passed (optional: a backend without it is polled)."""
        if self._ended is None and self.proc is not None:
            self._ended = ExitWatch(self.proc.pid, self.proc)
        if self._ended is not None:
            self._ended.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)           # srun: SIGKILL to every process of its step

    def overdue(self, since_kill: float, grace: float) -> None:
        from hpcml.run.recovery import LOST_WAIT
        if since_kill > grace + LOST_WAIT and self.proc is not None:
            self.proc.kill()                            # srun waits for a lost node's tasks: it is not coming back

    def returncode(self) -> int:
        assert self.proc is not None and self.proc.returncode is not None
        return self.proc.returncode

    def close(self, record: RunRecord) -> None:
        if self._ended is not None:
            self._ended.close()
        if self._lost is None:
            return
        if self.returncode() != 0:
            self._lost.poll(now=True)                   # srun ended first (its step's node failed)
        if self._lost.lost:
            record.lost_nodes = self._lost_nodes()


# ------------------------------------------------------------------------------- local

class Wrapper:
    """A local task wrapper as a signal target. INT goes to its rank's process group, as a
    terminal's Ctrl-C would (a bash rank's foreground child included); the rest to the
    wrapper, whose recorder passes them on to the rank alone (TERM to a rank's DataLoader
    workers would break the checkpoint it is about to take)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        if sig == signal.SIGINT and any(signal_group(g, sig) for g in self._rank_groups()):
            return
        self.proc.send_signal(sig)              # INT before the rank started: the wrapper stops

    def _rank_groups(self) -> list[int]:
        import psutil
        try:
            children = psutil.Process(self.proc.pid).children()
            return [c.pid for c in children if os.getpgid(c.pid) == c.pid]    # hpcml.run.rankexec's group
        except (psutil.Error, OSError):
            return []


class Local:
    """``--ntasks`` wrappers on this machine, the rest stopped when one fails, as srun's
    ``--kill-on-bad-exit`` would. Each wrapper gets ``task.STOP`` when the launcher dies
    (even by SIGKILL) and kills its rank and everything the rank started."""

    mode: ClassVar[str] = "local"
    spans_nodes: ClassVar[bool] = False

    @classmethod
    def applies(cls, allocation: Any, in_farm: bool) -> bool:
        return True                               # anywhere: this host

    def where(self, plan: Plan) -> str:
        from hpcml.words import plural
        return plural(plan.ntasks, "local task")

    def __init__(self, settings: Settings, nodes: list[str], allocation: Any, watch_lost: bool = False) -> None:
        self.settings, self.node = settings, nodes[0]
        self.procs: list[subprocess.Popen] = []
        self.running: list[subprocess.Popen] = []
        self.rc = 0

    def plan(self, task: list[str], record: RunRecord) -> Plan:
        from hpcml.cluster.taskenv import FARM_JOB
        n = self.settings.ntasks or (1 if _launches(task) else _gpus_here()) or 1
        port = free_port("127.0.0.1")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        if env.get(FARM_JOB):                   # ranks see no job: still the farm task (taskenv.current)
            env[FARM_JOB] = ""
        env.update(self.settings.env)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   TORCHELASTIC_RUN_ID=f"hpcml-run-{os.getpid()}", TORCHELASTIC_RESTART_COUNT=str(record.attempt))
        self.task = task
        return Plan([self.node], n, n, f"127.0.0.1:{port}", [f"{n} x", *task], env)

    def start(self, plan: Plan) -> None:
        # a wrapper killed on its own (kill -9, a crash) leaves what its rank started: a
        # subreaper, we adopt it and kill it (kill_orphans)
        become_subreaper()
        import psutil  # noqa: F401 - Wrapper.send_signal's: a signal handler that imports can break an import
        # each wrapper: its own session (Ctrl-C reaches it once, forwarded), STOP when we die
        self.procs = [self._wrapper(plan, r) for r in range(plan.ntasks)]
        self.running = list(self.procs)

    def _wrapper(self, plan: Plan, rank: int) -> subprocess.Popen:
        """Rank ``rank``'s wrapper, its heartbeat key in a pipe it reads and closes before
        its rank starts (``--beat-fd``): not in its environment or command line. A task that
        runs a launcher gets the attempt's secret instead (marked ``s:``): its workers' ranks
        are the launcher's to give (``hpcml.run.workerkeys``), as under srun."""
        from hpcml.observe.beat import rank_key
        read, write = os.pipe()
        material = "s:" + plan.secret.hex() if _launches(self.task) else rank_key(plan.secret, rank).hex()
        try:
            os.write(write, material.encode())     # at most 66 bytes: never blocks
        finally:
            os.close(write)
        try:
            cut = self.task.index("--")
            cmd = [*self.task[:cut], "--beat-fd", str(read), *self.task[cut:]]
            return subprocess.Popen(cmd, env={**plan.env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                    start_new_session=True, preexec_fn=lambda: die_with_parent(STOP),
                                    pass_fds=(read,))
        finally:
            os.close(read)

    def targets(self) -> list[Target]:
        return [Wrapper(p) for p in self.running]

    def lost(self) -> dict[str, LostNode]:
        return {}                                 # one node: the launcher's own

    def poll(self, failed: Any) -> bool:
        for p in list(self.running):
            code = p.poll()
            if code is None:
                continue
            self.running.remove(p)
            if code < 0:                          # killed: what its rank started is ours now
                kill_orphans({q.pid for q in self.running})
            if code != 0 and self.rc == 0:
                self.rc = code
                for other in self.running:        # as srun --kill-on-bad-exit does
                    other.send_signal(signal.SIGTERM)
                failed()                          # and SIGKILL after the grace period
        return bool(self.running)

    def kill(self) -> None:
        for p in self.running:
            p.send_signal(STOP)

    def overdue(self, since_kill: float, grace: float) -> None:
        pass                                      # a wrapper kills its rank's whole tree on STOP

    def returncode(self) -> int:
        return self.rc

    def close(self, record: RunRecord) -> None:
        reap_orphans(set())                       # every wrapper has ended: nothing may be left


def _gpus_here() -> int:
    """The GPUs bound to this process (CUDA_VISIBLE_DEVICES, Slurm's binding: a farm task's
    slot), else NVML's count: NVML ignores CUDA_VISIBLE_DEVICES and sees the whole node."""
    from hpcml.cluster.allocation import task_gpus
    from hpcml.samplers.nvml import visible_gpus
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":       # set empty: CUDA sees no GPU
        return 0
    return len(task_gpus(os.environ)) or len(visible_gpus()[0])


#: the run's mode -> how its ranks start; the built-ins in the order ``choose`` tries them
BACKENDS: Registry[type[Backend]] = Registry(
    "run backend", "hpcml.run_backends",
    {"slurm": "hpcml.run.backends:Srun", "local": "hpcml.run.backends:Local"},
    hint="a site's backend is installed with an entry point in the hpcml.run_backends group")
BACKEND_ENV = "HPCML_RUN_BACKEND"


def choose(allocation: Any, in_farm: bool) -> type[Backend]:
    """The backend of this run: ``$HPCML_RUN_BACKEND`` when set (a site's, by its name; an
    unknown name is bad input), ``local`` with ``$HPCML_RUN_LOCAL``, else the first built-in
    that applies."""
    from hpcml.errors import UsageError
    from hpcml.registry import UnknownName
    named = os.environ.get(BACKEND_ENV, "").strip()
    if named:
        try:
            return BACKENDS.get(named)
        except UnknownName as exc:
            raise UsageError(str(exc), key=BACKEND_ENV) from None
    if os.environ.get("HPCML_RUN_LOCAL"):
        return BACKENDS.get("local")
    return next(cls for cls in (BACKENDS.get("slurm"), BACKENDS.get("local")) if cls.applies(allocation, in_farm))
