"""Vet, launch and wait: the body of ``hpcml run``.

Slurm mode (inside an allocation, not inside a step): vet the nodes when asked, then one
srun step with ``--kill-on-bad-exit`` over the good nodes, each task being
``python -m hpcml.run.task``. Local mode (no allocation): ``--ntasks`` children on this
machine, the rest killed when one fails, as srun would. Either way the exit code is the
first failing rank's (by the time it ended), else srun's, else 0.

It owns its ranks. Each local task wrapper gets ``task.STOP`` when the launcher dies (even
by SIGKILL) and kills its rank and everything the rank started; srun gets TERM then, on
which it kills its whole step. TERM and INT are passed on to every rank (``_Wrapper``,
``_Srun``); whatever still runs ``--kill-grace`` seconds later is killed: local wrappers
get ``STOP``, srun gets TERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcml.cluster import requeue
from hpcml.cluster.ranks import restart_count
from hpcml.errors import HpcmlError, SlurmError, UsageError
from hpcml.farm.taskenv import FARM_JOB
from hpcml.ports import FREE_PORT, free_port
from hpcml.proctree import become_subreaper, die_with_parent, kill_orphans, signal_group
from hpcml.run.jobdir import (
    attempt_dir,
    claiming,
    default_dir,
    launcher,
    log_path,
    prepare,
    rank_meta,
    restart_of,
    tail,
    vet_dir,
    write_own,
    write_run,
)
from hpcml.run.recovery import LOST_WAIT, ON_STRAGGLER, LostNodes, Pool, Recovery, resume_of
from hpcml.run.rendezvous import node_address
from hpcml.run.task import STOP
from hpcml.run.watch import HANG, ON_HANG, Watch
from hpcml.schemas import tag
from hpcml.signals import SLURM_SIGNALS, forwarding, handling
from hpcml.words import plural

ABORTED = 4          # vetting said abort: CMD never started (hpcml vet's code)
STOPPED = 1          # hpcml run stopped an attempt (a straggler, a lost node) and could not restart it
FORWARDED = (*SLURM_SIGNALS, signal.SIGINT)     # INT too: `kill -INT` and a terminal's Ctrl-C alike
STOPPING = (signal.SIGTERM, signal.SIGINT)      # the ones after which --kill-grace counts
POLL = 0.05


@dataclass
class Options:
    cmd: list[str]
    job_dir: Path | None = None
    vet: Path | None = None
    min_nodes: int | None = None
    ntasks: int | None = None                 # local mode: tasks; Slurm: total (default: per node x nodes)
    ntasks_per_node: int | None = None
    env: str | None = None
    interval: float = 1.0
    report: bool = True                       # write report.html and print the summary at the end
    gpus_per_task: int | None = None
    mlflow: str | None = None                 # an MLflow tracking server's URL: rank 0's metrics go there
    kill_grace: float = 10.0                  # seconds from TERM/INT to SIGKILL of what still runs
    overwrite: bool = False                   # replace a finished job in job_dir
    gpu_metrics: str = "auto"                 # the ranks' GPU sampler: auto, none or a registered name
    hang_timeout: str = "auto"                # seconds without a completed step on any rank; auto or off
    on_hang: str = "stop"                     # stop: end the job and exit HANG; report: name and go on
    prometheus_port: int | None = None        # the watch's verdicts served here (hpcml.run.watchexport)
    prometheus_addr: str = "127.0.0.1"
    max_restarts: int = 0                     # attempts after a fault, inside the allocation (hpcml.run.recovery)
    spare_nodes: int = 0                      # good nodes kept idle for those attempts
    revet: str | None = None                  # the suspects' vetting protocol: default --vet's; "none"
    on_straggler: str = "report"              # restart: a straggler the watch names is a fault
    collector: str | None = None              # hpcml vet serve's URL: the job's summary goes there (run.summary)
    remote_write: str | None = None           # a Prometheus remote-write URL: every rank's recorder pushes there


def hang_seconds(value: str) -> float | None:
    """``--hang-timeout``: None for auto; ``inf`` for off; else positive seconds."""
    from hpcml.units import parse_seconds
    text = str(value).strip().lower()
    if text == "auto":
        return None
    if text == "off":
        return float("inf")
    try:
        seconds = parse_seconds(text)
    except (UsageError, ValueError) as exc:
        raise UsageError(f"{value!r} is not auto, off or a duration such as '300 s' ({exc})",
                         key="hang_timeout") from None
    if not seconds > 0:
        raise UsageError(f"must be more than 0 s (or off), got {value!r}", key="hang_timeout")
    return seconds


def _check(opts: Options, allocation) -> None:
    if not opts.cmd:
        raise UsageError("no command to run: hpcml run [options] -- python train.py", key="cmd")
    if opts.min_nodes is not None and opts.min_nodes > len(allocation.nodes):
        raise UsageError(f"{opts.min_nodes} is more than the allocation's {len(allocation.nodes)} nodes",
                         key="min_nodes")
    for key in ("ntasks", "ntasks_per_node", "min_nodes", "gpus_per_task"):
        v = getattr(opts, key)
        if v is not None and v < 1:
            raise UsageError(f"must be at least 1, got {v}", key=key)
    if opts.interval < 0.1:
        raise UsageError(f"must be at least 0.1 s, got {opts.interval}", key="interval")
    if opts.kill_grace < 0:
        raise UsageError(f"must be at least 0 s, got {opts.kill_grace}", key="kill_grace")
    hang_seconds(opts.hang_timeout)
    from hpcml.run.summary import collector_url
    opts.collector = collector_url(opts.collector)
    if opts.remote_write is not None:          # checked now (URL, the remote extra), then passed to every rank
        from hpcml.observe.remotewrite import ENV_URL, config
        config(opts.remote_write)
        os.environ[ENV_URL] = opts.remote_write
    if opts.prometheus_port is not None and not 0 < opts.prometheus_port < 65536:
        raise UsageError(f"must be a port number (1-65535), got {opts.prometheus_port}", key="prometheus_port")
    _check_restarts(opts, allocation)
    if opts.on_hang not in ON_HANG:
        raise UsageError(f"'{opts.on_hang}' is not one of {', '.join(ON_HANG)}", key="on_hang")
    from hpcml.samplers.choose import modes
    if opts.gpu_metrics not in modes():           # the registry's names, a site's plug-ins too
        raise UsageError(f"'{opts.gpu_metrics}' is not one of {', '.join(modes())}", key="gpu_metrics")
    if opts.vet is not None:
        from hpcml.vet.protocol import load
        load(opts.vet).unset_variables()                  # a protocol that does not validate: exit 2 now


def _check_restarts(opts: Options, allocation) -> None:
    if opts.max_restarts < 0:
        raise UsageError(f"must be at least 0, got {opts.max_restarts}", key="max_restarts")
    if opts.spare_nodes < 0:
        raise UsageError(f"must be at least 0, got {opts.spare_nodes}", key="spare_nodes")
    if opts.spare_nodes and opts.spare_nodes >= len(allocation.nodes):
        raise UsageError(f"{opts.spare_nodes} spares leave no node of the allocation's {len(allocation.nodes)} "
                         "to run on", key="spare_nodes")
    for key, given in (("spare_nodes", opts.spare_nodes), ("revet", opts.revet),
                       ("on_straggler", opts.on_straggler == "restart")):
        if given and not opts.max_restarts:
            raise UsageError("acts on restarts: give --max-restarts too", key=key)
    if opts.min_nodes and opts.spare_nodes and opts.spare_nodes > len(allocation.nodes) - opts.min_nodes:
        raise UsageError(f"{opts.spare_nodes} spares leave fewer than --min-nodes {opts.min_nodes} of the "
                         f"allocation's {len(allocation.nodes)} nodes to run on", key="spare_nodes")
    if opts.on_straggler not in ON_STRAGGLER:
        raise UsageError(f"'{opts.on_straggler}' is not one of {', '.join(ON_STRAGGLER)}", key="on_straggler")
    if opts.revet not in (None, "none"):
        from hpcml.vet.protocol import load
        load(Path(opts.revet)).unset_variables()


def _environment(opts: Options) -> dict | None:
    if not opts.env:
        return None
    from hpcml.env.edf import Resolved
    from hpcml.env.resolve import resolve
    env, warnings = resolve(opts.env)
    return {"schema": tag("run.env", 1), "edf": opts.env, "resolved": Resolved(env, warnings).to_json(),
            "warnings": warnings}


def _gpus_here() -> int:
    """The GPUs bound to this process (CUDA_VISIBLE_DEVICES, Slurm's binding: a farm task's
    slot), else NVML's count: NVML ignores CUDA_VISIBLE_DEVICES and sees the whole node."""
    from hpcml.cluster.allocation import task_gpus
    from hpcml.samplers.nvml import visible_gpus
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":       # set empty: CUDA sees no GPU
        return 0
    return len(task_gpus(os.environ)) or len(visible_gpus()[0])


