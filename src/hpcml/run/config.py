"""``hpcml run``'s options, validated once into a frozen ``Config``.

Why frozen: the launcher, its backends and the recovery read the options for the whole job;
none may change them on the way (the old launcher rewrote ``--gpus-per-task`` inside the
srun path and put ``--remote-write`` into its own environment). Every option is declared
once, in ``Options`` (its default, option string and help; both parsers are built from it);
``Config.of`` checks them against the allocation and derives what is parsed (the hang
timeout in seconds, the collector's URL, the ranks' extra environment).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hpcml.errors import UsageError
from hpcml.optspec import argument, option
from hpcml.urls import is_http_url
from hpcml.words import plural

URL_ENV = "HPCML_COLLECTOR"


def collector_url(value: str | None, key: str = "--collector") -> str | None:
    """The collector's base URL (``--collector``, else ``$HPCML_COLLECTOR``), or None.
    Anything but http(s)://HOST[:PORT] is bad input (exit 2)."""
    import os
    url = value if value is not None else os.environ.get(URL_ENV) or None
    if url is None:
        return None
    named = key if value is not None else URL_ENV
    if not is_http_url(url):
        raise UsageError(f"expected an http(s)://HOST[:PORT] URL of hpcml centre serve, found {url!r}", key=named)
    return url.strip().rstrip("/")

HANG = 5                      # `hpcml run`'s exit code when it stopped a hung job (hpcml.run.watch)
ON_HANG = ("stop", "report")  # what --on-hang takes


@dataclass(frozen=True)
class Options:
    """The command line of ``hpcml run``: every option declared once, here (its type, default,
    option string and help), and both of its parsers built from it (``hpcml.optspec``: the
    Typer command in ``hpcml.run.cli``, the fast path's argparse in ``hpcml.run.fastrun``).
    The order is --help's."""

    cmd: list[str] = argument(rest=True, help="The training command, after --.")
    job_dir: Path | None = option("--dir", help="Job directory (default: ./hpcml-run-$SLURM_JOB_ID, "
                                  "without Slurm a new ./hpcml-run-local-DATE-TIME-PID).")
    vet: Path | None = option("--vet", help="Vet the nodes with this protocol first "
                              "(abort: exit 4; shrink: run on the good ones); auto[:PROTOCOL]: as much of it "
                              "as the job is worth (its nodes, time left, the centre's failure rates).")
    min_nodes: int | None = option("--min-nodes", help="With --vet: fewer good nodes than this aborts.")
    ntasks: int | None = option("--ntasks", help="Tasks in all (local default: visible GPUs, else 1).")
    ntasks_per_node: int | None = option("--ntasks-per-node", help="Tasks per node under Slurm "
                                         "(default: the allocation's, else GPUs per node, else 1).")
    env: str | None = option("--env", help="Run every task in this EDF's container (hpcml env run).")
    gpus_per_task: int | None = option("--gpus-per-task", help="GPUs bound to each task by srun "
                                       "(default: 1 when tasks are one per GPU).")
    interval: float = option("--interval", default=1.0, help="Seconds between host/GPU samples.")
    gpu_metrics: str = option("--gpu-metrics", default="auto", help="The ranks' GPU sampler: auto (DCGM, else NVML "
                              "GPM, else NVML), dcgm, gpm, nvml, a site's (hpcml.samplers), or none.")
    report: bool = option("--no-report", default=True,       # write report.html and print the summary at the end
                          help="Do not print the report or write report.html at the end.")
    mlflow: str | None = option("--mlflow", help="Send rank 0's metrics to this MLflow tracking server "
                                "(hpcml service up mlflow), from a background thread.")
    kill_grace: float = option("--kill-grace", default=10.0, help="Seconds between TERM (or INT) and SIGKILL of "
                               "every rank and what it started.")
    overwrite: bool = option("--overwrite", default=False, help="Replace the finished job that --dir holds "
                             "(without it such a directory is refused).")
    hang_timeout: str = option("--hang-timeout", default="auto", help="A hang: no rank completed a step for this "
                               "long, e.g. '10 min' (auto: 10 x the median step time, at least 120 s; off).")
    on_hang: str = option("--on-hang", default="stop", help="stop: name the culprits, stop the job, exit 5; "
                          "report: name them and let the job go on.")
    prometheus_port: int | None = option("--prometheus-port", help="Serve the watch's verdicts "
                                         "(stragglers, hang, crashes, furthest step) for Prometheus here.")
    prometheus_addr: str = option("--prometheus-addr", default="127.0.0.1", help="Address for --prometheus-port.")
    max_restarts: int = option("--max-restarts", default=0, help="After a crash, a hang, a lost node (or a straggler "
                               "with --on-straggler restart): exclude the culprit's node and run again, up to "
                               "this many times, inside the allocation (0: never).")
    spare_nodes: int = option("--spare-nodes", default=0, help="Good nodes kept idle to replace excluded ones "
                              "(with --max-restarts).")
    revet: str | None = option("--revet", help="Vet a suspect node again with this protocol before "
                               "it may return (default: the --vet protocol; none: it stays out).")
    on_straggler: str = option("--on-straggler", default="report", help="report: name a straggler; restart: also "
                               "restart the job without its node (with --max-restarts).")
    straggler_window: str = option("--straggler-window", default="60s", help="The straggler model judges the last "
                                   "this long of steps while the job runs, and no verdict comes from less "
                                   "(live or in the report); e.g. '5 min'.")
    step_pattern: str | None = option("--step-pattern", help="A regular expression with one group around the step "
                                      "number rank 0 prints, e.g. 'iter (\\d+):' (nanoGPT): after a restart, the "
                                      "step the script resumed at and the steps it did again are read from it.")
    collector: str | None = option("--collector", help="Send the job's summary to this collector "
                                   "(hpcml centre serve; default $HPCML_COLLECTOR; token $HPCML_COLLECTOR_TOKEN "
                                   "or $HPCML_VET_TOKEN). Down: kept in JOBDIR/summary for hpcml report --send.")
    remote_write: str | None = option("--remote-write", help="Every rank pushes its node and rank "
                                      "series to this Prometheus remote-write URL (VictoriaMetrics, "
                                      "Prometheus; default $HPCML_REMOTE_WRITE).")


