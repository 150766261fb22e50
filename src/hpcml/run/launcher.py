"""Vet, launch and wait: the body of ``hpcml run``.

Slurm mode (inside an allocation, not inside a step): vet the nodes when asked, then one
srun step with ``--kill-on-bad-exit`` over the good nodes, each task being
``python -m hpcml.run.task``. Local mode (no allocation): ``--ntasks`` children on this
machine, the rest killed when one fails, as srun would. Either way the exit code is the
first failing rank's (by the time it ended), else srun's, else 0 (``hpcml.run.ending``).

The pieces, in torch elastic's shape: ``Config`` (the options, checked once and frozen),
a ``Backend`` per way of starting ranks (``hpcml.run.backends``: srun, local), one loop
that runs an attempt through any of them (``hpcml.run.attempt``), and this module: claim
the job directory, vet, then attempt after attempt while ``--max-restarts`` recovers
(``hpcml.run.recovery``), all into one ``RunRecord`` (``hpcml.jobmodel``).

It owns its ranks. Each local task wrapper gets ``task.STOP`` when the launcher dies (even
by SIGKILL) and kills its rank and everything the rank started; srun gets TERM then, on
which it kills its whole step. TERM and INT are passed on to every rank; whatever still
runs ``--kill-grace`` seconds later is killed: local wrappers get ``STOP``, srun gets TERM.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcml import logs, phases
from hpcml.cluster.ranks import restart_count
from hpcml.errors import HpcmlError, UsageError
from hpcml.jobmodel import FarmTaskRef, Launcher, RunRecord, Vetting, Who
from hpcml.run.attempt import FORWARDED, REPORT_MODULES, prefetch, run_attempt, settled
from hpcml.run.backends import STOPPING, Backend, Settings, choose
from hpcml.run.config import Config, Options
from hpcml.run.earlyvet import Early
from hpcml.run.ending import conclude, finish
from hpcml.run.jobdir import claiming, default_dir, launcher, prepare, read_run, vet_dir, write_own, write_run
from hpcml.run.recovery import Pool, Recovery, resume_of
from hpcml.schemas import tag
from hpcml.signals import handling
from hpcml.words import plural

log = logs.get(__name__)

ABORTED = 4          # vetting said abort: CMD never started (hpcml vet's code)
#: before the command starts: TERM and HUP stop the job there (``Job._stopped_before``); the
#: others Slurm sends (USR1/USR2 as "checkpoint now", CONT) wait for the ranks (``LATER``)
BEFORE = (signal.SIGTERM, signal.SIGHUP)
LATER = tuple(s for s in FORWARDED if s not in (*BEFORE, signal.SIGINT))
RANK_META_MAX = 1 << 20   # a rank's recorder metadata (observe/rank-N.json) read for its start
STOPPED = 1          # hpcml run stopped an attempt (a straggler, a lost node) and could not restart it

__all__ = ["ABORTED", "STOPPED", "Options", "run"]


def _environment(cfg: Config) -> dict | None:
    if not cfg.env:
        return None
    from hpcml.env.edf import Resolved
    from hpcml.env.resolve import resolve
    env, warnings = resolve(cfg.env)
    return {"schema": tag("run.env", 1), "edf": cfg.env, "resolved": Resolved(env, warnings).to_json(),
            "warnings": warnings}


def run(opts: Options, early: Early | None = None) -> int:
    """The job; its exit code. ``early``: ``--vet``'s workers, already started
    (``hpcml.run.earlyvet``): used if vetting runs on the nodes they started on, else
    stopped before this returns."""
    clock = phases.begin()
    begun, cpu = phases.started()
    clock.add("start-up", begun, time.time() - begun, cpu)        # the interpreter, imports, the options
    if early is not None:
        clock.add("vet.fan-out", early.start, early.wall_s, early.cpu_s)
    try:
        with clock.phase("prepare"):                              # the allocation, the job directory, run.json
            job = _prepare(opts)
        job.early, early = early, None
        return job.run()
    finally:
        if early is not None:
            early.step.cancel()


def _prepare(opts: Options) -> Job:
    from hpcml.cluster.allocation import current
    from hpcml.cluster.taskenv import current as farm_task
    from hpcml.run.summary import who
    allocation = current()
    task = farm_task()
    in_farm = task is not None                      # a farm task has one slot: its ranks run here
    kind = choose(allocation, in_farm)
    slurm = kind.spans_nodes                        # across the allocation's nodes (srun), else this host
    if not slurm:                                   # a farm task's run keeps its Slurm job id
        job = allocation.job_id if in_farm else None
        allocation = replace(current({k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}), job_id=job)
    cfg = Config.of(opts, len(allocation.nodes), local=not slurm)
    environment = _environment(cfg)                      # an EDF that does not validate: exit 2 now
    d = Path(cfg.job_dir) if cfg.job_dir else default_dir(allocation.job_id if slurm else None)
    restart = restart_count() if slurm else 0
    try:
        with claiming(d):                         # decide and claim as one step (two --overwrite at once)
            previous = prepare(d, overwrite=cfg.overwrite, job_id=allocation.job_id if slurm else None,
                               restart=restart)
            record = RunRecord(
                command=list(cfg.cmd), mode=kind.mode, job_id=allocation.job_id,
                attempt=restart if previous is None else max(restart, previous.attempt + 1), restart_count=restart,
                started=time.time(), allocation=list(allocation.nodes), excluded={}, vet=None, env=None,
                straggler_window_s=cfg.straggler_s,
                launcher=Launcher.model_validate(launcher()), who=Who.model_validate(who()),
                run_id=(previous.run_id if previous is not None else None) or os.urandom(8).hex(),
                # the farm's end of this attempt tells other hosts the launcher is gone
                farm_task=FarmTaskRef(farm=str(task.farm.absolute()), id=task.id, attempt=task.attempt) if task else None)
            if previous is not None:              # this Slurm job, requeued: a new attempt in its directory
                record.attempts = [*(previous.attempts or []), conclude(d, previous, restart)]
            try:
                write_run(d, record, exclusive=previous is None)   # claims d: of two runs at once, one stops here
            except FileExistsError:
                raise UsageError("another hpcml run took this directory at the same moment", file=str(d)) from None
        return Job(cfg, d, kind, allocation, record, environment)
    except OSError as exc:                        # a full disk, a read-only or vanished job directory
        raise HpcmlError(f"{d}: {exc.strerror or exc}") from None


class StoppedBefore(BaseException):
    """TERM or HUP while the launcher prepared the command (raised by its handler, wherever
    the launcher was): a BaseException, so no ``except Exception`` of the vetting swallows it."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