def run(opts: Options) -> int:
    from dataclasses import asdict, replace

    from hpcml.cluster.allocation import current
    from hpcml.farm.taskenv import current as farm_task
    from hpcml.run.summary import who
    allocation = current()
    task = farm_task()
    in_farm = task is not None                      # a farm task has one slot: its ranks run here
    slurm = bool(allocation.job_id) and allocation.step_id is None and not os.environ.get("HPCML_RUN_LOCAL") \
        and not in_farm
    if not slurm:                                   # a farm task's run keeps its Slurm job id
        job = allocation.job_id if in_farm else None
        allocation = replace(current({k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}), job_id=job)
    _check(opts, allocation)
    environment = _environment(opts)                      # an EDF that does not validate: exit 2 now
    d = Path(opts.job_dir) if opts.job_dir else default_dir(allocation.job_id if slurm else None)
    restart = restart_count() if slurm else 0
    attempt = restart
    try:
        with claiming(d):                         # decide and claim as one step (two --overwrite at once)
            previous = prepare(d, overwrite=opts.overwrite, job_id=allocation.job_id if slurm else None,
                               restart=restart)
            if previous is not None:              # after in-job restarts (--max-restarts) too
                attempt = max(restart, int(previous.get("attempt") or 0) + 1)
            info: dict[str, Any] = {"command": opts.cmd, "mode": "slurm" if slurm else "local",
                                    "job_id": allocation.job_id, "attempt": attempt, "restart_count": restart,
                                    "started": time.time(),
                                    "allocation": list(allocation.nodes), "excluded": {}, "vet": None,
                                    "env": None, "launcher": launcher(), "who": who(),
                                    "run_id": (previous or {}).get("run_id") or os.urandom(8).hex(),
                                    # the farm's end of this attempt tells other hosts the launcher is gone
                                    "farm_task": {**asdict(task), "farm": str(task.farm.absolute())} if task else None}
            if previous is not None:              # this Slurm job, requeued: a new attempt in its directory
                earlier = previous.pop("attempts", [])
                info["attempts"] = [*earlier, _concluded(d, previous, restart)]
            try:
                write_run(d, info, exclusive=previous is None)   # claims d: of two runs at once, one stops here
            except FileExistsError:
                raise UsageError("another hpcml run took this directory at the same moment", file=str(d)) from None
        return _run(opts, d, slurm, allocation, environment, info)
    except OSError as exc:                        # a full disk, a read-only or vanished job directory
        raise HpcmlError(f"{d}: {exc.strerror or exc}") from None


