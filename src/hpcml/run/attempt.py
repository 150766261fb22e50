"""One attempt of ``hpcml run``: start the ranks through a backend, then one loop for every
backend: forward signals, poll the watch and the backend, stop the attempt when the watch
or a lost node says so, and SIGKILL what still runs ``--kill-grace`` seconds after the
first TERM or INT (or after a rank failed).

Why one loop: srun's and the local wrappers' loops were two copies of spawn, forward,
poll, stop and kill that drifted; here a backend (``hpcml.run.backends``) says only how
its ranks start, whether they still run and how the rest are killed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcml import logs, phases
from hpcml.jobmodel import RunRecord
from hpcml.run.backends import STOPPING, Backend, NoRendezvous
from hpcml.run.config import Config
from hpcml.run.jobdir import write_own
from hpcml.run.launchers import recognise
from hpcml.signals import SLURM_SIGNALS, forwarding_to

if TYPE_CHECKING:
    from hpcml.run.watch import Watch
    from hpcml.run.watchexport import WatchExporter

log = logs.get(__name__)

FORWARDED = (*SLURM_SIGNALS, signal.SIGINT)     # INT too: `kill -INT` and a terminal's Ctrl-C alike
POLL = 0.05
#: the prefetching thread's niceness: it runs while the workers and ranks start on the
#: launcher's node, and must not take their CPU (it still runs where a CPU is idle)
PREFETCH_NICE = 10


@dataclass
class Control:
    """The attempt's stop state: when the kill grace began counting (monotonic), the
    signals forwarded so far."""

    cfg: Config
    record: RunRecord
    backend: Backend
    seen: list[int] = field(default_factory=list)
    stop_at: float | None = None
    signalled_at: float | None = None          # the first TERM or INT from outside (run.json's, at the end)

    def stop(self) -> None:
        """hpcml run stops the attempt itself (a hang, a straggler, a lost node): TERM now,
        the kill grace counts from here, and run.json says it was stopped, not failed (from
        before the first TERM: a rank that ends from then on was stopped)."""
        if self.record.stopped_at is None:
            self.record.stopped_at = time.time()
        for t in self.backend.targets():
            t.send_signal(signal.SIGTERM)
        self.failed()

    def note_signals(self) -> None:
        """Note when the first TERM or INT came from outside (Ctrl-C, scancel, Slurm's
        requeue), before it is passed on: the ranks that end from then on were stopped, not
        failed (``hpcml.run.ending``). Wraps the handlers ``forwarding`` just installed;
        leaving it puts back the ones before. A plain attribute: a handler may run while the
        record is being assigned to."""
        def noting(passed_on: Any) -> Any:
            def handler(sig: int, frame: Any) -> None:
                if self.signalled_at is None:
                    self.signalled_at = time.time()
                passed_on(sig, frame)
            return handler
        for sig in STOPPING:
            signal.signal(sig, noting(signal.getsignal(sig)))

    def failed(self) -> None:
        """A rank failed (the backend stopped the others): SIGKILL after the grace."""
        if self.stop_at is None:
            self.stop_at = time.monotonic()

    def grace_over(self) -> bool:
        """True once, ``--kill-grace`` seconds after the first TERM or INT (or ``failed``):
        time for SIGKILL; run.json says it came to that."""
        if self.stop_at is None:
            if not any(s in STOPPING for s in self.seen):
                return False
            self.stop_at = time.monotonic()
        if self.record.killed_after_grace or time.monotonic() - self.stop_at < self.cfg.kill_grace:
            return False
        self.record.killed_after_grace = True
        return True


def task_command(cfg: Config, d: Path, attempt: int) -> list[str]:
    """What every rank runs: ``python -m hpcml.run.task`` around the user's command."""
    task = [sys.executable, "-m", "hpcml.run.task", str(d.resolve()), "--interval", str(cfg.interval),
            "--kill-grace", str(cfg.kill_grace), "--gpu-metrics", cfg.gpu_metrics]
    if cfg.env:
        task += ["--env", cfg.env]
    if cfg.mlflow:
        task += ["--mlflow", cfg.mlflow]
    if attempt:
        task += ["--attempt", str(attempt)]
    return [*task, "--", *cfg.cmd]


