"""The job report as ONE self-contained HTML file: inline SVG, no JavaScript, no network
(the drawing pieces are in :mod:`hpcml.htmlkit`, shared with score's report).

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

import html
from pathlib import Path

import numpy as np

from hpcml.files import write_atomic
from hpcml.htmlkit import CSS, PALETTE, bridge_gaps, fmt_duration, fmt_number, heatmap, line_chart, table
from hpcml.observe.report import Report

MAX_NODE_LINES = 12

def _node_chart(t, entry: dict, title: str, spans, startup: float = 0.0) -> str:
    nodes, m = entry["nodes"], np.asarray(entry["values"], float)
    m = np.vstack([bridge_gaps(row) for row in m]) if len(m) else m       # samples sparser than buckets
    keep = np.isfinite(m).any(axis=1)
    nodes, m = [n for n, k in zip(nodes, keep) if k], m[keep]
    if not len(nodes):
        return ""
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


def render(rep: Report, embedded: bool = False) -> str:
    """The whole page as a string; ``embedded``: its sections only, for a page that has its
    own title and one findings list (``hpcml run``'s report)."""
    p = rep.plots
    t = np.asarray(p.get("t", []), float)
    t_end = float(t[-1] + p.get("bucket_s", 1) / 2) if len(t) else 1.0
    spans = [(s["start_s"], s["end_s"]) for s in rep.stalls]
    startup = float(p.get("startup_s") or 0.0)
    e = html.escape
    out = ["<div class='hpcml-observe'>"] if embedded else [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>hpcml job report {e(rep.job_id)}</title><style>{CSS}</style></head><body>",
        "<div id='hpcml-report'>",
        f"<h1>Job {e(rep.job_id)}</h1><div class='muted'>{e(rep.path)}</div>"]
    dur = fmt_duration(rep.duration_s) if rep.duration_s is not None else "–"
    nodes = ", ".join(rep.nodes[:20]) + (f" … ({len(rep.nodes)})" if len(rep.nodes) > 20 else "")
    tp = rep.throughput
    kv = [("ranks", f"{rep.ranks_with_data} with data of {rep.ranks_expected}"),
          ("nodes", nodes or "–"), ("duration", dur), ("rows", f"{rep.rows:,}")]
    if tp:
        def num(v):
            return fmt_number(float("nan") if v is None else v)
        kv.append(("throughput", f"median {num(tp['median'])} {tp['unit']} "
                                 f"(min {num(tp['min'])}, max {num(tp['max'])})"))
    out.append("<table class='kv'>" + "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in kv)
               + "</table>")
    if not embedded:
        out.append("<h2>Findings</h2>")
        if rep.findings:
            out += [f"<div class='finding'><b>{e(f.message)}</b><br><span class='advice'>→ {e(f.advice)}</span></div>"
                    for f in rep.findings]
        else:
            out.append("<p>Nothing stands out: no stragglers, stalls or lost ranks.</p>")
    if rep.stragglers:
        out.append("<h2>Chronic stragglers</h2>" + table(
            ["rank", "node", "GPUs", "× step median", "slow steps", "trend", "confidence"],
            [[s["rank"], s["node"] or "?", ",".join(s["gpus"]), s["score"], s["slow_fraction"], s["trend"],
              s["confidence"]] for s in rep.stragglers]))
    if rep.stalls:
        out.append("<h2>Job-wide stalls</h2>" + table(
            ["from", "to", "seconds", "step rate / median"],
            [[fmt_duration(s["start_s"]), fmt_duration(s["end_s"]), s["duration_s"], s["ratio"]] for s in rep.stalls]))
    if rep.one_off_stalls:
        out.append("<h2>One-off stalls</h2>" + table(
            ["rank", "node", "step", "× step median"],
            [[o["rank"], o["node"] or "?", o["step"], o["ratio"]] for o in rep.one_off_stalls[:20]]))
    if rep.transient_stragglers:
        out.append("<h2>Transient stragglers</h2>" + table(
            ["rank", "node", "from step", "to step", "× others"],
            [[o["rank"], o["node"] or "?", o["first_step"], o["last_step"], o["ratio"]]
             for o in rep.transient_stragglers[:20]]))
    if rep.missing_ranks or rep.damaged_ranks or rep.failed_ranks:
        rows = [[r, "no data"] for r in rep.missing_ranks] + \
               [[r, why] for r, why in rep.damaged_ranks.items()] + \
               [[r, f"exit code {ec}"] for r, ec in rep.failed_ranks.items()]
        out.append("<h2>Lost and damaged ranks</h2>" + table(["rank", "problem"], rows))
    if rep.sections:
        out.append("<h2>Sections</h2>" + table(
            ["section", "total s (all ranks)", "mean s", "share of step"],
            [[n, d["total_s"], d["mean_s"], "–" if d["share_of_step"] is None else f"{d['share_of_step'] * 100:.1f}%"]
             for n, d in sorted(rep.sections.items())]))

    out.append(f"<h2>Over time</h2><p class='muted'>Buckets of {p.get('bucket_s', 0):.3g} s; "
               "lines are medians across ranks, bands p10–p90; red spans are job-wide stalls.</p>")
    if p.get("throughput"):
        out.append(line_chart(t, title="Throughput", unit=p["throughput"]["name"], spans=spans, startup=startup,
                              lines=[("median rank", p["throughput"]["values"], PALETTE[0])]))
    if p.get("heatmap"):
        hm = p["heatmap"]
        grp = f" (groups of {hm['group']} ranks, slowest shown)" if hm["group"] > 1 else ""
        out.append(heatmap(hm, t_end, title=f"Step time per rank × time{grp}"))
    for sr in p.get("series", []):
        out.append(line_chart(t, title=f"{sr['kind']} {sr['name']}", spans=spans, startup=startup,
                              lines=[("median", sr["median"], PALETTE[0])],
                              bands=[(sr["p10"], sr["p90"], PALETTE[0])]))
    if p.get("gpu"):
        out.append("<h2>GPUs per node</h2><p class='muted'>Mean over each node's GPUs.</p>")
        out += [_node_chart(t, g, f"gpu {g['name']}", spans, startup) for g in p["gpu"]]
    if p.get("host"):
        out.append("<h2>Host per node</h2><p class='muted'>Mean over each node's samples.</p>")
        out += [_node_chart(t, g, f"host {g['name']}", spans, startup) for g in p["host"]]
    if embedded:
        out.append("</div>")
        return "\n".join(out).replace("<h2>", "<h3>").replace("</h2>", "</h3>")
    out.append("<p class='muted'>Generated by hpcml observe report.</p></div></body></html>")
    return "\n".join(out)


def write(rep: Report, path: str | Path) -> Path:
    path = Path(path)
    write_atomic(path, render(rep))
    return path
