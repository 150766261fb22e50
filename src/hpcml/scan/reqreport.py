"""Rendering of ``hpcml scan requirements``: Rich table, JSON, SARIF and the exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcml.scan.report import sarif_log
from hpcml.scan.requirements import RULES, RequirementsReport
from hpcml.schemas import tag

_LEVEL = {"high": "error", "medium": "warning", "low": "note"}
_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


def exit_code(rep: RequirementsReport) -> int:
    """6 when a high-severity risk is found, 5 for medium ones, else 0 (low is advice)."""
    severities = {f.severity for f in rep.findings}
    return 6 if "high" in severities else 5 if "medium" in severities else 0


def to_json(rep: RequirementsReport, code: int) -> dict[str, Any]:
    return {"schema": tag("scan.requirements", 1), "path": rep.path, "kind": rep.kind,
            "packages": rep.packages, "exit_code": code,
            "findings": [{"severity": f.severity, "rule": f.rule, "package": f.package,
                          "file": f.file or rep.path, "line": f.line, "message": f.message}
                         for f in rep.findings]}


def to_sarif(rep: RequirementsReport) -> dict[str, Any]:
    rules = sorted({f.rule for f in rep.findings})
    results = []
    for f in rep.findings:
        phys: dict[str, Any] = {"artifactLocation": {"uri": f.file or rep.path}}
        if f.line:
            phys["region"] = {"startLine": f.line}
        results.append({"ruleId": f.rule, "level": _LEVEL.get(f.severity, "warning"),
                        "message": {"text": f.message}, "locations": [{"physicalLocation": phys}]})
    return sarif_log([{"id": r, "shortDescription": {"text": RULES.get(r, r)}} for r in rules],
                     results, "hpcml scan requirements")


def table(rep: RequirementsReport):
    from rich.table import Table

    from hpcml.words import LINE_MAX, shown
    t = Table(title=f"hpcml scan requirements: {shown(rep.path, LINE_MAX)} ({rep.kind}, {rep.packages} packages)")
    for col in ("severity", "rule", "package", "line", "message"):
        t.add_column(col, overflow="fold")
    order = {"high": 0, "medium": 1, "low": 2}
    for f in sorted(rep.findings, key=lambda f: (order.get(f.severity, 3), f.line or 0)):
        where = str(f.line or "")
        if f.file and f.file != rep.path:          # an -r/-c include: name the file the line is in
            where = f"{Path(f.file).name}:{where}" if where else Path(f.file).name
        t.add_row(f"[{_STYLE.get(f.severity, '')}]{f.severity}[/]", f.rule, shown(f.package or ""), shown(where),
                  shown(f.message, LINE_MAX))
    if not rep.findings:
        t.add_row("[green]ok[/]", "", "", "", "no dependency-confusion risk found")
    return t
