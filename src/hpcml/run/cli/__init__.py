"""``hpcml run`` and ``hpcml report``: the front door (one module for the app).

The same shape as every component (its package's ``app``, a ``Group``), except that its
two commands sit at the top level of ``hpcml`` rather than under ``hpcml run ...``:
``hpcml.cli.TOP_LEVEL`` sends both words here, and ``hpcml.cli_app`` mounts the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import Group
from hpcml.errors import UsageError

app = typer.Typer(cls=Group, add_completion=False, rich_markup_mode="rich")


@app.command("run", context_settings={"allow_interspersed_args": False})
def run_cmd(
    cmd: list[str] = typer.Argument(None, help="The training command, after --."),
    out: Optional[Path] = typer.Option(None, "--dir", help="Job directory (default: ./hpcml-run-$SLURM_JOB_ID, "
                                     "without Slurm a new ./hpcml-run-local-DATE-TIME-PID)."),
    vet: Optional[Path] = typer.Option(None, "--vet", help="Vet the nodes with this protocol first "
                                       "(abort: exit 4; shrink: run on the good ones)."),
    min_nodes: Optional[int] = typer.Option(None, "--min-nodes", help="With --vet: fewer good nodes than this aborts."),
    ntasks: Optional[int] = typer.Option(None, "--ntasks", help="Tasks in all (local default: visible GPUs, else 1)."),
    ntasks_per_node: Optional[int] = typer.Option(None, "--ntasks-per-node", help="Tasks per node under Slurm "
                                                  "(default: the allocation's, else GPUs per node, else 1)."),
    env: Optional[str] = typer.Option(None, "--env", help="Run every task in this EDF's container (hpcml env run)."),
    gpus_per_task: Optional[int] = typer.Option(None, "--gpus-per-task", help="GPUs bound to each task by srun "
                                                "(default: 1 when tasks are one per GPU)."),
    interval: float = typer.Option(1.0, help="Seconds between host/GPU samples."),
    gpu_metrics: str = typer.Option("auto", "--gpu-metrics", help="The ranks' GPU sampler: auto (DCGM, else NVML "
                                    "GPM, else NVML), dcgm, gpm, nvml, a site's (hpcml.samplers), or none."),
    no_report: bool = typer.Option(False, "--no-report", help="Do not print the report or write report.html at the end."),
    mlflow: Optional[str] = typer.Option(None, "--mlflow", help="Send rank 0's metrics to this MLflow tracking server "
                                                               "(hpcml service up mlflow), from a background thread."),
    kill_grace: float = typer.Option(10.0, "--kill-grace", help="Seconds between TERM (or INT) and SIGKILL of "
                                     "every rank and what it started."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the finished job that --dir holds "
                                   "(without it such a directory is refused)."),
    hang_timeout: str = typer.Option("auto", "--hang-timeout", help="A hang: no rank completed a step for this long, "
                                     "e.g. '10 min' (auto: 10 x the median step time, at least 120 s; off)."),
    on_hang: str = typer.Option("stop", "--on-hang", help="stop: name the culprits, stop the job, exit 5; "
                                "report: name them and let the job go on."),
    prometheus_port: Optional[int] = typer.Option(None, "--prometheus-port", help="Serve the watch's verdicts "
                                                  "(stragglers, hang, crashes, furthest step) for Prometheus here."),
    prometheus_addr: str = typer.Option("127.0.0.1", "--prometheus-addr", help="Address for --prometheus-port."),
    max_restarts: int = typer.Option(0, "--max-restarts", help="After a crash, a hang, a lost node (or a straggler "
                                     "with --on-straggler restart): exclude the culprit's node and run again, up to "
                                     "this many times, inside the allocation (0: never)."),
    spare_nodes: int = typer.Option(0, "--spare-nodes", help="Good nodes kept idle to replace excluded ones "
                                    "(with --max-restarts)."),
    revet: Optional[str] = typer.Option(None, "--revet", help="Vet a suspect node again with this protocol before "
                                        "it may return (default: the --vet protocol; none: it stays out)."),
    on_straggler: str = typer.Option("report", "--on-straggler", help="report: name a straggler; restart: also "
                                     "restart the job without its node (with --max-restarts)."),
    straggler_window: str = typer.Option("60s", "--straggler-window", help="The straggler model judges the last "
                                         "this long of steps while the job runs, and no verdict comes from less "
                                         "(live or in the report); e.g. '5 min'."),
    collector: Optional[str] = typer.Option(None, "--collector", help="Send the job's summary to this collector "
                                            "(hpcml vet serve; default $HPCML_COLLECTOR; token $HPCML_COLLECTOR_TOKEN "
                                            "or $HPCML_VET_TOKEN). Down: kept in JOBDIR/summary for hpcml report --send."),
    remote_write: Optional[str] = typer.Option(None, "--remote-write", help="Every rank pushes its node and rank "
                                               "series to this Prometheus remote-write URL (VictoriaMetrics, "
                                               "Prometheus; default $HPCML_REMOTE_WRITE)."),
) -> None:
    """Vet, launch, record and report a training job; exits with the first failing rank's code.

        sbatch -N2 --wrap "hpcml run --vet examples/vet/cpu.yaml -- python train.py"

        hpcml run --ntasks 2 -- python train.py        # outside Slurm: local tasks

    Every task gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK and
    LOCAL_WORLD_SIZE (torch.distributed's env:// rendezvous) and is recorded by hpcml
    observe. At the end it prints the job's report and writes JOBDIR/report.html (hpcml
    report shows it again). While it runs, a crashed rank is named at once and a hang
    (--hang-timeout) gets every rank's stack and its culprits named in the log and run.json.
    With --max-restarts the job recovers inside its allocation: the culprit's node is
    excluded (vetted again with --revet), spares replace it, and the command runs again as
    attempt 1, 2... (HPCML_RUN_ATTEMPT) in the same job directory, resuming from its last
    hpcml.ckpt checkpoint; the same fault at the same step three times in a row ends it.
    Exit codes (of the last attempt): the command's (127: it cannot start), 5 a hang stopped (--on-hang stop),
    4 vetting aborted, 2 bad input (a --dir that holds a job), 1 the job directory cannot
    be written.
    """
    from hpcml.run import fastrun
    rc = fastrun.execute(list(cmd or []), out=out, vet=vet, min_nodes=min_nodes, ntasks=ntasks,
                         ntasks_per_node=ntasks_per_node, env=env, interval=interval, no_report=no_report,
                         gpus_per_task=gpus_per_task, mlflow=mlflow, kill_grace=kill_grace, overwrite=overwrite,
                         gpu_metrics=gpu_metrics, hang_timeout=hang_timeout, on_hang=on_hang,
                         prometheus_port=prometheus_port, prometheus_addr=prometheus_addr,
                         max_restarts=max_restarts, spare_nodes=spare_nodes, revet=revet,
                         on_straggler=on_straggler, collector=collector, remote_write=remote_write,
                         straggler_window=straggler_window)
    raise typer.Exit(rc)


@app.command("report")
def report_cmd(
    job_dir: Path = typer.Argument(..., help="A job directory written by hpcml run."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="HTML file (default: JOB_DIR/report.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of text."),
    send: bool = typer.Option(False, "--send", help="Send the job's summaries that are not sent yet to the collector "
                              "(--collector or $HPCML_COLLECTOR); each is stored once however often it is sent."),
    collector: Optional[str] = typer.Option(None, "--collector", help="The collector's URL for --send."),
) -> None:
    """One report for the whole job: vetting, environment, throughput, stragglers, stalls,
    GPU saturation, how it ended, and the findings ranked with advice.

        hpcml report hpcml-run-$SLURM_JOB_ID
        hpcml report hpcml-run-$SLURM_JOB_ID --send --collector http://collector:8787

    Exit codes: 0 done, 1 --send left summaries unsent (the collector is down), 2 bad input.
    """
    import json

    from hpcml.arrowprobe import skip_pandas
    from hpcml.cli_support import write_report
    from hpcml.run.config import collector_url
    from hpcml.run.report import build, summary, to_json, write
    url = collector_url(collector)
    if send and url is None:
        raise UsageError("--send needs the collector's URL: --collector URL or $HPCML_COLLECTOR", key="--send")
    skip_pandas()                           # hpcml's own process: 0.3 s saved (hpcml.arrowprobe)
    rep = build(job_dir)
    path = write_report(write, rep, html_out or Path(job_dir) / "report.html")
    if url is not None:              # on every report when $HPCML_COLLECTOR names one
        _send(job_dir, rep, url, strict=send)
    if as_json:
        print(json.dumps(to_json(rep), indent=2, default=str))
        return
    print("\n".join(summary(rep)))
    print(f"html: {path}")


def _send(job_dir: Path, rep: dict, url: str, strict: bool) -> None:
    """Spool this attempt's summary if it is not there (only once it has ended: a summary
    is stored once, so it must be the final one) and send every waiting one; with
    ``--send`` (``strict``) a summary left unsent is exit 1."""
    import sys

    from hpcml.run.summary import SPOOL, build, send_pending, spool
    attempt = int(rep["job"].get("attempt") or 0)
    try:
        if not (Path(job_dir) / SPOOL / f"attempt-{attempt}.json").exists() and spool(job_dir, build(job_dir, rep)) is None:
            print(f"hpcml report: attempt {attempt} is still running: its summary is sent when it ends",
                  file=sys.stderr)
    except OSError as exc:                # someone else's job directory, a file where the spool goes
        print(f"hpcml report: summary not written in {job_dir}: {exc.strerror or exc}", file=sys.stderr)
    except UsageError as exc:             # a summary no collector would take: the report stands
        print(f"hpcml report: summary not written: {exc}", file=sys.stderr)
    sent, left = send_pending(job_dir, url, timeout=30 if strict else 3)
    if strict:
        print(f"summaries: {sent} sent, {left} left unsent", file=sys.stderr)
        if left:
            raise typer.Exit(1)
