"""The terminal summary of a score report: the score, its parts, the top finding first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from hpcml.htmlkit import fmt_duration

BAR = 24


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _bar(v: float | None) -> str:
    if v is None:
        return "[dim]no data[/]"
    full = round(max(0.0, min(1.0, v)) * BAR)
    return f"{v:4.2f} [green]{'█' * full}[/][dim]{'░' * (BAR - full)}[/]"


def print_summary(rep: dict[str, Any], html_path: Path | None, console: Console | None = None) -> None:
    con = console or Console()
    span = rep.get("span_s")
    where = (f"{_n(rep['gpus'], 'GPU')} on {_n(rep['nodes'], 'node')}, {fmt_duration(rep['duration_s'] or 0)} "
             f"at {rep['interval_s']:g} s" if rep["gpus"] else "no GPUs")
    if span:
        where += f", active {fmt_duration(span[0])}–{fmt_duration(span[1])}"
    if rep["temporal_only"]:
        con.print(f"[bold yellow]temporal utilisation only, no saturation[/] — {where}")
    elif rep["score"] is None:
        con.print(f"[bold]GPU saturation score: no data[/] — {where}")
    else:
        con.print(f"[bold]GPU saturation score {rep['score']:.2f}[/] ({rep['bound']}-bound) — {where}")
    if not rep["temporal_only"]:
        for part in ("compute", "memory", "interconnect"):
            con.print(f"  {part:<13}{_bar(rep['breakdown'][part])}", highlight=False)
        if rep["gssr"] is not None:
            con.print(f"  {'gssr formula':<13}{rep['gssr']:4.2f} [dim](gssr's documented score, for comparison)[/]",
                      highlight=False)
    imb = rep["imbalance"]
    if imb["gpus"] is not None:
        nodes = f", {imb['nodes']:.2f} across nodes" if imb["nodes"] is not None else ""
        con.print(f"  {'imbalance':<13}CoV {imb['gpus']:.2f} across GPUs{nodes}", highlight=False)
    if rep.get("energy_wh") is not None:
        con.print(f"  {'energy':<13}{rep['energy_wh']:,.1f} Wh on {rep['energy_gpus']} GPUs", highlight=False)
    for i, f in enumerate(rep["findings"]):
        con.print(f"[bold cyan]→ {f}[/]" if i == 0 else f"  • {f}", highlight=False)
    for n in rep["notes"]:
        con.print(f"[dim]note: {n}[/]", highlight=False)
    if html_path is not None:
        con.print(f"HTML report: {html_path}")