def _run(opts: Options, d: Path, slurm: bool, allocation, environment: dict | None, info: dict) -> int:
    if environment is not None:
        import json
        (d / "env.json").write_text(json.dumps(environment, indent=2, default=str) + "\n")
        info["env"] = opts.env
    nodes = list(allocation.nodes)
    if opts.vet is not None:
        from hpcml.vet.session import vet_job
        run_, _ = vet_job(opts.vet, min_nodes=opts.min_nodes, out=vet_dir(d), local=not slurm,
                          allocation=allocation)
        v = run_.verdict
        info["vet"] = {"decision": v.decision.value, "good": v.good, "bad": v.bad, "reasons": v.reasons,
                       "duration_s": round(run_.duration, 3)}
        info["excluded"] = {n: v.reasons.get(n, []) for n in v.bad}
        print(f"hpcml run: vet {v.decision.value}: {len(v.good)} good, {len(v.bad)} bad"
              + (f" ({', '.join(v.bad)})" if v.bad else ""), file=sys.stderr)
        if v.decision.value == "abort":
            info.update(ended=time.time(), exit_code=ABORTED, aborted=True)
            write_own(d, info)
            print(f"hpcml run: aborted before the command started; see {d}", file=sys.stderr)
            _report(d, opts)
            return ABORTED
        nodes = [n for n in nodes if n in set(v.good)]
    if opts.max_restarts and slurm:
        nodes = _still_out(info, nodes, opts.min_nodes or 1)
    recovery = _recovery(opts, nodes, slurm)
    exporter = _exporter(opts, info)
    between: list[int] = []                       # TERM or INT while no attempt runs: no next one
    try:
        with handling(FORWARDED if recovery else (), lambda sig, _frame: between.append(sig)):
            info, code = _attempts(opts, d, slurm, allocation, nodes, recovery, info, exporter, between)
    finally:
        if exporter is not None:
            exporter.close()
    print(f"hpcml run: done (exit {code}); job directory {d}", file=sys.stderr)
    if not info.get("superseded"):
        _report(d, opts)
    return code


