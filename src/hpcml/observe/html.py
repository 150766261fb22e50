"""The job report as ONE self-contained HTML file: inline SVG, no JavaScript, no network
(the drawing pieces are in :mod:`hpcml.htmlkit`, shared with score's report; the page is
``templates/observe.html.j2``, its sections ``templates/observe_parts.html.j2``, which
``hpcml run``'s report embeds).

Why hand-written SVG instead of a plotting library: the file must open offline on a login
node or a laptop years later, from a mail attachment or a shared folder. A plotting
library would either add a heavy dependency (matplotlib) to render static images or
need a JS bundle inlined in every report (plotly: ~3 MB). The report needs only line
charts with a band and one heatmap, which are ~150 lines of SVG here and render in any
browser, with native ``<title>`` tooltips. The heatmap (up to 256 rows x 1000 buckets)
is an inline PNG inside the SVG, encoded below with ``zlib`` (a 256k-rect SVG would be
tens of MB; the PNG is a few hundred kB).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from markupsafe import Markup

from hpcml.files import write_atomic
from hpcml.htmlkit import PALETTE, bridge_gaps, fmt_duration, fmt_number, heatmap, line_chart
from hpcml.htmlkit import render as render_page
from hpcml.observe.progress import line as progress_line
from hpcml.observe.report import Report

MAX_NODE_LINES = 12

def _node_chart(t, entry: dict, title: str, spans, startup: float = 0.0) -> Markup | None:
    nodes, m = entry["nodes"], np.asarray(entry["values"], float)
    m = np.vstack([bridge_gaps(row) for row in m]) if len(m) else m       # samples sparser than buckets
    keep = np.isfinite(m).any(axis=1)
    nodes, m = [n for n, k in zip(nodes, keep) if k], m[keep]
    if not len(nodes):
        return None
    if len(nodes) <= MAX_NODE_LINES:
        lines = [(n, m[i], PALETTE[i % len(PALETTE)]) for i, n in enumerate(nodes)]
        return line_chart(t, title=title, lines=lines, spans=spans, startup=startup)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p10, p50, p90 = np.nanpercentile(m, [10, 50, 90], axis=0)
        mn = np.nanmin(m, axis=0)
    return line_chart(t, title=f"{title} — {len(nodes)} nodes", spans=spans, startup=startup,
                      lines=[("median node", p50, PALETTE[0]), ("min node", mn, PALETTE[3])],
                      bands=[(p10, p90, PALETTE[0])])


def _facts(rep: Report) -> list[tuple[str, str]]:
    """The job in a few lines, led by what it did (steps, samples, last metric values), then
    ranks, nodes, duration, rows, throughput."""
    dur = fmt_duration(rep.duration_s) if rep.duration_s is not None else "–"
    nodes = ", ".join(rep.nodes[:20]) + (f" … ({len(rep.nodes)})" if len(rep.nodes) > 20 else "")
    tp = rep.throughput
    kv = [("did", progress_line(rep.progress)),
          ("ranks", f"{rep.ranks_with_data} with data of {rep.ranks_expected}"),
          ("nodes", nodes or "–"), ("duration", dur), ("rows", f"{rep.rows:,}")]
    if tp:
        def num(v):
            return fmt_number(float("nan") if v is None else v)
        kv.append(("throughput", f"median {num(tp['median'])} {tp['unit']} "
                                 f"(min {num(tp['min'])}, max {num(tp['max'])})"))
    return kv


def _tables(rep: Report) -> list[tuple[str, list[str], list[list[Any]]]]:
    """(heading, column names, rows) of each table the report has rows for."""
    lost = [[r, "no data"] for r in rep.missing_ranks] + [[r, why] for r, why in rep.damaged_ranks.items()] \
        + [[r, f"exit code {ec}"] for r, ec in rep.failed_ranks.items()]
    tables = [
        ("Chronic stragglers", ["rank", "node", "GPUs", "× step median", "slow steps", "trend", "confidence"],
         [[s["rank"], s["node"] or "?", ",".join(s["gpus"]), s["score"], s["slow_fraction"], s["trend"],
           s["confidence"]] for s in rep.stragglers]),
        ("Job-wide stalls", ["from", "to", "seconds", "step rate / median"],
         [[fmt_duration(s["start_s"]), fmt_duration(s["end_s"]), s["duration_s"], s["ratio"]] for s in rep.stalls]),
        ("One-off stalls", ["rank", "node", "step", "× step median"],
         [[o["rank"], o["node"] or "?", o["step"], o["ratio"]] for o in rep.one_off_stalls[:20]]),
        ("Transient stragglers", ["rank", "node", "from step", "to step", "× others"],
         [[o["rank"], o["node"] or "?", o["first_step"], o["last_step"], o["ratio"]]
          for o in rep.transient_stragglers[:20]]),
        ("Lost and damaged ranks", ["rank", "problem"], lost),
        ("Sections", ["section", "total s (its ranks)", "ranks", "mean s", "share of its ranks' step"],
         [[n, d["total_s"], d.get("ranks", "–"), d["mean_s"],
           "–" if d["share_of_step"] is None else f"{d['share_of_step'] * 100:.1f}%"]
          for n, d in sorted(rep.sections.items())]),
    ]
    return [t for t in tables if t[2]]


def _charts(rep: Report) -> dict[str, Any]:
    """The charts over time, pre-rendered: the job's, and those per node (GPU, host)."""
    p = rep.plots
    t = np.asarray(p.get("t", []), float)
    t_end = float(t[-1] + p.get("bucket_s", 1) / 2) if len(t) else 1.0
    spans = [(s["start_s"], s["end_s"]) for s in rep.stalls]
    startup = float(p.get("startup_s") or 0.0)
    charts = []
    if p.get("throughput"):
        charts.append(line_chart(t, title="Throughput", unit=p["throughput"]["name"], spans=spans, startup=startup,
                                 lines=[("median rank", p["throughput"]["values"], PALETTE[0])]))
    if p.get("heatmap"):
        hm = p["heatmap"]
        grp = f" (groups of {hm['group']} ranks, slowest shown)" if hm["group"] > 1 else ""
        charts.append(heatmap(hm, t_end, title=f"Step time per rank × time{grp}"))
    for sr in p.get("series", []):
        charts.append(line_chart(t, title=f"{sr['kind']} {sr['name']}", spans=spans, startup=startup,
                                 lines=[("median", sr["median"], PALETTE[0])],
                                 bands=[(sr["p10"], sr["p90"], PALETTE[0])]))
    per_node = {kind: [c for g in p.get(kind) or [] if (c := _node_chart(t, g, f"{kind} {g['name']}", spans, startup))]
                for kind in ("gpu", "host")}
    return {"bucket_s": f"{p.get('bucket_s', 0):.3g}", "charts": charts, "gpu": per_node["gpu"] if p.get("gpu") else None,
            "host": per_node["host"] if p.get("host") else None}


def view(rep: Report) -> dict[str, Any]:
    """What the templates show of ``rep``: its values (escaped there) and its charts."""
    return {"job_id": rep.job_id, "path": rep.path, "facts": _facts(rep),
            "findings": [(f.message, f.advice) for f in rep.findings], "unjudged": rep.unjudged,
            "tables": _tables(rep), **_charts(rep)}


def render(rep: Report) -> str:
    """The whole page as a string."""
    return render_page("observe.html.j2", v=view(rep))


def write(rep: Report, path: str | Path) -> Path:
    path = Path(path)
    write_atomic(path, render(rep))
    return path
