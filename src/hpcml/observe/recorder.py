"""``hpcml observe record -- cmd``: run one task's command and record it.

The recorder is the only writer of its rank's file: it samples the host and this task's
GPUs every interval, and copies the batches the wrapped process sends through
``observe.log`` (a pipe passed as ``HPCML_OBSERVE_FD``) into the same stream. Signals
Slurm sends to the task (TERM at the time limit, INT, HUP, USR1/USR2 for pre-emption
warnings, CONT) are forwarded to the command, and the recorder exits with the command's
exit code (128 + signal number when a signal ended it, as a shell does).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcml import logs
from hpcml.arrowprobe import skip_pandas
from hpcml.cluster.allocation import task_gpus, this_node
from hpcml.cluster.ranks import ranks
from hpcml.errors import UsageError
from hpcml.observe.beat import GPU_UUID, MAX_GPUS, BeatWriter, Progress
from hpcml.observe.oom import oom_kills
from hpcml.observe.store import JOB_META, JOB_SCHEMA, RANK_META, RANK_SCHEMA, RankWriter, earlier_runs, write_json
from hpcml.proctree import ExitWatch
from hpcml.samplers.clockreasons import slowdown
from hpcml.samplers.gpuuse import ALONE_KEY, LOST, USED_KEY, GpuUse, UseTracker, alone_on_node, owns_sampled
from hpcml.signals import SLURM_SIGNALS, forwarding

if TYPE_CHECKING:
    from hpcml.observe.export import PromExporter, PromForwarder
    from hpcml.observe.remotewrite import Config as RemoteConfig
    from hpcml.samplers.choose import TaskGpus
    from hpcml.samplers.host import HostSampler

log = logs.get(__name__)

FORWARDED = (*SLURM_SIGNALS, signal.SIGINT)        # Slurm signals a task's INT to the task alone
MIN_INTERVAL = 0.1


@dataclass
class Task:
    """Who this task is, from Slurm's (or torchrun's) environment."""

    rank: int
    local_rank: int
    node: str
    gpus: tuple[str, ...]
    job_id: str
    ntasks: int
    nodes: str
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls, env=os.environ) -> Task:
        who = ranks(env, dist=False)        # the recorder runs beside the program, not in it
        return cls(rank=who.rank, local_rank=who.local_rank,
                   node=this_node(env), gpus=task_gpus(env), job_id=env.get("SLURM_JOB_ID", "local"),
                   ntasks=who.world_size,
                   nodes=env.get("SLURM_JOB_NODELIST", this_node(env)))


def default_dir(task: Task) -> Path:
    return Path(f"hpcml-observe-{task.job_id}")


def _contention(host: HostSampler) -> dict[str, float | None]:
    """What the watch needs to tell a rank slowed by its node's CPUs from a slow rank: the
    seconds its threads waited for a CPU (the host sampler's last ``proc_cpu_wait_s``, read
    once a sample) and the node's stolen seconds per CPU (psutil's ``steal``: a virtual
    machine's hypervisor), and the seconds its cores ran throttled for heat where the kernel
    counts it (``samplers.cputhermal``), all cumulative; and while the rank has worker processes, how many,
    its cores and their CPU use (``hpcml.observe.loadercores``)."""
    import psutil
    try:
        steal = getattr(psutil.cpu_times(), "steal", None)
        steal = None if steal is None else steal / (psutil.cpu_count() or 1)     # per CPU: a share of time
    except (OSError, psutil.Error):
        steal = None
    from hpcml.samplers.cputhermal import throttled_s
    out: dict[str, float | None] = {"cpu_wait_s": host.waited, "steal_s": steal}
    hot = throttled_s(host.proc.pid)          # the kernel's thermal throttle counters of its cores
    if hot is not None:
        out["cpu_throttled_s"] = hot
    if host.loader is not None and host.loader[0]:          # only while the rank has workers
        workers, cores, busy = host.loader
        out.update(workers=workers, cores=cores, workers_cpu_percent=None if busy is None else round(busy, 1))
    return out


class _Throttle:
    """The seconds the GPUs this rank uses had their clocks held back for power or heat (a
    slowdown reason in ``clocks_event_reasons``; each sample that shows one counts the time
    since the one before), and which reasons were seen: cumulative, for the heartbeat, so that
    the watch tells a rank slowed by its GPU's surroundings from a slow rank.

    Only the rank's own GPUs count, as the GPU sees it: those NVML showed its processes on
    (``samplers.gpuuse``, whose reads of their reasons count too), or the GPU its recorder
    samples where the rank can see that one only or runs alone on its node (``owns_sampled``). The GPUs its recorder samples
    for the other ranks of its node count for none of it. None (unknown, not 0) while no GPU
    is known to be the rank's or no reasons were read, and from the moment a GPU of the rank's
    is lost (``gpuuse.LOST``): what it did then is not known.

    The same GPUs name the rank in the heartbeat (``gpu_uuids``): by UUID, the one name a
    GPU has on every node and in every numbering, so that the watch names a straggler's GPU
    as the GPU sees it. ``uuids``: the rank metadata's NVML index -> UUID of the GPUs its
    recorder samples."""

    def __init__(self, one_gpu: bool = False, uuids: Mapping[str, Any] | None = None) -> None:
        self.one_gpu = one_gpu
        self.seconds: float | None = None
        self.mask = 0
        self.lost = False
        self._last: int | None = None
        self._uuids = uuids if isinstance(uuids, Mapping) else {}
        self.gpus: list[str] = []            # the UUIDs of the GPUs proven the rank's, as they were proven

    def add(self, ts: int, rows: list[tuple], use: GpuUse | None = None) -> None:
        masks: dict[int | None, int] = {}
        lost: set[int | None] = set(use.lost) if use is not None else set()
        sampled: set[int | None] = set()
        for r in rows:
            if r[1] != "gpu":
                continue
            sampled.add(r[5])
            if r[2] == "clocks_event_reasons":
                masks[r[5]] = masks.get(r[5], 0) | slowdown(r[3])
            elif r[2] == LOST:
                lost.add(r[5])
        if use is not None:
            for i, m in use.reasons.items():
                masks[i] = masks.get(i, 0) | slowdown(m)
        mine: set[int | None] = set(use.used) if use is not None else set()
        if self.one_gpu:
            mine |= sampled                       # its recorder samples the one GPU it can see
        self._name(mine, use)
        if mine & lost:
            self.lost = True
        known = [masks[i] for i in mine if i in masks]
        if known and not self.lost:
            held = 0
            for m in known:
                held |= m
            self.seconds = (self.seconds or 0.0) + (max(0, ts - self._last) / 1e9 if held and self._last is not None else 0.0)
            self.mask |= held
        self._last = ts

    def _name(self, mine: set[int | None], use: GpuUse | None) -> None:
        """Each of ``mine`` by its UUID: from what NVML showed the rank's processes on, else
        from the sampler's; one whose UUID NVML did not give, or not in NVML's form (the
        heartbeat's reader would refuse the whole record), is left out (never a guess)."""
        named: list[str] = []
        for i in sorted(x for x in mine if x is not None):
            seen = use.used.get(i) if use is not None else None
            uuid = seen.uuid if seen is not None and seen.uuid else self._uuids.get(str(i))
            if isinstance(uuid, str) and GPU_UUID.fullmatch(uuid) and uuid not in named:
                named.append(uuid)
        self.gpus += [u for u in named if u not in self.gpus]      # once proven, a GPU stays the rank's

    def beat(self) -> dict[str, float | int | list[str] | None]:
        return {"gpu_throttled_s": None if self.seconds is None or self.lost else round(self.seconds, 3),
                "gpu_throttle": self.mask or None, "gpu_uuids": self.gpus[:MAX_GPUS] or None}


def _copy_app_stream(read_fd: int, writer: RankWriter, lock: threading.Lock, stats: dict,
                     exporter=None, sink=None, progress: Progress | None = None, remote=None) -> None:
    """Move the wrapped process's batches into the rank file until it closes the pipe."""
    import pyarrow as pa
    with os.fdopen(read_fd, "rb") as pipe:
        try:
            reader = pa.ipc.open_stream(pipe)
            for batch in reader:
                with lock:
                    writer.write_batch(batch)
                    if exporter is not None:
                        exporter.update_batch(batch)
                    if progress is not None:
                        progress.update_batch(batch)
                if sink is not None:          # a queue put: the MLflow thread does the sending
                    sink.update_batch(batch)
                if remote is not None:        # an append: the remote-write thread sends
                    remote.update_batch(batch)
                stats["app_batches"] += 1
        except (pa.ArrowInvalid, OSError, StopIteration):
            pass        # the process never logged, or died mid-batch: keep what arrived


def record(cmd: list[str], job_dir: Path | None = None, interval: float = 1.0,
           gpu_sampler: bool = True, prometheus_port: int | None = None,
           prometheus_addr: str = "127.0.0.1", gpu_metrics: str = "auto", mlflow: str | None = None,
           exec_via: Sequence[str] = (), remote_write: str | None = None, remote_write_job_label: bool | None = None,
           remote_write_max_series: int | None = None, preexec: Callable[[], None] | None = None) -> int:
    """``gpu_metrics``: auto (DCGM, else GPM, else NVML), dcgm, gpm, nvml or none; see
    ``hpcml.samplers.choose``. ``gpu_sampler=False`` is ``none``. ``mlflow``: the URL of an
    MLflow tracking server; rank 0's metrics go to a run there (``hpcml.observe.mlflow_rest``).
    ``exec_via``: a step that sets the process up and execs ``cmd`` (``hpcml.run.rankexec``);
    what is recorded as the command stays ``cmd``, what the user asked for. ``preexec``: the same set-up
    done between the fork and the exec of ``cmd`` itself (``rankexec.become_rank``). ``remote_write``: the
    URL of a Prometheus remote-write receiver (else ``HPCML_REMOTE_WRITE``; ``hpcml.observe.remotewrite``)."""
    from hpcml.samplers.choose import for_task
    if not cmd:
        raise UsageError("no command to record, e.g. ['python', 'train.py']", key="cmd")
    if interval < MIN_INTERVAL:
        raise UsageError(f"must be at least {MIN_INTERVAL} s, got {interval}", key="interval")
    remote = None
    if remote_write or os.environ.get("HPCML_REMOTE_WRITE"):
        from hpcml.observe.remotewrite import config
        remote = config(remote_write, job_label=remote_write_job_label, max_series=remote_write_max_series)
    task = Task.from_env()
    mode = gpu_metrics if gpu_sampler else "none"
    gpu = _Gpus(lambda: for_task(mode, task.gpus, interval))
    if remote is not None or mode not in ("auto", "none"):
        # the remote-write series budget counts the GPUs before anything starts, and a sampler
        # asked for by name that is not there is exit 2 before the command starts, not after
        gpu.open()
    try:
        return _record(cmd, task, gpu, job_dir, interval, prometheus_port, prometheus_addr, mlflow,
                       list(exec_via), remote, preexec)
    finally:
        gpu.close()


class _Gpus:
    """The task's GPU sampler, opened when first wanted: after the command has started, so
    that its open (NVML, GPM, a DCGM connection: 158 ms on an H100 with GPM,
    tests/fixtures/gpu/table.txt) is off the rank's start; ``open_s`` is what it took."""

    def __init__(self, opener: Callable[[], TaskGpus]) -> None:
        self._opener = opener
        self.got: TaskGpus | None = None
        self.open_s: float | None = None
        self.opened_at: float | None = None

    def open(self) -> TaskGpus:
        if self.got is None:
            t = time.perf_counter()
            self.got = self._opener()
            self.open_s, self.opened_at = round(time.perf_counter() - t, 4), time.time()
        return self.got

    @property
    def meta(self) -> dict:
        """What the rank's metadata says of it, with when it opened and what that took."""
        got = self.open()
        return {**got.meta, "gpu_sampler_open_s": self.open_s, "gpu_sampler_opened": self.opened_at}

    def close(self) -> None:
        if self.got is not None:
            self.got.close()


def _warn(line: str) -> None:
    log.warning(f"hpcml observe record: warning: {line}")


class _NoRemote:
    """Remote write off: hooks that do nothing."""

    def update(self, rows) -> None:
        pass

    def update_batch(self, batch) -> None:
        pass

    def close(self) -> dict:
        return {}


def _remote(cfg: RemoteConfig | None, task: Task, gpu_meta: dict, interval: float):
    if cfg is None:
        return _NoRemote()
    from hpcml.observe.remotewrite import for_task
    return for_task(cfg, task, gpu_meta, interval, _warn)


def _gpu_sampler(gpu: _Gpus, rank_meta: dict, path: Path, started: float) -> list:
    """The GPU sampler, opened now if not before (the command running: off its start), and
    the rank's metadata rewritten with what it is, when it opened and what that took."""
    if "gpu_sampler" not in rank_meta:
        try:
            rank_meta.update(gpu.meta, command_started=started)
        except Exception as exc:  # noqa: BLE001 - the command runs: it goes on without GPU rows
            _warn(f"no GPU sampling: {type(exc).__name__}: {exc}")
            rank_meta.update(gpu_sampler={"kind": "none", "saturation": False, "note": f"could not open: {exc}"},
                             command_started=started)
            write_json(path, rank_meta)
            return []
        write_json(path, rank_meta)
    sampler = gpu.open().sampler
    return [sampler] if sampler is not None else []


class _Uses:
    """Which GPUs of the node the rank's processes use (``samplers.gpuuse``), followed from
    the first sample on; the rank's metadata names them (``gpus_used``: ``changed`` says when
    to write it again). Not followed where GPU sampling is off or no GPU is visible."""

    def __init__(self, rank_meta: dict, root: int) -> None:
        from hpcml.samplers import NONE_VISIBLE, OFF
        self.meta = rank_meta
        self.root = root
        self.changed = False
        self.tracker: UseTracker | None = None
        self._open = (rank_meta.get("gpu_sampler") or {}).get("reason") not in (OFF, NONE_VISIBLE)

    def sample(self, ts: int, rows: list[tuple]) -> GpuUse | None:
        self.changed = False
        if self._open:              # opened at the first sample: off the command's start, like the sampler
            from hpcml.samplers.gpuuse import open_tracker
            self._open, self.tracker = False, open_tracker(self.root)
        if self.tracker is None:
            return None
        try:
            use = self.tracker.sample()
        except Exception as exc:  # noqa: BLE001 - one bad read must not stop recording
            rows.append((ts, "problem", "sampler_error_UseTracker", 1.0, None, None))
            log.debug("hpcml observe record: the GPUs' processes were not read: %s", exc)
            return None
        used = [g.to_json() for g in use.used.values()]
        if used != self.meta.get(USED_KEY, []):
            self.meta[USED_KEY], self.changed = used, True
        return use

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()


def _record(cmd: list[str], task: Task, gpu: _Gpus, job_dir: Path | None, interval: float,
            prometheus_port: int | None, prometheus_addr: str, mlflow: str | None = None,
            exec_via: list[str] | None = None, remote_cfg: RemoteConfig | None = None,
            preexec: Callable[[], None] | None = None) -> int:
    # the series budget: checked before anything is written (the GPUs opened already, for it)
    remote = _remote(remote_cfg, task, gpu.meta if remote_cfg is not None else {}, interval)
    out = Path(job_dir) if job_dir else default_dir(task)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    job_meta = {"schema": JOB_SCHEMA, "job_id": task.job_id, "nodes": task.nodes, "ntasks": task.ntasks,
                "command": cmd, "start": started, "interval": interval}
    if (parallelism := os.environ.get("HPCML_PARALLELISM")) in ("data", "roles"):
        job_meta["parallelism"] = parallelism     # how ranks share the work: the report's advice
    if task.rank == 0:
        write_json(out / JOB_META, job_meta)
    rank_meta_path = out / RANK_META.format(rank=task.rank)
    rank_meta = {"schema": RANK_SCHEMA, "rank": task.rank, "local_rank": task.local_rank, "node": task.node,
                 "host": socket.gethostname(), "gpus": list(task.gpus), "command": cmd,
                 "start": started, ALONE_KEY: alone_on_node(os.environ), **(gpu.meta if gpu.got is not None else {})}
    if earlier := earlier_runs(rank_meta_path):       # the same store again: a requeued job
        rank_meta["earlier"] = earlier
    write_json(rank_meta_path, rank_meta)

    exporter: PromExporter | PromForwarder | None = None
    if prometheus_port is not None:
        from hpcml.observe.export import PromExporter, PromForwarder
        if task.local_rank == 0:
            try:
                exporter = PromExporter(prometheus_port, prometheus_addr, job=task.job_id,
                                        rank=task.rank, node=task.node)
            except OSError as exc:
                raise UsageError(f"cannot serve metrics on {prometheus_addr}:{prometheus_port}: "
                                 f"{exc.strerror}", key="prometheus_port") from None
            rank_meta["prometheus"] = f"{prometheus_addr}:{prometheus_port}"
        else:
            exporter = PromForwarder(prometheus_port, rank=task.rank, job=task.job_id)
    sink = None
    if mlflow and task.rank == 0:
        from hpcml.observe.mlflow_rest import MlflowSink
        from hpcml.observe.mlflow_run import describe
        run = describe(cmd, out, task.job_id, task.nodes, os.environ)
        for problem in run.problems:           # the run is still made, without the task's params
            log.info(f"hpcml observe record: MLflow: {problem}")
        sink = MlflowSink(mlflow, experiment=os.environ.get("MLFLOW_EXPERIMENT_NAME", "hpcml"),
                          run_name=run.name, tags=run.tags, params=run.params,
                          warn=_warn)
    lock = threading.Lock()
    stats = {"app_batches": 0}
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, HPCML_OBSERVE_FD=str(write_fd), HPCML_OBSERVE_DIR=str(out))
    ooms = oom_kills(os.getpid())              # the rank's cgroup is this process's: its OOM kills so far
    try:        # the command starts first: the store's imports (pyarrow) overlap its start-up
        child = subprocess.Popen([*(exec_via or []), *cmd], env=env, pass_fds=(write_fd,), preexec_fn=preexec)
        started_cmd = time.time()
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(read_fd)
        os.close(write_fd)
        if exporter is not None:
            exporter.close()
        remote.close()
        raise UsageError(f"cannot start the command: {getattr(exc, 'strerror', None) or exc}", key=cmd[0]) from None
    os.close(write_fd)
    # forward Slurm's signals from the moment the command runs (before the store's imports)
    stack = ExitStack()
    stack.enter_context(forwarding(lambda: (child,), FORWARDED))
    skip_pandas(numpy=True)             # before the store's first array: nor numpy here (hpcml.arrowprobe)
    # what only watches the running command is imported once it runs (psutil, py-spy's caller)
    from hpcml.observe.snapshot import Responder
    from hpcml.samplers.host import HostSampler
    writer = RankWriter.create(out, task.rank)
    progress, beat, responder = Progress(), BeatWriter(out, task.rank, task.node), Responder(out, task.rank, child.pid)
    copier = threading.Thread(target=_copy_app_stream, args=(read_fd, writer, lock, stats, exporter, sink, progress, remote),
                              daemon=True)
    copier.start()

    host = HostSampler(child.pid, node_wide=task.local_rank == 0)
    samplers = [host, *_gpu_sampler(gpu, rank_meta, rank_meta_path, started_cmd)]
    throttle = _Throttle(owns_sampled(rank_meta), rank_meta.get("gpu_uuids"))
    uses = _Uses(rank_meta, child.pid)
    contention: dict[str, Any] = {}
    ended = ExitWatch(child.pid, child)         # its end noticed at once, not at the next 50 ms poll
    try:
        while True:
            ended.wait(interval)
            if (rc := child.poll()) is not None:
                break
            rows = []
            ts = time.time_ns()
            for s in samplers:
                try:
                    rows += s.sample(ts)
                except Exception:  # noqa: BLE001 - one bad read must not stop recording
                    rows.append((ts, "problem", f"sampler_error_{type(s).__name__}", 1.0, None, None))
            use = uses.sample(ts, rows)
            if uses.changed:
                write_json(rank_meta_path, rank_meta)       # the report credits that GPU's rows to this rank
            throttle.add(ts, rows, use)
            contention = {**_contention(host), **throttle.beat()}
            with lock:
                writer.write_rows(rows)
                if exporter is not None:
                    exporter.update(rows)
                beat.write(progress, pid=child.pid, snapshot=responder.handled, **contention)
            remote.update(rows)
            responder.poll()
    finally:
        uses.close()
        ended.close()
        stack.close()
        copier.join(timeout=10)
        with lock:
            writer.close()
            rc_now = child.poll()
            beat.write(progress, pid=child.pid, snapshot=responder.handled,
                       exit=None if rc_now is None else (rc_now if rc_now >= 0 else 128 - rc_now),
                       **({"signal": -rc_now} if rc_now is not None and rc_now < 0 else {}), **contention)
        beat.close()
        if exporter is not None:
            exporter.close()
        rank_meta.update(remote.close())
    code = rc if rc >= 0 else 128 - rc           # killed by signal n: 128 + n, as a shell says
    if sink is not None:
        sink.close("FINISHED" if code == 0 else "FAILED")
        rank_meta["mlflow"] = {"url": mlflow, "run_id": sink.run_id, "run_name": run.name, "sent": sink.sent,
                               "dropped": sink.dropped, "errors": sink.errors, "problems": run.problems,
                               "unreachable": sink.problem if sink.run_id is None else None}
    rank_meta.update(end=time.time(), exit_code=code, app_batches=stats["app_batches"])
    if rc < 0:
        rank_meta["signal"] = -rc
        if rc == -signal.SIGKILL and ooms is not None and (now := oom_kills(os.getpid())) is not None and now > ooms:
            rank_meta["oom_kill"] = True       # the kernel's OOM killer killed a process of its cgroup meanwhile
    write_json(rank_meta_path, rank_meta)
    if task.rank == 0:
        write_json(out / JOB_META, {**job_meta, "end": time.time()})
    return code