def _attempts(opts: Options, d: Path, slurm: bool, allocation, nodes: list[str], recovery: Recovery | None,
              info: dict, exporter: Any, between: list[int]) -> tuple[dict, int]:
    """Attempt after attempt, while ``recovery`` restarts: the last attempt's record and code."""
    while True:
        rc = _attempt(opts, d, slurm, allocation, recovery.pool.active if recovery else nodes, recovery, info,
                      exporter, between)
        code = _finish(d, info, rc)
        _resumed(d, info)
        if recovery is None or info.get("superseded"):
            return info, code
        restart = recovery.after(info, vet_dir(d) / f"again-{info['attempt']}", allocation)
        if restart is None:
            return info, code
        if restart["action"] == "restart" and any(sig in STOPPING for sig in between):
            restart.update(action="stop", why=f"hpcml run got {signal.Signals(between[-1]).name} between attempts")
        info["restart"] = restart
        info["excluded"] = {**info.get("excluded", {}), **recovery.pool.out}
        if restart["action"] != "restart" and info.get("stopped_at") and code == 0:
            code = info["exit_code"] = STOPPED       # its ranks left on TERM with 0: the job did not end well
        written = write_own(d, info)
        if restart["action"] != "restart":
            print(f"hpcml run: not restarting: {restart['why']}", file=sys.stderr)
            return info, code
        if not written:                              # a later attempt of this Slurm job holds the directory
            return info, code
        info = _next_attempt(d, info, restart)


def _still_out(info: dict, nodes: list[str], least: int) -> list[str]:
    """A requeued job's restarts excluded nodes in its earlier attempts: they stay out (while
    enough are left to run on)."""
    out = {n: why for rec in info.get("attempts") or [] if isinstance(rec.get("restart"), dict)
           for n, why in (rec["restart"].get("excluded") or {}).items() if n in nodes}
    if not out or len(nodes) - len(out) < least:
        return nodes
    info["excluded"] = {**info.get("excluded", {}), **out}
    print(f"hpcml run: {', '.join(sorted(out))} stay out (excluded by an earlier attempt's restart)", file=sys.stderr)
    return [n for n in nodes if n not in out]


def _recovery(opts: Options, good: list[str], slurm: bool) -> Recovery | None:
    """``--max-restarts``: the policy that decides each restart (``hpcml.run.recovery``)."""
    if not opts.max_restarts:
        return None
    spares = max(0, min(opts.spare_nodes, len(good) - max(1, opts.min_nodes or 1))) if slurm else 0
    if spares < opts.spare_nodes and slurm:
        print(f"hpcml run: {plural(len(good), 'good node')}: {plural(spares, 'spare')} kept, not "
              f"{opts.spare_nodes}", file=sys.stderr)
    pool = Pool.start(good, spares) if slurm else Pool(good[:1], [])     # local tasks: restarted in place
    revet = None if opts.revet == "none" else Path(opts.revet) if opts.revet else opts.vet
    return Recovery(pool, opts.max_restarts, want=len(pool.active), min_nodes=opts.min_nodes or len(pool.active),
                    revet=revet, slurm=slurm)


