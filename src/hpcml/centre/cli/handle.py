"""``hpcml centre handle`` and ``hpcml centre rules`` (aliases ``hpcml vet handle`` and ``hpcml vet
rules``): arguments in, handler out, a table or JSON back. No decisions here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import command_words
from hpcml.errors import UsageError

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
) -> None:
    """Drain nodes that keep failing checks and resume the ones it drained once they pass.

    Only nodes whose Slurm reason starts with "hpcml:" are ever resumed; nodes drained or
    down for another reason are left alone. From cron on an admin host:

        hpcml centre handle --results /shared/vet-reports --audit /var/log/hpcml-vet-audit.jsonl --dry-run

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
    catalog = rules_mod.load(rules)
    source = JsonDirSource(results) if results else StoreSource(str(db))
    plan = handler.handle(catalog, source, audit_path=audit, dry_run=dry_run)
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
