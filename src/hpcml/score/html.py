"""The score report (``report.build``'s dict) as ONE self-contained HTML page.

Same rules as observe's job report, whose SVG helpers it reuses (``hpcml.observe.html``):
inline SVG and one inline PNG (the GPU x time heatmap), no JavaScript, no network, so the
file opens offline years later. Missing values (None) are gaps in lines and bands and grey
in the heatmap, never 0. The formulas are the scorer's own docstring, read at render
time, so the page cannot drift from the code. The page is ``templates/score.html.j2``, its
sections ``templates/score_parts.html.j2``, which ``hpcml run``'s report embeds.
"""

from __future__ import annotations

import math
import re
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from markupsafe import Markup

from hpcml.files import write_atomic
from hpcml.htmlkit import PALETTE, fmt_duration, fmt_number, heatmap, line_chart, no_data
from hpcml.htmlkit import render as render_page
from hpcml.score import model
from hpcml.score.report import PLOTTED_FIELDS

MAX_GPU_ROWS = 64
PARTS = ("compute", "memory", "interconnect")
COLOURS = {"score": PALETTE[0], "compute": PALETTE[0], "memory": PALETTE[1], "interconnect": PALETTE[2]}
OUTSIDE = "#d0d0d0"          # time outside the scored (trimmed) span
TEMPORAL = "temporal utilisation only"

# field -> (description, unit, y range the axis always covers)
FIELD_INFO: dict[str, tuple[str, str, tuple[float, float] | None]] = {
    "sm_active": ("SM active", "", (0.0, 1.0)),
    "sm_occupancy": ("SM occupancy", "", (0.0, 1.0)),
    "pipe_tensor_active": ("tensor pipe active", "", (0.0, 1.0)),
    "pipe_fp64_active": ("FP64 pipe active", "", (0.0, 1.0)),
    "pipe_fp32_active": ("FP32 pipe active", "", (0.0, 1.0)),
    "pipe_fp16_active": ("FP16 pipe active", "", (0.0, 1.0)),
    "dram_active": ("DRAM active", "", (0.0, 1.0)),
    "pcie_tx_bytes": ("PCIe transmit", "B/s", None),
    "pcie_rx_bytes": ("PCIe receive", "B/s", None),
    "nvlink_tx_bytes": ("NVLink transmit", "B/s", None),
    "nvlink_rx_bytes": ("NVLink receive", "B/s", None),
    "gpu_util": ("GPU utilisation (NVML, temporal)", "%", (0.0, 100.0)),
    "mem_util": ("memory controller utilisation (NVML, temporal)", "%", (0.0, 100.0)),
    "power_usage": ("power", "W", None),
    "sm_clock": ("SM clock", "MHz", None),
    "fb_used": ("framebuffer used", "MiB", None),
}


# ------------------------------------------------------------------------- small pieces

def _num(v: Any, nd: int = 2) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{nd}f}"


def _arr(values: list | None) -> np.ndarray:
    """A JSON list with None as NaN (so a gap stays a gap)."""
    return np.array([np.nan if x is None else x for x in (values or [])], float)


def _inline(text: str) -> list[tuple[str, bool]]:
    """(text, is code) runs of a line: ````code```` marks code."""
    return [(run, i % 2 == 1) for i, run in enumerate(re.split(r"``(.+?)``", text)) if run]


def doc_blocks(doc: str | None) -> list[tuple[str, list[list[tuple[str, bool]]]]] | None:
    """A docstring as ("p" or "ul", its lines as :func:`_inline` runs): blank-line paragraphs,
    ``- `` bullet lists; the template writes the markup. None: no docstring (``-OO``)."""
    if not doc:
        return None
    out: list[tuple[str, list[list[tuple[str, bool]]]]] = []
    for block in re.split(r"\n\s*\n", textwrap.dedent(doc).strip()):
        lines = block.strip().splitlines()
        if lines[0].startswith("- "):
            items: list[str] = []
            for line in lines:
                if line.startswith("- "):
                    items.append(line[2:].strip())
                else:
                    items[-1] += " " + line.strip()
            out.append(("ul", [_inline(i) for i in items]))
        else:
            out.append(("p", [_inline(" ".join(x.strip() for x in lines))]))
    return out