def _attempt(opts: Options, d: Path, slurm: bool, allocation, nodes: list[str], recovery: Recovery | None,
             info: dict, exporter: Any, pending: list[int]) -> int:
    """One launch of the command: every rank, until they all ended."""
    task = [sys.executable, "-m", "hpcml.run.task", str(d.resolve()), "--interval", str(opts.interval),
            "--kill-grace", str(opts.kill_grace), "--gpu-metrics", opts.gpu_metrics]
    if opts.env:
        task += ["--env", opts.env]
    if opts.mlflow:
        task += ["--mlflow", opts.mlflow]
    if info["attempt"]:
        task += ["--attempt", str(info["attempt"])]
    task += ["--", *opts.cmd]
    if recovery is not None and recovery.restarts:
        print(f"hpcml run: attempt {info['attempt']} (restart {recovery.restarts} of {recovery.max_restarts})"
              + (f" on {', '.join(recovery.pool.active)}" if slurm else ""), file=sys.stderr)
    if slurm:
        return _srun(opts, d, nodes, allocation, task, info, exporter, pending, recovery)
    return _local(opts, d, task, info, exporter, pending, recovery)


def _next_attempt(d: Path, info: dict, restart: dict) -> dict:
    """The record of the attempt after ``info``'s, with the earlier ones under ``attempts``."""
    earlier = [*info.get("attempts", []), {k: v for k, v in info.items() if k != "attempts"}]
    nxt = {k: info[k] for k in ("command", "mode", "job_id", "allocation", "excluded", "vet", "env", "launcher",
                                "farm_task", "restart_count") if k in info}
    nxt.update(attempt=int(info["attempt"]) + 1, started=time.time(), attempts=earlier)
    write_own(d, nxt)
    return nxt


def _report(d: Path, opts: Options) -> None:
    """The job's report (``hpcml report``), printed and written to JOBDIR/report.html, and
    its summary spooled and sent to the collector (``hpcml.run.summary``)."""
    if not opts.report and not opts.collector:
        return
    from hpcml.run.report import build, summary, write
    from hpcml.run.summary import deliver
    rep = build(d)
    if opts.report:
        path = write(rep, d / "report.html")
        print("\n".join(summary(rep)))
        print(f"html: {path}")
    deliver(d, rep, opts.collector)


def _srun(opts: Options, d: Path, nodes: list[str], allocation, task: list[str], info: dict, exporter: Any,
          pending: list[int], recovery: Recovery | None) -> int:
    from hpcml.cluster.hostlist import fold
    per_node = opts.ntasks_per_node or int(os.environ.get("SLURM_NTASKS_PER_NODE", "0") or 0)
    if not per_node and int(os.environ.get("SLURM_GPUS_ON_NODE", "0") or 0):
        per_node = int(os.environ["SLURM_GPUS_ON_NODE"])        # one task per GPU, each bound to its GPU
        opts.gpus_per_task = opts.gpus_per_task or 1
    per_node = per_node or 1
    fits = per_node * len(nodes)                # fewer after a shrink than the --ntasks asked for
    ntasks = min(opts.ntasks or fits, fits)
    master_node = nodes[0]                   # srun gives rank 0 the first node of the list
    if master_node == allocation.node:
        port = free_port()
    else:
        out = subprocess.run(["srun", "-N1", "-n1", "-w", master_node, "--overlap", sys.executable, "-c", FREE_PORT],
                             capture_output=True, text=True, timeout=60)
        port = int(out.stdout.strip() or free_port())
    addr = node_address(master_node)
    gpus = ([f"--gpus-per-task={opts.gpus_per_task}"] if opts.gpus_per_task else [])
    name = f"hpcml-run-{os.getpid()}" + (f"-{info['attempt']}" if info["attempt"] else "")
    argv = ["srun", f"--job-name={name}", f"--nodes={len(nodes)}", f"--nodelist={fold(nodes)}", f"--ntasks={ntasks}",
            f"--ntasks-per-node={per_node}", *gpus, "--kill-on-bad-exit=1", *task]
    env = dict(os.environ, MASTER_ADDR=addr, MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"hpcml-run-{allocation.job_id}",
               TORCHELASTIC_RESTART_COUNT=str(info["attempt"]))
    info.update(nodes=nodes, ntasks=ntasks, ntasks_per_node=per_node, master=f"{addr}:{port}", launch=argv)
    write_own(d, info)
    print(f"hpcml run: {ntasks} tasks on {fold(nodes)}, rendezvous {addr}:{port}, job directory {d}", file=sys.stderr)
    # its own session: a terminal's Ctrl-C reaches srun once, through the launcher; TERM
    # when the launcher dies (even by SIGKILL), on which srun kills its step
    proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    target = _Srun(proc, str(allocation.job_id), name)
    watch = _watch(opts, d, info, ntasks, exporter, recovery)
    lost = LostNodes(nodes) if recovery is not None and recovery.left else None
    with forwarding(lambda: (target,), FORWARDED) as seen:
        _replay(pending, seen, [target])
        _prefetch_report(opts)                          # srun passes them on to every task
        state: dict[str, float] = {}
        while proc.poll() is None:
            if lost is not None and lost.poll() and "stop_at" not in state:
                for n, v in lost.lost.items():
                    watch.stopping("node", f"node {n} lost ({v['state']})", v["seen"], node=n)
                _stop([target], state, info)            # the step's tasks, then srun after the grace
            if watch.poll() == "stop":
                _stop([target], state, info)
            if _grace_over(opts, seen, state, info):
                proc.send_signal(signal.SIGTERM)        # srun: SIGKILL to every process of its step
            elif info.get("killed_after_grace") and time.monotonic() - state["stop_at"] > opts.kill_grace + LOST_WAIT:
                proc.kill()                             # srun waits for a lost node's tasks: it is not coming back
            time.sleep(POLL)
        rc = proc.returncode
    if lost is not None:
        if rc != 0 and not lost.lost:
            lost.poll(now=True)                         # srun ended first (its step's node failed)
        if lost.lost:
            info["lost_nodes"] = lost.lost
    _note_signals(info, seen)
    _watched(watch, info)
    return rc