_LAUNCHER_PID = os.getpid()


def _stop_before(sig: int, _frame: Any) -> None:
    """TERM or HUP before the command: the launcher stops there (``StoppedBefore``). A
    process forked from it meanwhile (a local check, hpcml.vet.isolate) dies of the signal
    as it would have without this handler: it is not the launcher."""
    if os.getpid() != _LAUNCHER_PID:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return
    raise StoppedBefore(sig)


def _not_ignored(signals: tuple[int, ...]) -> tuple[int, ...]:
    """Those of ``signals`` not inherited ignored (``nohup``'s HUP): left as they are."""
    return tuple(s for s in signals if signal.getsignal(s) is not signal.SIG_IGN)


class Job:
    """The job in one directory: vetting, then attempt after attempt into ``record``."""

    def __init__(self, cfg: Config, d: Path, kind: type[Backend], allocation: Any, record: RunRecord,
                 environment: dict | None = None) -> None:
        self.cfg, self.d, self.kind, self.allocation, self.record = cfg, d, kind, allocation, record
        self.environment = environment
        self.early: Early | None = None      # --vet's workers, started before the launcher's imports
        self.ports: dict[str, int] = {}      # a free port of each vetted node, its worker's (rank 0's rendezvous)
        self.slurm = kind.spans_nodes          # across the allocation's nodes: vetting, spares, restarts elsewhere
        self.superseded = False              # a later attempt of this Slurm job took the directory

    def run(self) -> int:
        cfg, d = self.cfg, self.d
        if cfg.vet is None:
            prefetch("hpcml.run.watch")               # numpy and the straggler model (with --vet: while it waits)
        nodes = list(self.allocation.nodes)
        between: list[int] = []          # signals while no attempt runs: TERM or INT, no next one; the rest
        keep = lambda sig, _frame: between.append(sig)      # noqa: E731 - go to the ranks once they run
        before, later = _not_ignored(BEFORE), _not_ignored(LATER)     # nohup's HUP stays ignored
        try:
            with handling((*before, *later), keep):           # until the attempt's own forwarding
                with handling(before, _stop_before):           # INT: vetting's own (KeyboardInterrupt)
                    ready = self._before(nodes)
                if ready is None:
                    return ABORTED
                stop = next((s for s in between if s in before), None)
                if stop is not None:
                    raise StoppedBefore(stop)
                recovery = self._recovery(ready)
                exporter = self._exporter()
                try:
                    with handling(FORWARDED if recovery else (), keep):
                        code = self._attempts(ready, recovery, exporter, between)
                finally:
                    if exporter is not None:
                        exporter.close()
        except StoppedBefore as stop:
            code = self._stopped_before(stop.sig, between)
        log.info(f"hpcml run: done (exit {code}); job directory {d}")
        if not self.superseded:
            with phases.phase("report"):
                _report(d, cfg)
            clock = phases.current()
            if clock is not None:
                _keep_phases(d, clock, self.record)
        return code

    def _before(self, nodes: list[str]) -> list[str] | None:
        """Before the command: env.json, vetting (each node's worker sends a port free there:
        rank 0's rendezvous); the nodes the first attempt runs on, None where vetting said abort."""
        cfg, d, record, environment = self.cfg, self.d, self.record, self.environment
        try:
            if environment is not None:
                import json
                (d / "env.json").write_text(json.dumps(environment, indent=2, default=str) + "\n")
                record.env = cfg.env
            if cfg.vet is not None:
                good = self._vet()
                if good is None:
                    return None
                nodes = [n for n in nodes if n in set(good)]
        finally:
            if self.early is not None:                # not used: its workers exit having run nothing
                self.early.step.cancel()
                self.early = None
        if cfg.max_restarts and self.slurm:
            nodes = self._still_out(nodes, cfg.min_nodes or 1)
        return nodes

    def _stopped_before(self, sig: int, between: list[int]) -> int:
        """TERM or HUP before the command started (scancel, a pre-emption, the time limit
        while vetting): no rank ran; run.json says which signal came and when, and the job
        ends as an attempt stopped so does (128 + the signal; Slurm asked whether it
        requeued the job), not as a launcher killed without a word."""
        record, name = self.record, signal.Signals(sig).name
        came = [signal.Signals(s).name for s in between if s != sig]          # USR1 and the like, kept for the ranks
        record.signals_forwarded, record.signalled_at = [*came, name], time.time()
        # a second TERM (Slurm's KillWait comes after it anyway) must not cut the record short
        with handling(_not_ignored(BEFORE), lambda s, _frame: between.append(s)):
            if self.slurm:                            # the time limit, scancel, a pre-emption: Slurm's word
                from hpcml.run import slurmend
                record.slurm_state = slurmend.state(record.job_id)
            log.warning(f"hpcml run: {name} before the command started: it was not started; job directory {self.d}")
            code, taken = finish(self.d, record, 128 + sig)
        self.superseded = not taken
        return code

    def _vet(self) -> list[str] | None:
        """``--vet``: the good nodes; None when vetting said abort (the command never starts).
        ``--vet auto`` runs the tier its model chose (none: every node is good); with a
        collector, the centre's avoid list then takes its nodes out, while enough remain."""
        from hpcml.vet import engine, report, setup  # noqa: F401 - vetting's own imports, before the prefetch's
        from hpcml.vet.session import vet_job
        prefetch("hpcml.run.watch")                   # numpy and the straggler model, while the nodes' results come
        cfg, d, record = self.cfg, self.d, self.record
        protocol = cfg.vet_protocol
        assert protocol is not None
        plan, why = self._plan()
        auto, only = self._auto(protocol, plan, why) if cfg.vet_auto else (None, None)
        if auto is not None and auto.chosen == "none":
            nodes = list(self.allocation.nodes)
            record.vet = Vetting(decision="skipped", good=nodes, bad=[], reasons={}, auto=auto, duration_s=0.0)
            log.info(f"hpcml run: vet skipped: --vet auto chose no checks for {plural(len(nodes), 'node')}")
            good = nodes
        else:
            from hpcml.vet.engine import ClusterFault
            started = time.time()
            early, self.early = self.early, None
            if early is not None and (not self.slurm or early.nodes != tuple(self.allocation.nodes)):
                early.step.cancel()
                early = None
            try:
                run_, _ = vet_job(protocol, min_nodes=cfg.min_nodes, out=vet_dir(d), local=not self.slurm,
                                  allocation=self.allocation, only=only, started=early.step if early else None)
            except ClusterFault as exc:                # fail closed: the cluster failed, no node is bad
                record.vet = Vetting(decision="abort", cluster_fault=str(exc), auto=auto,
                                     duration_s=round(time.time() - started, 3))
                record.ended, record.exit_code, record.aborted = time.time(), ABORTED, True
                write_own(d, record)
                log.warning(f"hpcml run: aborted before the command started: {exc}")
                _report(d, cfg)
                return None
            v = run_.verdict
            self.ports = {n: r.free_port for n, r in run_.reports.items() if r.free_port}
            record.vet = Vetting(decision=v.decision.value, good=list(v.good), bad=list(v.bad),
                                 reasons=dict(v.reasons), duration_s=round(run_.duration, 3), auto=auto)
            record.excluded = {n: list(v.reasons.get(n, [])) for n in v.bad}
            log.info(f"hpcml run: vet {v.decision.value}: {len(v.good)} good, {len(v.bad)} bad"
                     + (f" ({', '.join(v.bad)})" if v.bad else ""))
            if v.decision.value == "abort":
                record.ended, record.exit_code, record.aborted = time.time(), ABORTED, True
                write_own(d, record)
                log.warning(f"hpcml run: aborted before the command started; see {d}")
                _report(d, cfg)
                return None
            good = list(v.good)
        if plan is None:
            return good
        from hpcml.vet.protocol import load
        least = cfg.min_nodes or load(protocol).min_nodes or len(self.allocation.nodes)
        return self._avoid(good, plan, least)

    def _plan(self) -> tuple[Any, str | None]:
        """The centre's plan (``GET /v1/plan``) when a collector is set: (plan, None), or
        (None, why not). Never fails the job: a collector down means the defaults."""
        if self.cfg.collector is None:
            return None, "no collector (--collector or $HPCML_COLLECTOR)"
        from hpcml.centre.client import fetch_plan
        from hpcml.run.summary import collector_token
        plan, why = fetch_plan(self.cfg.collector, collector_token())
        if why is not None:
            log.warning(f"hpcml run: the centre's plan: {why}; vetting without it")
        return plan, why

    def _auto(self, protocol: Path, plan: Any, why: str | None) -> tuple[Any, list[str] | None]:
        """``--vet auto``: its model over this allocation (``hpcml.vet.autoplan``), logged."""
        from hpcml.cluster.slurm import time_left
        from hpcml.vet import autoplan
        from hpcml.vet.protocol import load
        alloc = self.allocation
        auto = autoplan.decide(load(protocol), nodes=len(alloc.nodes),
                               gpus=autoplan.gpus_per_node(visible=len(alloc.gpus)),
                               seconds_left=time_left(alloc.job_id) if self.slurm else None,
                               restarts=bool(self.cfg.max_restarts), plan=plan, why_no_plan=why)
        for line in autoplan.lines(auto):
            log.info(f"hpcml run: {line}")
        if auto.gpus_per_node and protocol == autoplan.builtin_protocol():
            log.warning("hpcml run: --vet auto prices the built-in CPU protocol, which checks no GPU: name a GPU "
                        "protocol with --vet auto:PROTOCOL")
        tier = next(t for t in auto.tiers if t.name == auto.chosen)
        return auto, (tier.checks if tier.name != "none" else None)

    def _avoid(self, good: list[str], plan: Any, least: int) -> list[str]:
        """Take the centre's avoided nodes out of ``good``, worst first, each with why, while
        ``least`` remain (vetting's own minimum): the list is advice, and a job it would
        stop keeps the nodes. They are not "bad" nor "excluded": vetting did not fail them,
        and the centre must not count this job as evidence against them."""
        record = self.record
        order = {a.node: i for i, a in enumerate(plan.avoid)}
        listed = {a.node: a for a in plan.avoid}
        hit = sorted((n for n in good if n in listed), key=order.__getitem__)
        if not hit:
            return good
        room = max(0, len(good) - least)
        out, kept = hit[:room], hit[room:]
        days = plan.avoid_window_s / 86400
        whys = {n: [f"avoided: named a hang culprit or straggler by proven jobs of {listed[n].users} users "
                    f"({plural(listed[n].jobs, 'job')}) in the last {days:g} d (the centre's avoid list)"] for n in out}
        for n in out:
            log.info(f"hpcml run: {n} {whys[n][0]}")
        if kept:
            log.warning(f"hpcml run: kept {', '.join(kept)} though the centre's avoid list names them: without "
                        f"them fewer than {least} nodes would remain (--min-nodes, else the protocol's, else all)")
        if record.vet is not None:
            record.vet = record.vet.model_copy(update={"avoided": out, "good": [n for n in good if n not in out],
                                                       "reasons": {**record.vet.reasons, **whys}})
        return [n for n in good if n not in out]

    def _attempts(self, nodes: list[str], recovery: Recovery | None, exporter: Any, between: list[int]) -> int:
        """Attempt after attempt, while ``recovery`` restarts: the last attempt's code."""
        while True:
            backend = self._backend(recovery.pool.active if recovery else nodes, recovery)
            if recovery is not None and recovery.restarts:
                log.info(f"hpcml run: attempt {self.record.attempt} (restart {recovery.restarts} of "
                      f"{recovery.max_restarts})" + (f" on {', '.join(recovery.pool.active)}" if self.slurm else ""))
            rc = run_attempt(self.cfg, self.d, self.record, backend, between, exporter,
                             recovery.can_replace if recovery is not None else None)
            code, taken = finish(self.d, self.record, rc)
            self.superseded = not taken
            self._resumed()
            if recovery is None or self.superseded:
                return code
            restart = recovery.after(self.record, vet_dir(self.d) / f"again-{self.record.attempt}", self.allocation)
            if restart is None:
                return code
            if restart.action == "restart" and any(sig in STOPPING for sig in between):
                restart.action, restart.why = "stop", f"hpcml run got {signal.Signals(between[-1]).name} between attempts"
            rec = self.record
            rec.restart = restart
            rec.excluded = {**rec.excluded, **recovery.pool.out}
            if restart.action != "restart" and rec.stopped_at and code == 0:
                code = rec.exit_code = STOPPED       # its ranks left on TERM with 0: the job did not end well
            written = write_own(self.d, rec)
            if restart.action != "restart":
                log.warning(f"hpcml run: not restarting: {restart.why}")
                return code
            if not written:                              # a later attempt of this Slurm job holds the directory
                return code
            self.record = _next_attempt(rec)
            write_own(self.d, self.record)

    def _backend(self, nodes: list[str], recovery: Recovery | None) -> Backend:
        cfg = self.cfg
        settings = Settings(cfg.ntasks, cfg.ntasks_per_node, cfg.gpus_per_task, cfg.rank_env)
        nodes = nodes if self.slurm else self.record.allocation[:1]          # local: this host
        backend = self.kind(settings, nodes, self.allocation, watch_lost=recovery is not None and recovery.left)
        if self.ports and hasattr(backend, "ports"):
            backend.ports, self.ports = self.ports, {}      # the first attempt's, once: found free while vetting
        return backend

    def _still_out(self, nodes: list[str], least: int) -> list[str]:
        """A requeued job's restarts excluded nodes in its earlier attempts: they stay out (while
        enough are left to run on)."""
        out = {n: why for rec in self.record.attempts or [] if rec.restart is not None
               for n, why in (rec.restart.excluded or {}).items() if n in nodes}
        if not out or len(nodes) - len(out) < least:
            return nodes
        self.record.excluded = {**self.record.excluded, **out}
        log.info(f"hpcml run: {', '.join(sorted(out))} stay out (excluded by an earlier attempt's restart)")
        return [n for n in nodes if n not in out]

    def _recovery(self, good: list[str]) -> Recovery | None:
        """``--max-restarts``: the policy that decides each restart (``hpcml.run.recovery``)."""
        cfg = self.cfg
        if not cfg.max_restarts:
            return None
        spares = max(0, min(cfg.spare_nodes, len(good) - max(1, cfg.min_nodes or 1))) if self.slurm else 0
        if spares < cfg.spare_nodes and self.slurm:
            log.info(f"hpcml run: {plural(len(good), 'good node')}: {plural(spares, 'spare')} kept, not "
                  f"{cfg.spare_nodes}")
        pool = Pool.start(good, spares) if self.slurm else Pool(good[:1], [])     # local tasks: restarted in place
        return Recovery(pool, cfg.max_restarts, want=len(pool.active), min_nodes=cfg.min_nodes or len(pool.active),
                        revet=cfg.revet_protocol, slurm=self.slurm)

    def _exporter(self) -> Any:
        """``--prometheus-port``: one endpoint for every attempt of the job."""
        cfg = self.cfg
        if cfg.prometheus_port is None:
            return None
        from hpcml.run.watchexport import WatchExporter
        try:
            return WatchExporter(cfg.prometheus_port, cfg.prometheus_addr, str(self.record.job_id or "local"))
        except OSError as exc:
            log.warning(f"hpcml run: --prometheus-port {cfg.prometheus_port}: cannot serve ({exc.strerror}); the job runs "
                  "without the endpoint")
            return None

    def _resumed(self) -> None:
        """How the attempt before this one, restarted after a fault, was resumed by this one
        (``recovery.resume_of``), into that attempt's ``restart`` record."""
        earlier = self.record.attempts or []
        restart = earlier[-1].restart if earlier else None
        if restart is None or restart.action != "restart":
            return
        restart.resumed = resume_of(self.d, earlier[-1], self.record)
        write_own(self.d, self.record)