def breakdown_chart(breakdown: dict[str, float | None], bound: str | None) -> Markup:
    """Compute / memory / interconnect as horizontal bars on a fixed 0-1 scale."""
    w, lw, bw, row = 560, 110, 340, 26
    h = 16 + row * len(PARTS) + 18
    s = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' viewBox='0 0 {w} {h}' role='img' "
         "class='breakdown'><title>score breakdown: job medians, 0-1</title>"]
    for k in (0, 0.25, 0.5, 0.75, 1.0):
        x = lw + k * bw
        s.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='10' y2='{h - 16}' stroke='#e4e4e4'/>"
                 f"<text x='{x:.1f}' y='{h - 4}' text-anchor='middle'>{k:g}</text>")
    for i, part in enumerate(PARTS):
        v = breakdown.get(part)
        y = 12 + i * row
        weight = "font-weight:700" if part == bound else ""
        s.append(f"<text x='{lw - 8}' y='{y + 15}' text-anchor='end' style='font-size:13px;{weight}'>{part}</text>"
                 f"<rect x='{lw}' y='{y + 3}' width='{bw}' height='{row - 8}' fill='#f0f0f0'/>")
        if v is None:
            s.append(f"<text x='{lw + 6}' y='{y + 15}' style='fill:#888'>no data</text>")
            continue
        s.append(f"<rect x='{lw}' y='{y + 3}' width='{max(0.0, min(1.0, v)) * bw:.1f}' height='{row - 8}' "
                 f"fill='{COLOURS[part]}'><title>{part} {v:.3f}</title></rect>"
                 f"<text x='{lw + bw + 8}' y='{y + 15}' style='font-size:13px;{weight}'>{v:.2f}"
                 f"{'  ← bound' if part == bound else ''}</text>")
    s.append("</svg>")
    return Markup("".join(s))       # numbers and the fixed PARTS only


def _centres(t: list, t_end: float) -> np.ndarray:
    """Bucket centres from bucket starts (the charts place a value mid-bucket)."""
    starts = _arr(t)
    if not len(starts):
        return starts
    ends = np.append(starts[1:], t_end)
    return (starts + ends) / 2


def _outside(rep: dict, t_end: float) -> list[tuple[float, float]]:
    """The time left out of the score (warm-up before, tail after the trimmed span)."""
    span = rep.get("span_s")
    if not span:
        return [(0.0, t_end)] if t_end > 0 else []
    dt = rep.get("interval_s") or 0.0
    out = []
    if span[0] > 0:
        out.append((0.0, float(span[0])))
    if span[1] + dt < t_end:
        out.append((float(span[1]) + dt, t_end))
    return out


def _metric_chart(t: np.ndarray, name: str, m: dict | None, spans, *, title: str | None = None,
                  unit: str = "", ylim=None, colour: str = PALETTE[0]) -> tuple[str, Markup]:
    """(the metric's name, its chart or its "no data" line)."""
    title = title or name
    if not m or not len(t):
        return name, no_data(title)
    mean, lo, hi = _arr(m.get("mean")), _arr(m.get("min")), _arr(m.get("max"))
    return name, line_chart(t, title=title, unit=unit, ylim=ylim, spans=spans, span_fill=OUTSIDE,
                            span_label="outside the scored span", lines=[("mean of GPUs", mean, colour)],
                            bands=[(lo, hi, colour)])


def _start(rep: dict) -> str:
    start = rep.get("start")
    if start is None:
        return "–"
    if start > 1e8:                                   # epoch seconds
        return datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{start:g} s"


def _gpu_rows(per_gpu: list[dict]) -> list[list[str]]:
    def key(g):
        s = g.get("score")
        return (s is None, s if s is not None else 0.0, g.get("gpu", ""))
    rows = []
    for g in sorted(per_gpu, key=key):
        rows.append([g.get("gpu", "?"), _num(g.get("score")), g.get("bound") or "–", _num(g.get("compute")),
                     _num(g.get("memory")), _num(g.get("interconnect")), _num(g.get("gssr")),
                     _num((g.get("medians") or {}).get("sm_active")),
                     "–" if g.get("coverage") is None else f"{g['coverage'] * 100:.0f}%",
                     str(g.get("samples", "–")), g.get("model") or "–"])
    return rows


# ------------------------------------------------------------------------- the page

def _facts(rep: dict, meta: dict) -> list[tuple[str, str]]:
    """gssr, imbalance, the scored span, energy and the recording's own metadata."""
    imb = rep.get("imbalance") or {}
    span = rep.get("span_s")
    kv = [("gssr (for comparison)", f"{_num(rep.get('gssr'))} — gssr's documented formula computed on the same "
                                    "samples (see below); it is not this score"),
          ("imbalance", f"CoV of per-GPU scores {_num(imb.get('gpus'))} across GPUs, "
                        f"{_num(imb.get('nodes'))} across node means"),
          ("scored span", f"{fmt_duration(span[0])}–{fmt_duration(span[1])} (warm-up and tail left out; grey in the charts)"
           if span else "none: no active span found")]
    util = rep.get("utilisation") or {}
    if rep.get("temporal_only") and util.get("gpu") is not None:
        kv.append(("utilisation", f"{_num(util.get('gpu'))} of the time a kernel ran, {_num(util.get('memory'))} "
                                  "the memory controller was busy (medians over GPUs; shares of time, no "
                                  "compute / memory / interconnect split)"))
    inst = rep.get("instances")
    if inst:
        kv.append(("MIG instances", f"{inst['count']} scored apart from their GPUs: score {_num(inst.get('score'))}"
                                    f" ({inst['bound'] + '-bound' if inst.get('bound') else 'bound unknown'}); "
                   + "; ".join(f"{g['gpu']} {_num(g.get('score'))}" for g in inst["per_instance"][:16])))
    if rep.get("energy_wh") is not None:
        kv.append(("energy", f"{rep['energy_wh']:,.1f} Wh on {rep.get('energy_gpus')} GPUs (whole recording)"))
    return kv + [(str(k), str(v)) for k, v in meta.items() if isinstance(v, (str, int, float)) and k not in ("job_id", "job")]