class _Srun:
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


def _stop(targets: list, state: dict, info: dict) -> None:
    """hpcml run stops the attempt itself (a hang, a straggler, a lost node): TERM now, the
    kill grace counts from here, and run.json says it was stopped, not failed."""
    for t in targets:
        t.send_signal(signal.SIGTERM)
    state.setdefault("stop_at", time.monotonic())
    info.setdefault("stopped_at", time.time())


def _replay(pending: list[int], seen: list[int], targets: list) -> None:
    """Signals that came while the attempt was being launched (``--max-restarts``' handler
    noted them; none ran yet to forward them to): forwarded now, as if just received."""
    for sig in pending:
        seen.append(sig)
        for t in targets:
            t.send_signal(sig)
    pending.clear()


def _grace_over(opts: Options, seen: list[int], state: dict, info: dict) -> bool:
    """True once, ``--kill-grace`` seconds after the first TERM or INT (or a failed local
    rank, ``state["stop_at"]``): time for SIGKILL; run.json says it came to that."""
    if "stop_at" not in state:
        if not any(s in STOPPING for s in seen):
            return False
        state["stop_at"] = time.monotonic()
    if info.get("killed_after_grace") or time.monotonic() - state["stop_at"] < opts.kill_grace:
        return False
    info["killed_after_grace"] = True
    return True


def _note_signals(info: dict, seen: list[int]) -> None:
    if seen:
        info["signals_forwarded"] = [signal.Signals(s).name for s in seen]


def _prefetch_report(opts: Options) -> None:
    """While the tasks run, import what the report needs (pyarrow, numpy, the builders):
    the launcher is idle then, and the report at the end costs only its own work."""
    if not opts.report:
        return

    def load() -> None:
        try:
            import hpcml.observe.html  # noqa: F401
            import hpcml.observe.report  # noqa: F401
            import hpcml.observe.store  # noqa: F401
            import hpcml.run.report  # noqa: F401
            import hpcml.score.html  # noqa: F401
            import hpcml.score.importers.store  # noqa: F401
            import hpcml.score.report  # noqa: F401
        except Exception:  # noqa: BLE001 - the report will say what is missing
            pass
    import threading
    threading.Thread(target=load, daemon=True).start()


class _Wrapper:
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