def _keep_phases(d: Path, clock: phases.Clock, mine: RunRecord) -> None:
    """run.json's ``phases``: the launcher's own, and the srun step's start to its first and
    its last rank's command (from the ranks' records: what the launcher waited for). Not
    where a later attempt (a requeue) took the directory meanwhile: its run.json is its own."""
    from hpcml.jobmodel import Phase
    run = read_run(d)
    if run.attempt != mine.attempt or run.launcher != mine.launcher:
        return
    ranks = _rank_starts(d, run.attempt)
    step = next((s for s in reversed(clock.spans) if s.name == "srun step"), None)
    if step is not None and ranks and min(ranks) >= step.start:     # another node's clock behind: not known
        clock.add("ranks started", step.start, min(ranks) - step.start)
        clock.add("last rank started", step.start, max(ranks) - step.start)
    run.phases = [Phase.model_validate(s.to_json()) for s in clock.spans]
    write_own(d, run)


def _rank_starts(d: Path, attempt: int) -> list[float]:
    """When each rank's command started (``command_started`` of its recorder's metadata)."""
    import math

    from hpcml.files import load_json_bounded
    from hpcml.run.jobpaths import observe_dir
    out = []
    for p in observe_dir(d, attempt).glob("rank-*.json"):
        try:
            meta = load_json_bounded(p, RANK_META_MAX)
        except (OSError, ValueError):
            continue
        t = meta.get("command_started") if isinstance(meta, dict) else None
        if isinstance(t, (int, float)) and math.isfinite(t):
            out.append(float(t))
    return out


