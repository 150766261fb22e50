"""The terminal summary of a score report: the score, its parts, the top finding first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from hpcml.htmlkit import fmt_duration
from hpcml.words import LINE_MAX, shown

BAR = 24


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _bar(v: float | None) -> str:
    if v is None:
        return "[dim]no data[/]"
    full = round(max(0.0, min(1.0, v)) * BAR)
    return f"{v:4.2f} [green]{'█' * full}[/][dim]{'░' * (BAR - full)}[/]"


def _instances(con: Console, inst: dict[str, Any] | None, most: int = 8) -> None:
    """MIG instances, apart from the GPUs that hold them (whose figures include theirs)."""
    if not inst:
        return
    score = "no data" if inst["score"] is None else f"{inst['score']:.2f}" + (
        f" ({inst['bound']}-bound)" if inst["bound"] else "")
    con.print(f"  {'MIG':<13}{_n(inst['count'], 'instance')} scored apart from their GPUs: {score}", highlight=False)
    for g in inst["per_instance"][:most]:
        mig = g.get("mig") or {}
        what = shown(", ".join(f"{k} {v}" for k, v in mig.items() if k != "parent"), LINE_MAX)
        value = "no data" if g["score"] is None else f"{g['score']:.2f}"
        con.print(f"    {shown(g['gpu'])} ({what}): {value}", highlight=False)
    if inst["count"] > most:
        con.print(f"    … and {inst['count'] - most} more", highlight=False)


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
        bound = f" ({rep['bound']}-bound)" if rep["bound"] else ""      # no bound: print none, not "None"
        con.print(f"[bold]GPU saturation score {rep['score']:.2f}[/]{bound} — {where}")
    if rep["temporal_only"]:
        util = rep.get("utilisation") or {}
        con.print(f"  {'utilisation':<13}{_bar(util.get('gpu'))} [dim](share of time a kernel ran)[/]", highlight=False)
        if util.get("memory") is not None:
            con.print(f"  {'memory util':<13}{_bar(util['memory'])} [dim](share of time the memory controller "
                      "was busy)[/]", highlight=False)
        con.print("  [dim]no compute / memory / interconnect split: these are shares of time, not of the GPU[/]",
                  highlight=False)
    else:
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
    _instances(con, rep.get("instances"))
    for i, f in enumerate(rep["findings"]):
        text = shown(f, LINE_MAX)
        con.print(f"[bold cyan]→ {text}[/]" if i == 0 else f"  • {text}", highlight=False)
    for n in rep["notes"]:
        con.print(f"[dim]note: {shown(n, LINE_MAX)}[/]", highlight=False)
    if html_path is not None:
        con.print(f"HTML report: {html_path}")