@dataclass(frozen=True)
class Config(Options):
    """``Options`` checked: ``hang_s`` parsed (None: auto), the collector's URL normalised
    (``--collector`` or ``$HPCML_COLLECTOR``), ``rank_env`` what every rank's environment
    gets besides the launcher's."""

    hang_s: float | None = None
    straggler_s: float = 60.0
    rank_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, opts: Options, nodes: int, local: bool = False) -> Config:
        """Validate ``opts`` for an allocation of ``nodes`` nodes (``local``: tasks on this
        machine, not srun): bad input is one ``UsageError`` naming the option (exit 2),
        before anything starts."""
        _check(opts, nodes)
        _check_restarts(opts, nodes, local)
        rank_env: dict[str, str] = {}
        if opts.remote_write is not None:          # checked now (URL, the remote extra), then passed to every rank
            from hpcml.observe.remotewrite import ENV_URL, config
            config(opts.remote_write)
            rank_env[ENV_URL] = opts.remote_write
        if opts.step_pattern is not None:          # checked now, then read by rank 0 (hpcml.observe.printedsteps)
            from hpcml.observe.printedsteps import ENV, compile_pattern
            try:
                compile_pattern(opts.step_pattern)
            except ValueError as exc:
                raise UsageError(f"{opts.step_pattern!r} {exc}", key="step_pattern") from None
            rank_env[ENV] = opts.step_pattern
        values: dict[str, Any] = asdict(opts)
        values.update(collector=collector_url(opts.collector), hang_s=hang_seconds(opts.hang_timeout),
                      straggler_s=straggler_seconds(opts.straggler_window),
                      rank_env=MappingProxyType(rank_env))
        return cls(**values)

    @property
    def revet_protocol(self) -> Path | None:
        """The suspects' protocol: ``--revet``, else ``--vet``'s; None with ``--revet none``."""
        return None if self.revet == "none" else Path(self.revet) if self.revet else self.vet_protocol

    @property
    def vet_auto(self) -> bool:
        """``--vet auto[:PROTOCOL]``: the vetting sized to the job (``hpcml.vet.autoplan``)."""
        return self.vet is not None and _auto(self.vet) is not False

    @property
    def vet_protocol(self) -> Path | None:
        """The protocol file ``--vet`` names (auto's: the one given, else the built-in)."""
        return vet_protocol(self.vet)


def _auto(vet: Path) -> Path | None | bool:
    """False: not auto; None: auto with the built-in protocol; a Path: auto with that one."""
    from hpcml.vet.autoplan import split
    try:
        return split(str(vet))
    except ValueError:
        return False


def vet_protocol(vet: Path | None) -> Path | None:
    if vet is None:
        return None
    auto = _auto(vet)
    if auto is False:
        return vet
    from hpcml.vet.autoplan import builtin_protocol
    return auto if isinstance(auto, Path) else builtin_protocol()


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


def straggler_seconds(value: str) -> float:
    """``--straggler-window``: a duration of at least 1 s. Why a window and a floor in one:
    the model judges the last window of steps, and gives no verdict from less (a few seconds
    of a job are its start-up; NVRx reports every 60 s by default, too)."""
    from hpcml.units import parse_seconds
    try:
        seconds = parse_seconds(str(value).strip())
    except (UsageError, ValueError) as exc:
        raise UsageError(f"{value!r} is not a duration such as '60 s' ({exc})", key="straggler_window") from None
    if not 1 <= seconds < float("inf"):
        raise UsageError(f"must be at least 1 s, got {value!r}", key="straggler_window")
    return seconds