def _local(opts: Options, d: Path, task: list[str], info: dict, exporter: Any, pending: list[int],
           recovery: Recovery | None) -> int:
    n = opts.ntasks or _gpus_here() or 1
    port = free_port("127.0.0.1")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if base.get(FARM_JOB):                  # ranks see no job: still the farm task (taskenv.current)
        base[FARM_JOB] = ""
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                TORCHELASTIC_RUN_ID=f"hpcml-run-{os.getpid()}", TORCHELASTIC_RESTART_COUNT=str(info["attempt"]))
    info.update(nodes=[info["allocation"][0]], ntasks=n, ntasks_per_node=n, master=f"127.0.0.1:{port}",
                launch=[f"{n} x", *task])
    write_own(d, info)
    print(f"hpcml run: {plural(n, 'local task')}, rendezvous 127.0.0.1:{port}, job directory {d}", file=sys.stderr)
    # a wrapper killed on its own (kill -9, a crash) leaves what its rank started: a
    # subreaper, we adopt it and kill it (_kill_orphans)
    become_subreaper()
    # each wrapper: its own session (Ctrl-C reaches it once, forwarded), STOP when we die
    procs = [subprocess.Popen(task, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, start_new_session=True,
                              preexec_fn=lambda: die_with_parent(STOP))
             for r in range(n)]
    _prefetch_report(opts)
    watch = _watch(opts, d, info, n, exporter, recovery)
    rc, state = 0, {}  # type: tuple[int, dict[str, float]]
    with forwarding(lambda: [_Wrapper(p) for p in procs], FORWARDED) as seen:
        _replay(pending, seen, [_Wrapper(p) for p in procs])
        while procs:
            if watch.poll() == "stop":
                _stop(procs, state, info)
            for p in list(procs):
                code = p.poll()
                if code is None:
                    continue
                procs.remove(p)
                if code < 0:                              # killed: what its rank started is ours now
                    _kill_orphans({q.pid for q in procs})
                if code != 0 and rc == 0:
                    rc = code
                    for other in procs:                   # as srun --kill-on-bad-exit does
                        other.send_signal(signal.SIGTERM)
                    state.setdefault("stop_at", time.monotonic())     # and SIGKILL after the grace period
            if _grace_over(opts, seen, state, info):
                for p in procs:
                    p.send_signal(STOP)
            time.sleep(POLL)
    _kill_orphans(set(), reap=True)                       # every wrapper has ended: nothing may be left
    _note_signals(info, seen)
    _watched(watch, info)
    return rc


def _exporter(opts: Options, info: dict) -> Any:
    """``--prometheus-port``: one endpoint for every attempt of the job."""
    if opts.prometheus_port is None:
        return None
    from hpcml.run.watchexport import WatchExporter
    try:
        return WatchExporter(opts.prometheus_port, opts.prometheus_addr, str(info.get("job_id") or "local"))
    except OSError as exc:
        print(f"hpcml run: --prometheus-port {opts.prometheus_port}: cannot serve ({exc.strerror}); the job runs "
              "without the endpoint", file=sys.stderr)
        return None


def _watch(opts: Options, d: Path, info: dict, world: int, exporter: Any, recovery: Recovery | None) -> Watch:
    return Watch(d, int(info.get("attempt") or 0), world, timeout=hang_seconds(opts.hang_timeout),
                 on_hang=opts.on_hang, exporter=exporter, on_straggler=opts.on_straggler,
                 can_replace=recovery.can_replace if recovery is not None else None)


def _watched(watch: Watch, info: dict) -> None:
    """The job ended: the crashes the last scan missed, and what the watch saw, into run.json."""
    watch.finish()
    info.update(watch.to_json())


def _kill_orphans(wrappers: set[int], reap: bool = False, rounds: int = 100) -> None:
    """SIGKILL what the rank of a wrapper killed on its own left running, re-parented here
    (``proctree.kill_orphans``). With ``reap`` (no wrapper left to reap by its Popen) until
    none is left, reaping them."""
    for _ in range(rounds):
        orphans, _ = kill_orphans(wrappers)
        if not orphans or not reap:
            return
        for child in orphans:
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass


