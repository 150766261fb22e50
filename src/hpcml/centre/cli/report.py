"""``hpcml centre report`` (alias ``hpcml vet fleet-report``): arguments in, the centre's report
(``hpcml.centre.report``) out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hpcml.errors import UsageError


def report(
    db: str = typer.Option(..., "--db", help="The collector's store: sqlite:///PATH or postgresql://USER@HOST/DB."),
    since: str = typer.Option("30d", "--since", help="The window, back from now: 7d, 24h, 90 min."),
    top: int = typer.Option(20, "--top", min=1, max=10_000, help="Nodes and owners listed."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write the report as one offline HTML page."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    audit: Optional[Path] = typer.Option(None, "--audit", help="The node handler's audit log (hpcml centre handle "
                                         "--audit): each rule's drains measured too."),
    rules: Optional[Path] = typer.Option(None, "--rules", help="With --audit: the rules catalog the handler ran "
                                         "(default: hpcml's), for each rule's evidence and min_precision."),
) -> None:
    """The centre's view over every job and vetting result the collector holds.

    The nodes that hurt the most jobs beside their vetting history, the lowest GPU scores
    per user and account, and the GPU-hours lost to faults:

        hpcml centre report --db postgresql://hpcml@dbhost/vet --since 30d --html centre.html

    How often each check's and, with --audit, each rule's verdict was right (precision,
    recall, lead; hpcml.centre.precision); a rule below its min_precision is called out.

    Exit codes: 0 done, 1 the database cannot be read, 2 bad option.
    """
    from hpcml.centre.collector.server import parse_since
    from hpcml.centre.collector.store import open_store, refuse_password
    from hpcml.centre.report import build, lines, render_html
    from hpcml.files import write_atomic
    try:
        window = parse_since(since)
    except ValueError:
        raise UsageError(f"expected a duration such as 30d or 24h, found {since!r}", key="--since") from None
    refuse_password(db)
    if db.startswith("sqlite:"):                 # a report reads: a mistyped path is not a new, empty store
        from hpcml.centre.collector.sqlite import path_of
        if not Path(path_of(db)).is_file():
            raise UsageError("no such database file", file=path_of(db))
    drains, declared = _handled(audit, rules)
    store = open_store(db)
    try:
        rep = build(store, window, top=top, drains=drains, declared=declared, states=_slurm_states())
    finally:
        store.close()
    if html_out is not None:
        try:
            write_atomic(html_out, render_html(rep))
        except OSError as exc:
            raise UsageError(f"cannot write: {exc.strerror}", file=str(html_out)) from None
    if as_json:
        print(json.dumps(rep, indent=2))
        return
    print("\n".join(lines(rep)))
    if html_out is not None:
        print(f"html: {html_out}")


def _handled(audit: Path | None, rules: Path | None) -> tuple[list | None, dict | None]:
    """The handler's applied drains and each rule's declared evidence (None without --audit)."""
    if audit is None:
        if rules is not None:
            raise UsageError("needs --audit (the handler's log of what the rules did)", key="--rules")
        return None, None
    from hpcml.centre import rules as rules_mod
    from hpcml.centre.precision import drains_from_audit
    try:
        with open(audit, encoding="utf-8", errors="replace") as f:
            drains = drains_from_audit(f)
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", file=str(audit)) from None
    catalog = rules_mod.load(rules or rules_mod.DEFAULT_RULES)
    return drains, {r.name: r.evidence for r in catalog.rules}


def _slurm_states() -> dict[str, tuple[str, str]] | None:
    """Every node's Slurm state and reason now, where Slurm answers here (an admin host);
    None elsewhere: the report then says "not read", never a state it did not see."""
    from hpcml.cluster import slurm
    from hpcml.errors import SlurmError
    if not slurm.available("scontrol"):
        return None
    try:
        return {r["NodeName"]: (r.get("State", ""), r.get("Reason", "")) for r in slurm.scontrol_show("node", timeout=10)}
    except SlurmError:
        return None
