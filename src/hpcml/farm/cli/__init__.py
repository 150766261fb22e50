"""``hpcml farm``: create a farm from a task or sweep file, run it, see its status and results.
Parse arguments, call the farm modules, render: no farm logic here."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer

from hpcml.cli_support import Group

app = typer.Typer(name="farm", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="Many similar tasks in one or several allocations, each in its own directory, none lost.\n\n"
                       "Example: [bold]hpcml farm create sweep/ sweep.yaml && hpcml farm run sweep/[/]\n\n"
                       "Exit codes: 0 done, 1 tasks failed (or nodes retired), 2 bad input.")


def _settings(retries: int | None, backoff: str | None, time_limit: str | None, lease: str | None = None,
              node_failures: int | None = None) -> dict:
    from hpcml.errors import UsageError
    from hpcml.units import parse_seconds
    out: dict = {"retries": retries, "node_failures": node_failures}
    for key, value in (("backoff", backoff), ("time_limit", time_limit), ("lease", lease)):
        if value is not None:
            try:
                out[key] = parse_seconds(value)
            except ValueError as exc:
                raise UsageError(str(exc), key=key) from None
    return {k: v for k, v in out.items() if v is not None}


RETRIES = typer.Option(None, "--retries", min=0, help="Retry a failed task this many times (default 2).")
BACKOFF = typer.Option(None, "--backoff", help="Wait before the first retry, doubled for each next one, e.g. '5 s'.")
TIME_LIMIT = typer.Option(None, "--time-limit", help="Stop an attempt that runs longer, e.g. '2 h': TERM, KILL 10 s later ('timeout').")


@app.command("create")
def create(
    farm: Path = typer.Argument(..., help="The farm directory (made if missing; tasks are appended if it exists)."),
    source: Path = typer.Argument(..., help="A task file (one command per line) or a sweep file (.yaml)."),
    retries: int | None = RETRIES,
    backoff: str | None = BACKOFF,
    time_limit: str | None = TIME_LIMIT,
    shared_dir: bool = typer.Option(False, "--shared-dir", help="Run every task in the directory hpcml farm run "
                                    "starts in, not in its own SWEEP/tasks/ID (task_dirs: false in a sweep file)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was added as JSON."),
) -> None:
    """Make a farm directory with one record per task; run again to append, never renumber.

    Each task runs in its own directory, FARM/tasks/ID (made on its first attempt, with
    params.json), so relative paths in its command (--ckpt ckpt, outputs) are its own and
    a retry finds them; {task_dir} and {workdir} (the directory farm run starts in) may be
    used in a command, e.g. python {workdir}/train.py. --shared-dir keeps the old way.

    A task file has one shell command per line (blank lines and # comments skipped),
    run as written. A sweep file (YAML) has a command template and parameters: lists
    under product: (every combination), zip: (side by side), random: (samples with a
    seed), and stages with group: and after: under tasks:. Each value is inserted
    shell-quoted, one word (raw: true or raw: [names] inserts shell code); a parameter
    the command does not use, or two sets giving one command, is an error (repeat: N
    runs copies on purpose, {repeat} is 1..N). The same task is never added twice.

        hpcml farm create sweep/ sweep.yaml
        hpcml farm create inputs/ commands.txt --retries 3 --time-limit "30 min"

    Exit codes: 0 created, 1 the disk is full, 2 bad input (nothing written either way).
    """
    from hpcml.farm import store, sweep
    if sweep.is_sweep(source):
        specs, settings = sweep.parse_sweep(source)
    else:
        specs, settings = sweep.parse_task_file(source), {}
    settings.update(_settings(retries, backoff, time_limit))
    if shared_dir:
        settings["task_dirs"] = False
    for line in sweep.relative_paths(specs, Path.cwd()) if settings.get("task_dirs", True) else []:
        print(f"hpcml farm: warning: {line}", file=sys.stderr)
    res = store.create(farm, specs, settings)
    if as_json:
        from hpcml.schemas import tag
        print(json.dumps({"schema": tag("farm.create", 1), "farm": str(res.path), "added": res.added,
                          "existing": res.existing, "total": res.total}))
    else:
        from hpcml.words import plural
        print(f"{res.path}: {plural(res.added, 'task')} added, {res.existing} already there, {res.total} in all")


@app.command("run")
def run(
    farm: Path = typer.Argument(..., help="The farm directory (from hpcml farm create)."),
    slots: int | None = typer.Option(None, "--slots", min=1, help="Workers per node (default: one per GPU, else "
                                     "Slurm's tasks per node, else this machine's CPUs)."),
    gpus: int | None = typer.Option(None, "--gpus", min=0, help="GPUs per node to pin one per worker (default: "
                                    "the GPUs Slurm bound to the job)."),
    retries: int | None = RETRIES,
    backoff: str | None = BACKOFF,
    time_limit: str | None = TIME_LIMIT,
    lease: str | None = typer.Option(None, "--lease", help="A worker silent this long is dead and its task "
                                     "rerun (default 60 s)."),
    node_failures: int | None = typer.Option(None, "--node-failures", min=0, help="Different tasks failing in a "
                                             "row on a node, and not the same way elsewhere, that retire it "
                                             "if one passed on another node or the node vets bad (default 5; "
                                             "0: never)."),
) -> None:
    """Run every task not done yet, one worker per slot, until all are done or failed for good.

    In a Slurm batch script it starts one agent per node (one srun step); outside Slurm it
    runs on this machine. Run it again (here or in another allocation, or in several at
    once) to resume: what is recorded in the farm directory is never run twice. Each task
    is a job of its own (rank 0 of 1: none of the srun step's task variables); it gets
    HPCML_FARM_TASK_ID, HPCML_FARM_ATTEMPT, HPCML_OBSERVE_DIR and, on a GPU slot,
    CUDA_VISIBLE_DEVICES (the README's farm section lists what it keeps).

        hpcml farm run sweep/
        hpcml farm run sweep/ --gpus 4 --time-limit "2 h"

    Exit codes: 0 every task ok, 1 some failed (see hpcml farm status) or the farm's disk is full, 2 bad input.
    """
    from hpcml.farm import agent, status
    t0 = time.time()
    overrides = _settings(retries, backoff, time_limit, lease, node_failures)
    for line in status.damaged_files(farm):          # not a farm: one line, exit 2
        print(f"hpcml farm: warning: {line}", file=sys.stderr)
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        count = status.Progress(farm)
        with Progress(TextColumn(f"{farm}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=True, auto_refresh=False) as bar:
            task = bar.add_task("tasks", total=count()[1])

            def update() -> None:
                done, total = count()
                bar.update(task, completed=done, total=total)
                bar.refresh()
            agent.run(farm, slots=slots, gpus=gpus, overrides=overrides, on_progress=update)
    else:
        agent.run(farm, slots=slots, gpus=gpus, overrides=overrides)
    doc = status.summarize(farm)
    for line in tell_centre(farm, doc["bad_nodes"]):
        print(f"hpcml farm: {line}", file=sys.stderr)
    c = doc["counts"]
    print(f"{farm}: {c['ok']} ok, {c['failed']} failed, {c['blocked']} blocked, "
          f"{doc['total'] - c['ok'] - c['failed'] - c['blocked']} left, in {time.time() - t0:.1f} s"
          + (f"; retired nodes: {', '.join(doc['bad_nodes'])}" if doc["bad_nodes"] else ""), file=sys.stderr)
    if c["ok"] != doc["total"]:
        raise typer.Exit(1)


#: the check the farm's evidence is stored under at the centre (its type: ``farm``)
FARM_CHECK = "farm-tasks"


def tell_centre(farm: Path, nodes: list[str], timeout: float = 5.0) -> list[str]:
    """Send each retired node not told yet (``centre`` still null in its ``nodes/NODE.bad``)
    to the collector of ``$HPCML_COLLECTOR`` (``hpcml run``'s) as a node report of the farm's
    Slurm job: check ``farm-tasks``, type ``farm``, failed, the reason as its message. Signed
    with the user's MUNGE credential, the collector proves it as the user's report of their
    own job's node (job evidence: a rule counts it only with ``match.users``, never alone).
    What became of each is written back into its file; the lines to say. Never raises: the
    farm's own result stands either way. (Here, in the command, not in the worker that
    retires the node: the library's farm must not import the centre, which imports it.)"""
    import os

    from hpcml.centre.client import post_report
    from hpcml.errors import UsageError
    from hpcml.farm.model import NODES
    from hpcml.files import load_json_bounded, write_atomic
    from hpcml.run.config import collector_url
    from hpcml.run.summary import collector_token
    try:
        url = collector_url(None)
    except UsageError as exc:                  # the farm ran: say it, never fail it for this
        return [f"warning: retired nodes not told to the collector: {exc}"] if nodes else []
    if url is None:
        return []
    said = []
    deadline = time.monotonic() + timeout * max(1, len(nodes))
    for node in nodes:
        path = Path(farm) / NODES / f"{node}.bad"
        try:
            doc = load_json_bounded(path, 1 << 20)
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("centre") is not None or not isinstance(doc.get("reason"), str):
            continue
        try:                          # one sender per retirement: farm runs of several nodes end at once
            os.close(os.open(path.with_suffix(".told"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except OSError:
            continue
        when = doc["time"] if isinstance(doc.get("time"), (int, float)) else time.time()
        report = {"job_id": os.environ.get("SLURM_JOB_ID"), "node": node, "time": when, "protocol": "farm",
                  "verdict": "bad", "results": [{"name": FARM_CHECK, "type": "farm", "outcome": "fail",
                                                 "message": doc["reason"][:4096]}]}
        refused = post_report(report, url, collector_token(), min(deadline, time.monotonic() + timeout))
        doc["centre"] = f"sent to {url}" if refused is None else f"not sent to {url}: {refused.why}"
        if refused is not None:
            said.append(f"warning: retired node {node} not told to the collector at {url}: {refused.why}")
        try:
            write_atomic(path, json.dumps(doc) + "\n")
        except OSError:
            pass
    return said


@app.command("agent", hidden=True)
def agent_command(
    farm: Path = typer.Argument(...),
    node_slots: str = typer.Option(..., "--node-slots"),
    gpus: int | None = typer.Option(None, "--gpus"),
    retries: int | None = typer.Option(None, "--retries"),
    backoff: str | None = typer.Option(None, "--backoff"),
    time_limit: str | None = typer.Option(None, "--time-limit"),
    lease: str | None = typer.Option(None, "--lease"),
    node_failures: int | None = typer.Option(None, "--node-failures"),
) -> None:
    """One node's agent, started by hpcml farm run through srun (internal).

        srun hpcml farm agent sweep/ --node-slots 4,4
    """
    import os

    from hpcml.farm import agent
    per = [int(x) for x in node_slots.split(",")]
    index = int(os.environ.get("SLURM_NODEID", "0"))
    code = agent.run_node(farm, per[min(index, len(per) - 1)], agent.gpu_list(gpus),
                          _settings(retries, backoff, time_limit, lease, node_failures))
    raise typer.Exit(code)


@app.command("status")
def status_command(
    farm: Path = typer.Argument(..., help="The farm directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON (schema hpcml.farm.status/1)."),
    watch: bool = typer.Option(False, "--watch", help="Keep a live view until every task is final (Ctrl-C stops)."),
) -> None:
    """Counts by state, what runs where, what failed, and an ETA.

        hpcml farm status sweep/
        hpcml farm status sweep/ --json
        hpcml farm status sweep/ --watch

    Exit codes: 0 read, 2 not a farm directory.
    """
    from hpcml.farm.status import summarize
    doc = summarize(farm)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    if not watch:
        _render_status(doc)
        return
    from rich.live import Live
    with Live(_status_table(doc), refresh_per_second=2) as live:
        while not doc["done"]:
            time.sleep(1.0)
            doc = summarize(farm)
            live.update(_status_table(doc))


def _status_table(doc: dict):
    from rich.table import Table

    from hpcml.words import LINE_MAX, shown
    c = doc["counts"]
    eta = doc["eta_s"]
    t = Table(title=f"{shown(doc['farm'], LINE_MAX)}: {doc['total']} tasks, {doc['workers']} workers"
              + (f", ETA {eta:.0f} s" if eta else ""))
    for state in c:
        t.add_column(state, justify="right")
    t.add_row(*(str(v) for v in c.values()))
    return t


def _render_status(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from hpcml.words import LINE_MAX, shown
    console = Console()
    console.print(_status_table(doc))
    if doc["bad_nodes"]:
        console.print(f"retired nodes: {shown(', '.join(doc['bad_nodes']), LINE_MAX)}")
    if doc["running"]:
        t = Table(title="running")
        for col in ("id", "attempt", "node", "gpu", "for"):
            t.add_column(col)
        for r in doc["running"][:20]:
            since = f"{time.time() - r['start']:.0f} s" if r.get("start") else ""
            t.add_row(shown(r["id"]), str(r["attempt"]), shown(r["node"]), shown(r["gpu"] or ""), since)
        console.print(t)
    if doc["failed"]:
        t = Table(title="failed")
        for col in ("id", "attempts", "outcome", "exit", "stderr"):
            t.add_column(col)
        for r in doc["failed"][:20]:
            t.add_row(shown(r["id"]), str(r["attempts"]), shown(r["outcome"]), _exit(r), shown(r["stderr"] or "", LINE_MAX))
        console.print(t)


def _exit(end: dict) -> str:
    """How the attempt exited: a lost attempt's worker died with it, so neither is known ("–")."""
    if end.get("exit_code") is not None:
        return str(end["exit_code"])
    return f"signal {end['signal']}" if end.get("signal") is not None else "–"


@app.command("results")
def results_command(
    farm: Path = typer.Argument(..., help="The farm directory."),
    sort: str | None = typer.Option(None, "--sort", help="Sort by a parameter, metric or column (optimizer_steps, "
                                    "optimizer_steps_per_s, seconds, ...); '-loss' descending."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (schema hpcml.farm.results/1)."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Show only the first N rows."),
) -> None:
    """A table of each task's parameters, optimizer steps and the last value of each metric.

    Without a change to the script: a Python task's optimizer steps are counted (torch's
    optimizer hooks, as hpcml run counts them; HPCML_RUN_OPTIMIZER_STEPS=0: not), and the
    last values its framework logged are read from its own directory (HF Trainer's
    trainer_state.json, Lightning's CSVLogger metrics.csv, and the JSON-lines file a sweep
    names with metrics_file:). A script may also log with hpcml.observe.log(step,
    loss=...): the farm points each attempt at its own directory (HPCML_OBSERVE_DIR), and
    those values come first.

        hpcml farm results sweep/ --sort val_loss --limit 5
        hpcml farm results sweep/ --csv > sweep.csv

    Exit codes: 0 read, 2 not a farm directory or an unknown sort key.
    """
    from hpcml.run.farmresults import collect, to_csv
    doc = collect(farm, sort)
    if limit:
        doc["rows"] = doc["rows"][:limit]
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    if as_csv:
        sys.stdout.write(to_csv(doc))
        return
    from rich.console import Console
    from rich.table import Table

    from hpcml.words import LINE_MAX, shown
    sources = sorted({src for r in doc["rows"] for src in r["metric_sources"].values() if src != "observe"})
    caption = "; ".join(filter(None, [f"metrics: {doc['metric_rule']}" if doc["metrics"] else "",
                                      f"from framework logs: {', '.join(sources[:3])}{' ...' if len(sources) > 3 else ''}"
                                      if sources else "",
                                      "steps: rank 0's (optimizer steps counted, or the script's own), steps/s over "
                                      "their time" if any(
                                          r["steps"] for r in doc["rows"]) else ""]))
    t = Table(title=f"{shown(doc['farm'])}: {len(doc['rows'])} tasks", caption=shown(caption, LINE_MAX) or None)
    command = not doc["params"]                  # a task file: the command says which task it is
    stepped = any(r["steps"] for r in doc["rows"])
    steps_col = "steps" if "steps" not in doc["params"] and "steps" not in doc["metrics"] else "steps (counted)"
    for col in ("id", "state", *doc["params"], *((steps_col, "steps/s") if stepped else ()), *doc["metrics"], "s"):
        t.add_column(shown(col), justify="right", no_wrap=True)      # the command column gives way, not a value
    if command:
        t.add_column("command", overflow="ellipsis", max_width=60)
    for r in doc["rows"]:
        st = r["steps"] or {}
        t.add_row(shown(r["id"]), shown(r["state"]), *(shown(_fmt(r["params"].get(p))) for p in doc["params"]),
                  *((f"{st['count']:,}" if st else "", _fmt(st.get("per_s"))) if stepped else ()),
                  *(shown((r.get("metric_non_finite") or {}).get(m) or _fmt(r["metrics"].get(m)))
                    + (f" (rank {r['metric_ranks'][m]})" if r["metric_ranks"].get(m) else "")
                    for m in doc["metrics"]),
                  "" if r["seconds"] is None else f"{r['seconds']:.1f}",
                  *([shown(r["command"], LINE_MAX)] if command else []))
    Console().print(t)


def _fmt(v: object) -> str:
    if v is None:
        return ""
    return f"{v:.4g}" if isinstance(v, float) else str(v)