def first_failure(d: Path, attempt: int = 0, requeued: bool = False) -> dict | None:
    """The rank that failed first (by when its command ended), from the recorder's metadata.
    ``requeued``: the ranks that Slurm's requeue ended (TERM, SIGKILL) did not fail."""
    failed = []
    for m in rank_meta(d, attempt):
        ec = m.get("exit_code")
        if isinstance(ec, int) and ec != 0 and not (requeued and ec in requeue.KILLED_BY_REQUEUE):
            failed.append((m.get("end") or float("inf"), m.get("rank"), ec, m.get("node")))
    if not failed:
        return None
    end, rank, ec, node = min(failed, key=lambda f: (f[0], f[1] if f[1] is not None else 0))
    return {"rank": rank, "exit_code": ec, "node": node, "end": end, "failed_ranks": len(failed)}


def _requeued(d: Path, record: dict, ask_slurm: bool) -> dict | None:
    attempt = int(record.get("attempt") or 0)
    return requeue.find(attempt_dir(d, attempt), record.get("job_id"), restart_of(record), ask_slurm)


def _concluded(d: Path, prev: dict, restart: int) -> dict:
    """The previous attempt's record, completed where its launcher did not get to (Slurm's
    requeue kills it ``KillWait`` seconds after TERM): requeued it was, since this attempt
    runs under a higher restart count."""
    prev = {k: v for k, v in prev.items() if k != "schema"}
    if prev.get("requeued") is not None:
        return prev
    attempt = int(prev.get("attempt") or 0)
    prev["requeued"] = _requeued(d, prev, ask_slurm=False) or {"by": "slurm", "restart_count": restart}
    # its launcher's own ending stands unless the requeue's 143/137 made it: a vet abort (4)
    # or an srun that could not launch (no rank recorded) was the attempt's own exit
    if prev.get("ended") is None or prev.get("exit_code") in requeue.KILLED_BY_REQUEUE:
        first = first_failure(d, attempt, requeued=True)   # the ranks the requeue stopped did not fail
        prev.update(exit_code=first["exit_code"] if first else 0, first_failure=first)
    if prev.get("ended") is None:
        ends = [m["end"] for m in rank_meta(d, attempt) if isinstance(m.get("end"), (int, float))]
        prev.update(ended=max(ends, default=None), end_recorded_by_next_attempt=True)
    return prev


def _finish(d: Path, info: dict, rc: int) -> int:
    """The exit code is the first failing rank's; in an attempt that was requeued the ranks
    the requeue stopped are not failures, and with none other it is 0."""
    asked = info["mode"] == "slurm" and (rc != 0 or "SIGTERM" in info.get("signals_forwarded", ()))
    requeued = _requeued(d, info, ask_slurm=asked)
    first = first_failure(d, int(info.get("attempt") or 0), requeued=requeued is not None)
    code = first["exit_code"] if first else (0 if requeued else rc)
    if (info.get("hang") or {}).get("action") == "stop":
        code = HANG                                       # the watch stopped a hung job
    info.update(ended=time.time(), exit_code=code, first_failure=first, launcher_exit_code=rc, requeued=requeued)
    if not write_own(d, info):
        info["superseded"] = True
        print(f"hpcml run: {d} now holds a later attempt of this job (Slurm requeued it while this launcher still "
              "ran); this attempt's end is not written there", file=sys.stderr)
    if requeued:
        print(f"hpcml run: attempt {info.get('attempt') or 0} {requeue.describe(requeued)}; Slurm runs the job "
              f"again, as the next attempt in {d}", file=sys.stderr)
    if first and code != HANG and not info.get("stopped_at"):     # the ranks it stopped did not fail
        err = log_path(d, int(first["rank"] or 0), "err")
        print(f"hpcml run: rank {first['rank']} failed first (exit {first['exit_code']}); see {err}", file=sys.stderr)
        last = next((line for line in reversed(tail(err, 5)) if line.strip()), "")
        if last:
            print(f"  {last.strip()}", file=sys.stderr)          # the cause, e.g. a command that cannot start
    return code


def _resumed(d: Path, info: dict) -> None:
    """How the attempt before this one, restarted after a fault, was resumed by this one
    (``recovery.resume_of``), into that attempt's ``restart`` record."""
    earlier = info.get("attempts") or []
    restart = (earlier[-1].get("restart") or {}) if earlier else {}
    if restart.get("action") != "restart":
        return
    restart["resumed"] = resume_of(d, earlier[-1], info)
    write_own(d, info)
