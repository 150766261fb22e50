"""``hpcml centre handle`` and ``hpcml centre rules`` (aliases ``hpcml vet handle`` and ``hpcml vet
rules``): arguments in, handler out, a table or JSON back. No decisions here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import command_words
from hpcml.errors import HpcmlError, UsageError

# Not imported from hpcml.centre.rules: that pulls pydantic into every `hpcml vet` and `hpcml centre` start.
DEFAULT_RULES = Path(__file__).parents[1] / "data" / "rules-default.yaml"

_STYLE = {"drain": "bold red", "resume": "green", "hold": "yellow", "skip": "dim", "defer": "magenta"}


def handle(
    ctx: typer.Context,
    rules: Path = typer.Option(DEFAULT_RULES, "--rules", help="Rules catalog YAML "
                               "(default: the built-in catalog)."),
    results: Optional[list[Path]] = typer.Option(None, "--results", help="Directory (searched for "
                                                 "report.json) or report file; repeatable."),
    db: Optional[str] = typer.Option(None, "--db", help="Results collector store URL instead of --results."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print and audit what would be done."),
    audit: Path = typer.Option(Path("hpcml-vet-audit.jsonl"), "--audit",
                               help="Audit log (JSON lines, appended); also the handler's memory "
                               "of its own drains, so keep one per cluster."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan and outcomes as JSON."),
    textfile: Optional[Path] = typer.Option(None, "--textfile", help="Also write this run's figures for "
                                            "node_exporter's textfile collector (a .prom file, replaced whole)."),
) -> None:
    """Drain nodes that keep failing checks and resume the ones it drained once they pass.

    Only nodes whose Slurm reason starts with "hpcml:" are ever resumed; nodes drained or
    down for another reason are left alone. From cron on an admin host:

        hpcml centre handle --results /shared/vet-reports --audit /var/log/hpcml-vet-audit.jsonl --dry-run

    A report file is evidence only where root, SlurmUser or the user running this owns it and
    no one else may write it (``hpcml vet`` in a prolog); another user's file counts for
    nothing: proven senders go through the collector (``--db``).

    Drains beyond max_drain_fraction (over the rolling drain_window, 24 h by default, from
    the audit log) or min_nodes_kept are deferred, strongest evidence first: listed as
    "defer" and audited. Exit codes: 0 nothing to do or every action applied (deferred
    ones included); 1 Slurm could not be read or an scontrol update failed; 2 bad rules
    or input.
    """
    from hpcml.centre import handler
    from hpcml.centre import rules as rules_mod
    from hpcml.centre.sources import JsonDirSource, StoreSource
    if bool(results) == bool(db):
        raise UsageError("give either --results DIR... or --db URL")
    if db:
        from hpcml.centre.collector.store import refuse_password
        refuse_password(db)
    catalog = rules_mod.load(rules)
    source = JsonDirSource(results) if results else StoreSource(str(db))
    try:
        plan = handler.handle(catalog, source, audit_path=audit, dry_run=dry_run)
    except HpcmlError:
        if textfile is not None:
            _textfile(textfile, None, dry_run)     # the run failed: node_exporter says so
        raise
    if textfile is not None:
        _textfile(textfile, plan, dry_run)
    if as_json:
        print(json.dumps({**plan.to_json(), "dry_run": dry_run, "rules": catalog.source,
                          "audit": str(audit)}, indent=2))
    else:
        _print_plan(" ".join(command_words(ctx)), plan, dry_run, audit)   # hpcml centre handle, or hpcml vet handle
    if any(a.status == "failed" for a in plan.actions):
        raise typer.Exit(1)


def _print_plan(name: str, plan, dry_run: bool, audit: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    console = Console()
    if not plan.actions:
        console.print(f"nothing to do ({plan.available_nodes}/{plan.total_nodes} nodes available)")
        return
    t = Table(title=name + (" (dry run)" if dry_run else ""))
    for col in ("node", "action", "rule", "check", "reason / note", "status"):
        t.add_column(col)
    for a in plan.actions:
        t.add_row(escape(a.node), f"[{_STYLE.get(a.action, 'default')}]{a.action}[/]",
                  escape(a.rule or ""), escape(a.check or ""), escape(a.note or a.reason),
                  a.status if a.action in ("drain", "resume") else "")
    console.print(t)
    if plan.changes:
        console.print(f"audit log: {audit}", highlight=False)


def validate_rules(file: Path = typer.Argument(..., help="Rules catalog to check.")) -> None:
    """Check a rules catalog without acting (exit 0 valid, 2 invalid).

    Example: [bold]hpcml centre rules site-rules.yaml[/]
    """
    from hpcml.centre import rules as rules_mod
    catalog = rules_mod.load(file)
    print(f"{file}: valid rules catalog '{catalog.name}' with {len(catalog.rules)} rules "
          f"(max_drain_fraction {catalog.max_drain_fraction:.0%}, min_nodes_kept "
          f"{catalog.min_nodes_kept}): " + ", ".join(r.name for r in catalog.rules))


def _textfile(path: Path, plan, dry_run: bool) -> None:
    """The run's figures as Prometheus text for node_exporter's textfile collector: whether
    it worked, actions by kind and status, the nodes it holds drained, when it ran; written
    to a temporary file and renamed, as the collector requires (it never reads half a file)."""
    from prometheus_client import CollectorRegistry, Gauge
    reg = CollectorRegistry()
    Gauge("hpcml_handler_up", "1 when the last run read Slurm and its results and acted, 0 when it failed.",
          registry=reg).set(int(plan is not None))
    Gauge("hpcml_handler_dry_run", "1 when the last run only planned.", registry=reg).set(int(dry_run))
    Gauge("hpcml_handler_last_run_timestamp_seconds", "When the handler last ran.", registry=reg).set_to_current_time()
    if plan is None:
        _write_textfile(path, reg)
        return
    acts = Gauge("hpcml_handler_actions", "Actions of the handler's last run, by action and status.",
                 ["action", "status"], registry=reg)
    counts: dict[tuple[str, str], int] = {}
    for a in plan.actions:
        key = (a.action, a.status or "planned")
        counts[key] = counts.get(key, 0) + 1
    for (action, status), n in counts.items():
        acts.labels(action, status).set(n)
    Gauge("hpcml_handler_held_nodes", "Nodes hpcml drained and still holds (hold actions).",
          registry=reg).set(sum(a.action == "hold" for a in plan.actions))
    nodes = Gauge("hpcml_handler_nodes", "Nodes of the cluster, and those available, at the last run.", ["kind"],
                  registry=reg)
    nodes.labels("total").set(plan.total_nodes)
    nodes.labels("available").set(plan.available_nodes)
    _write_textfile(path, reg)


def _write_textfile(path: Path, reg) -> None:
    from prometheus_client import write_to_textfile
    try:
        write_to_textfile(str(path), reg)
    except OSError as exc:
        raise UsageError(f"cannot write the textfile: {exc.strerror or exc}", key="--textfile") from None