def _over_time(rep: dict, temporal: bool) -> dict[str, Any]:
    """The charts: score and contributions (not for temporal-only), the heatmap, each metric."""
    series = rep.get("series") or {}
    metrics = series.get("metrics") or {}
    dt = rep.get("interval_s") or 1.0
    t_end = float((rep.get("duration_s") or 0.0) + dt)
    t = _centres(series.get("t") or [], t_end)
    spans = _outside(rep, t_end)
    out: dict[str, Any] = {"score_chart": None, "contrib": None}
    if not temporal:
        out["score_chart"] = _metric_chart(t, "score", metrics.get("score"), spans, title="score", ylim=(0, 1))
        contrib = [(p, _arr((metrics.get(p) or {}).get("mean")), COLOURS[p]) for p in PARTS]
        contrib = [(p if np.isfinite(y).any() else f"{p} (no data)", y, c) for p, y, c in contrib if len(y) == len(t)]
        out["contrib"] = line_chart(t, title="contributions: compute, memory, interconnect (mean of GPUs)", lines=contrib,
                                    ylim=(0, 1), spans=spans, span_fill=OUTSIDE, span_label="outside the scored span") \
            if contrib and len(t) else no_data("contributions")
    hm = rep.get("heatmap") or {"values": [], "labels": [], "group": 1}
    grp = ""
    if hm.get("group", 1) > 1:                 # "a … b" labels do not fit the margin: first GPU of each group
        grp = f" (groups of {hm['group']} GPUs from the one named, lowest shown)"
        hm = dict(hm, labels=[str(x).split(" … ")[0] for x in hm.get("labels", [])])
    out["heatmap"] = heatmap(hm, t_end, title=f"score per GPU × time{grp}", scale=(0.0, 1.0), unit="",
                             legend="grey: no sample")
    out["metrics"] = []
    for field in list(PLOTTED_FIELDS) + sorted(set(metrics) - set(PLOTTED_FIELDS) - {"score", *PARTS}):
        desc, unit, ylim = FIELD_INFO.get(field, (field, "", None))
        out["metrics"].append(_metric_chart(t, field, metrics.get(field), spans, title=f"{field} — {desc}"
                                            if desc != field else field, unit=unit, ylim=ylim))
    return out


def view(report: dict) -> dict[str, Any]:
    """What the templates show of the score report: its values (escaped there) and charts."""
    rep = report
    meta = rep.get("meta") or {}
    job = meta.get("job_id") or meta.get("job")
    source = str(rep.get("source") or "")
    temporal = bool(rep.get("temporal_only"))
    score = None if temporal else rep.get("score")
    bound = None if temporal else rep.get("bound")
    rows = _gpu_rows(rep.get("per_gpu") or [])
    return {"name": f"job {job}" if job else source or "recording", "source": source, "gpus": rep.get("gpus", 0),
            "nodes": rep.get("nodes", 0), "start": _start(rep), "duration": fmt_duration(rep.get("duration_s") or 0),
            "interval": fmt_number(rep.get("interval_s")), "temporal": temporal,
            "score": None if score is None else f"{score:.2f}", "bound": bound,
            "breakdown": None if temporal else breakdown_chart(rep.get("breakdown") or {}, bound),
            "facts": _facts(rep, meta),
            "findings": [f for f in rep.get("findings") or [] if not (temporal and f.startswith(TEMPORAL))],
            "notes": [str(n) for n in rep.get("notes") or []], **_over_time(rep, temporal),
            "per_node": [[n.get("node"), n.get("gpus"), _num(n.get("score")), _num(n.get("min"))]
                         for n in rep.get("per_node") or []],
            "per_gpu": rows[:MAX_GPU_ROWS], "hidden": len(rows) - MAX_GPU_ROWS, "doc": doc_blocks(model.__doc__),
            "schema": rep.get("schema", rep.get("version", "?"))}


def render(report: dict) -> str:
    """The whole page as a string."""
    return render_page("score.html.j2", v=view(report))


def write(report: dict, path: str | Path) -> Path:
    """Write the page atomically (ASCII with character references, whatever the locale)."""
    path = Path(path)
    write_atomic(path, render(report).encode("ascii", "xmlcharrefreplace").decode("ascii"))
    return path