def _check(opts: Options, nodes: int) -> None:
    if not opts.cmd:
        raise UsageError("no command to run: hpcml run [options] -- python train.py", key="cmd")
    if opts.min_nodes is not None and opts.min_nodes > nodes:
        raise UsageError(f"{opts.min_nodes} is more than the allocation's {nodes} nodes", key="min_nodes")
    for key in ("ntasks", "ntasks_per_node", "min_nodes", "gpus_per_task"):
        v = getattr(opts, key)
        if v is not None and v < 1:
            raise UsageError(f"must be at least 1, got {v}", key=key)
    if opts.interval < 0.1:
        raise UsageError(f"must be at least 0.1 s, got {opts.interval}", key="interval")
    if opts.kill_grace < 0:
        raise UsageError(f"must be at least 0 s, got {opts.kill_grace}", key="kill_grace")
    hang_seconds(opts.hang_timeout)
    straggler_seconds(opts.straggler_window)
    if opts.prometheus_port is not None and not 0 < opts.prometheus_port < 65536:
        raise UsageError(f"must be a port number (1-65535), got {opts.prometheus_port}", key="prometheus_port")
    if opts.on_hang not in ON_HANG:
        raise UsageError(f"'{opts.on_hang}' is not one of {', '.join(ON_HANG)}", key="on_hang")
    from hpcml.samplers.choose import modes
    if opts.gpu_metrics not in modes():           # the registry's names, a site's plug-ins too
        raise UsageError(f"'{opts.gpu_metrics}' is not one of {', '.join(modes())}", key="gpu_metrics")
    protocol = vet_protocol(opts.vet)
    if protocol is not None:
        from hpcml.vet.protocol import load
        load(protocol).unset_variables()                  # a protocol that does not validate: exit 2 now


def _check_restarts(opts: Options, nodes: int, local: bool = False) -> None:
    from hpcml.run.recovery import ON_STRAGGLER
    if opts.max_restarts < 0:
        raise UsageError(f"must be at least 0, got {opts.max_restarts}", key="max_restarts")
    if opts.spare_nodes < 0:
        raise UsageError(f"must be at least 0, got {opts.spare_nodes}", key="spare_nodes")
    if opts.spare_nodes and opts.spare_nodes >= nodes:
        raise UsageError(f"{opts.spare_nodes} spares leave no node of the allocation's {nodes} "
                         "to run on", key="spare_nodes")
    for key, given in (("spare_nodes", opts.spare_nodes), ("revet", opts.revet),
                       ("on_straggler", opts.on_straggler == "restart")):
        if given and not opts.max_restarts:
            raise UsageError("acts on restarts: give --max-restarts too", key=key)
    if opts.min_nodes and opts.spare_nodes and opts.spare_nodes > nodes - opts.min_nodes:
        raise UsageError(f"{opts.spare_nodes} spares leave fewer than --min-nodes {opts.min_nodes} of the "
                         f"allocation's {nodes} nodes to run on", key="spare_nodes")
    if opts.on_straggler not in ON_STRAGGLER:
        raise UsageError(f"'{opts.on_straggler}' is not one of {', '.join(ON_STRAGGLER)}", key="on_straggler")
    _check_straggler_restart(opts, nodes, local)
    if opts.revet not in (None, "none"):
        from hpcml.vet.protocol import load
        load(Path(opts.revet)).unset_variables()


def _check_straggler_restart(opts: Options, nodes: int, local: bool) -> None:
    """``--on-straggler restart`` restarts without the straggler's node: with no node to leave
    out it would stop a healthy job to run it again on the same nodes, as slow. Local tasks
    run on one node; under Slurm a restart needs a spare or ``--min-nodes`` below the nodes
    the job runs on (by default all of them: ``hpcml.run.recovery.Recovery.can_replace``)."""
    if opts.on_straggler != "restart" or not opts.max_restarts:
        return
    if local:
        raise UsageError("restart needs a node to leave the straggler's out, and local tasks run on one node "
                         "(this machine): use --on-straggler report", key="on_straggler")
    if not opts.spare_nodes and (opts.min_nodes or nodes) >= nodes:
        floor = f"--min-nodes {opts.min_nodes} is" if opts.min_nodes else "no --min-nodes below"
        raise UsageError(f"restart needs a node to leave the straggler's out: no --spare-nodes, and {floor} the "
                         f"allocation's {plural(nodes, 'node')}", key="on_straggler")