def _next_attempt(rec: RunRecord) -> RunRecord:
    """The record of the attempt after ``rec``'s, with the earlier ones under ``attempts``."""
    keep = ("command", "mode", "job_id", "started", "allocation", "excluded", "vet", "env", "launcher", "farm_task",
            "restart_count", "who", "run_id")
    data = {k: v for k, v in rec.to_json().items() if k in keep}
    nxt = RunRecord.model_validate(data)
    nxt.attempt, nxt.started = rec.attempt + 1, time.time()
    nxt.attempts = [*(rec.attempts or []), rec.as_attempt()]
    return nxt


def _record_ledger(d: Path, rep: dict | None) -> None:
    """run.json's ``ledger``: the report's, or (no report) one without the step time the
    observe report gives (steps done again are then unknown, and said so)."""
    from hpcml.jobmodel import Ledger
    from hpcml.run import ledger
    run = read_run(d)
    got = rep.get("ledger") if rep else None
    led = Ledger.model_validate({k: v for k, v in got.items() if k != "line"}) if got else ledger.build(d, run, None)
    if led is not None:
        run.ledger = led
        write_own(d, run)


def _report(d: Path, cfg: Config) -> None:
    """The job's report (``hpcml report``), printed and written to JOBDIR/report.html, and
    its summary spooled and sent to the collector (``hpcml.run.summary``)."""
    if not cfg.report and not cfg.collector:
        _record_ledger(d, None)
        return
    settled(*REPORT_MODULES)
    from hpcml.arrowprobe import skip_pandas
    from hpcml.run.report import build, summary, write
    from hpcml.run.summary import deliver
    skip_pandas()                     # done while the ranks ran, unless the report was not prefetched
    try:
        rep = build(d)
    except Exception as exc:  # noqa: BLE001 - the job ended as it ended: a report that fails says so, no more
        log.warning(f"hpcml run: no report: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        try:
            _record_ledger(d, None)
        except Exception as why:  # noqa: BLE001 - nor does a ledger that cannot be made
            log.debug("hpcml run: no ledger: %s", why)
        return
    _record_ledger(d, rep)
    if cfg.report:
        path = write(rep, d / "report.html")
        print("\n".join(summary(rep)))
        print(f"html: {path}")
    deliver(d, rep, cfg.collector)