def _world(cmd: list[str], ntasks: int, record: RunRecord) -> int:
    """The ranks the watch expects: one per task, or each task's launcher's workers
    (``hpcml.run.launchers``), which is said once, with the rendezvous hpcml leaves to it,
    and recorded (run.json's ``launcher`` and ``world``)."""
    launch = recognise(cmd)
    if launch is None:
        return ntasks
    if launch.workers is None:
        log.info(f"hpcml run: {launch.name}: the number of workers per task is not a number on the command line: "
                 "each task is watched as one rank (its workers are not)")
        return ntasks
    world = ntasks * launch.workers
    record.rank_launcher, record.world = launch.name, world
    given = sorted(launch.rendezvous_env({"WORLD_SIZE": "n", "RANK": "r", "MASTER_ADDR": "a", "MASTER_PORT": "p"}))
    log.info(f"hpcml run: {launch.name} in each of {ntasks} task(s) starts {launch.workers} workers: {world} ranks "
             "watched" + (f"; hpcml sets {', '.join(given)} where the launch line leaves them (logs/launcher-*.err)"
                          if given else ""))
    return world


def run_attempt(cfg: Config, d: Path, record: RunRecord, backend: Backend, pending: list[int],
                exporter: WatchExporter | None = None, can_replace: Callable[[str | None], bool] | None = None) -> int:
    """One launch of the command: every rank, until they all ended; the launch's exit code.
    ``pending``: signals that came while no attempt ran, forwarded as soon as one does."""
    try:
        with phases.phase("rendezvous"):         # rank 0's node's free port and address, the srun line
            plan = backend.plan(task_command(cfg, d, record.attempt), record)
    except NoRendezvous as exc:                    # no rendezvous on rank 0's node: the attempt cannot start
        log.info(f"hpcml run: attempt {record.attempt} not started: {exc}")
        return 1
    record.nodes, record.ntasks, record.ntasks_per_node = list(plan.nodes), plan.ntasks, plan.ntasks_per_node
    record.master, record.launch = plan.master, list(plan.launch)
    write_own(d, record)
    where = backend.where(plan)
    log.info(f"hpcml run: {where}, rendezvous {plan.master}, job directory {d}")
    world = _world(cfg.cmd, plan.ntasks, record)
    if record.rank_launcher:
        write_own(d, record)
    ctl = Control(cfg, record, backend)
    # from before the ranks start: a TERM while they do waits for them (held), not the default death
    with forwarding_to(backend.targets, FORWARDED, held=True) as fw:
        seen = ctl.seen = fw.seen                    # the ranks that end after a TERM or INT did not crash
        ctl.note_signals()
        with phases.phase("srun step"):              # its start: the ranks' own start is read from their records
            backend.start(plan)
        for sig in pending:                          # came while no attempt ran (--max-restarts' handler)
            fw.add(sig)
        pending.clear()
        fw.open()
        if any(s in STOPPING for s in seen) and ctl.signalled_at is None:
            ctl.signalled_at = time.time()
        settled("hpcml.run.watch")
        from hpcml.run.watch import Watch  # numpy and the straggler model: imported while vetting (Job.run)
        watch = Watch(d, record.attempt, world, timeout=cfg.hang_s, on_hang=cfg.on_hang, exporter=exporter,
                      on_straggler=cfg.on_straggler, can_replace=can_replace, secret=plan.secret, interval=cfg.interval,
                      job_id=record.job_id, restart_of=record.restart_of, straggler_window=cfg.straggler_s)
        watch.signals = seen
        with phases.phase("watch"):              # every read until the ranks ended: the launcher's load
            pause = getattr(backend, "wait_ended", time.sleep)     # woken by the ranks' end where the backend can
            first, prefetched, began = True, False, time.monotonic()
            while backend.poll(ctl.failed):
                if first:
                    first = not _first_read(ctl, watch)
                else:
                    _tick(ctl, watch)
                if not prefetched and (not first or time.monotonic() - began >= REPORT_PREFETCH_AFTER):
                    _prefetch_report(cfg)            # the ranks run: their start-up had the CPUs first
                    prefetched = True
                pause(POLL)
            rc = backend.returncode()
    backend.close(record)
    if seen:
        record.signals_forwarded = [signal.Signals(s).name for s in seen]
    if ctl.signalled_at is not None:
        record.signalled_at = ctl.signalled_at
        from hpcml.run import slurmend
        record.slurm_state = slurmend.state(record.job_id)
    watch.finish()                       # the crashes the last scan missed, and what the watch saw
    watch.fields().into(record)
    return rc


def _tick(ctl: Control, watch: Watch) -> None:
    lost = ctl.backend.lost()                      # asked while the attempt stops too: every lost node is known
    if lost and ctl.stop_at is None:
        for n, v in lost.items():            # began: the node's last sign of life, its ranks' last record
            last = max((b.beat for b in watch.beats.values() if b.node == n and b.beat is not None), default=None)
            watch.stopping("node", f"node {n} lost ({v.state})", min(v.seen, last) if last else v.seen, node=n)
        ctl.stop()                                  # the step's tasks, then srun after the grace
    if watch.poll() == "stop":
        ctl.stop()
    if ctl.grace_over():
        ctl.backend.kill()
    elif ctl.record.killed_after_grace and ctl.stop_at is not None:
        ctl.backend.overdue(time.monotonic() - ctl.stop_at, ctl.cfg.kill_grace)


def _first_read(ctl: Control, watch: Watch) -> bool:
    """One tick, timed into the clock when it is the first to find the ranks' beats (the
    watch's first reads); whether it was."""
    start, cpu, t0 = time.time(), time.process_time(), time.perf_counter()
    _tick(ctl, watch)
    clock = phases.current()
    if not watch.beats:
        return False
    if clock is not None:
        clock.add("watch.first read", start, time.perf_counter() - t0, time.process_time() - cpu)
    return True


#: seconds after the ranks' srun step, or their first beats read if sooner, when the report's
#: imports are prefetched: the wrappers and ranks start first (the last rank ~0.2-0.3 s after
#: the step on the 2-node benchmark; beats come an interval later)
REPORT_PREFETCH_AFTER = 1.0
#: what the report imports, prefetched while the ranks run
REPORT_MODULES = ("pyarrow", "pyarrow.compute", "jinja2", "hpcml.observe.html", "hpcml.observe.report",
                  "hpcml.observe.store", "hpcml.run.report", "hpcml.score.html", "hpcml.score.importers.store",
                  "hpcml.score.report")
#: the prefetch threads still importing, by module
_PREFETCHING: dict[str, list[threading.Thread]] = {}


def prefetch(*modules: str, then: Callable[[], object] | None = None) -> None:
    """Import ``modules`` in a background thread while the launcher waits (for the vetting
    workers, for the ranks), then call ``then``: the step that needs them does not pay for
    them on the job's critical path. A failure is left for that step to meet and say. The
    step imports them after ``settled``."""
    def load() -> None:
        import importlib
        try:                        # this thread only (Linux): the ranks' and workers' start-up comes first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PREFETCH_NICE)
        except (AttributeError, OSError):
            pass
        try:
            for module in modules:
                importlib.import_module(module)
            if then is not None:
                then()
        except Exception:  # noqa: BLE001 - the step that needs it says what is missing
            return
    thread = threading.Thread(target=load, name="hpcml-prefetch", daemon=True)
    for module in modules:
        _PREFETCHING.setdefault(module, []).append(thread)
    thread.start()


def settled(*modules: str) -> None:
    """Wait for the prefetch of ``modules`` to end, before this thread imports them.

    Why: a thread that imports a module another thread is importing waits on the module's
    import lock, and CPython 3.11's lock breaks when a signal handler that imports runs in
    that wait (its own lock's bookkeeping is dropped): ``KeyError`` from
    ``_ModuleLock.acquire``, a traceback and exit 1 instead of the run stopped like Ctrl-C.
    A thread's ``join`` is no import: the handler runs in it cleanly. (The forwarding
    handlers' own imports are made before the ranks start, ``hpcml.run.backends``.)"""
    for module in modules:
        for thread in _PREFETCHING.pop(module, []):
            thread.join()


def _prefetch_report(cfg: Config) -> None:
    """While the tasks run, import what the report needs (pyarrow, numpy, the builders):
    the launcher is idle then, and the report at the end costs only its own work. Started
    ``REPORT_PREFETCH_AFTER`` after the srun step (or at the ranks' first beats), not with
    it: begun with the step, its ~0.3 s of imports took CPU from the task wrappers' and
    ranks' own start-up on a node they share (``benchmarks/bench_run.py``)."""
    if cfg.report:
        prefetch(*REPORT_MODULES, then=_warm_report)


def _warm_report() -> None:
    """The report's first-use costs, paid while the ranks run: pyarrow's pandas probe
    (``hpcml.arrowprobe``) and the page's templates, compiled into the one environment."""
    from hpcml.arrowprobe import skip_pandas
    from hpcml.htmlkit import warm
    from hpcml.run.report import TEMPLATE
    skip_pandas()
    warm(TEMPLATE)
