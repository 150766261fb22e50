"""HTML and SVG pieces every offline report shares: number and time formats, line charts
with bands, heatmaps as inline PNG, and the one Jinja2 environment that renders the pages
(``templates/``: the base page with its CSS, each report's page, the shared tables).

Why hand-written SVG instead of a plotting library: a report must open offline on a login
node or a laptop years later, from a mail attachment or a shared folder. A plotting
library would either add a heavy dependency (matplotlib) to render static images or
need a JS bundle inlined in every report (plotly: ~3 MB). The reports need only line
charts with a band and heatmaps, which are ~150 lines of SVG here and render in any
browser, with native ``<title>`` tooltips. A heatmap (up to 256 rows x 1000 buckets)
is an inline PNG inside the SVG, encoded with ``zlib`` (a 256k-rect SVG would be tens of
MB; the PNG is a few hundred kB).

Escaping: the pages are templates with autoescape on, so a node name, a command or an
error text is escaped by Jinja2, once. The charts are built here as ``Markup`` with
``Markup.format``, which escapes every value it is given (MarkupSafe, Jinja2's own
escaping), and are the only markup the templates take as it is.
"""

from __future__ import annotations

import base64
import functools
import re
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from markupsafe import Markup

if TYPE_CHECKING:
    import jinja2

TEMPLATES = Path(__file__).with_name("templates")

W, H = 1100, 210                     # chart size in px
ML, MR, MT, MB = 70, 130, 26, 28     # margins: left (y labels), right (legend), top, bottom
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a")
VIRIDIS = np.array([(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)], float)


# ------------------------------------------------------------------------- the pages

@functools.cache
def environment() -> jinja2.Environment:
    """The reports' one environment: autoescaped, and strict (a misspelt name is an error,
    not an empty cell). Jinja2 is imported on first use, so the terminal paths that only
    format numbers here do not load it."""
    import jinja2
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              finalize=plain)


#: what no page shows as it is: control characters (a terminal runs them when the file is
#: printed with ``cat``) and the bidirectional overrides (a cell's text shown reversed)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plain(value: Any) -> Any:
    """A value as a page shows it: a text's control characters and direction overrides as
    escapes (a node name, a GPU id or a command comes from files anyone could write); our
    own markup and everything that is not text as it is. Every ``{{ }}`` of the pages."""
    if isinstance(value, str) and not isinstance(value, Markup) and _CONTROL.search(value):
        return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", value)
    return value


def warm(template: str) -> None:
    """Compile ``template`` and every template it extends, imports or includes into the
    environment's cache (~50 ms for a run's page), so that rendering it later costs only the
    rendering: the launcher does this while the ranks run."""
    import jinja2.meta
    env, todo, seen = environment(), [template], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        source = env.loader.get_source(env, name)[0] if env.loader else ""
        todo += [t for t in jinja2.meta.find_referenced_templates(env.parse(source)) if t]
        env.get_template(name)


def render(template: str, **context: Any) -> str:
    """``templates/<template>`` rendered with ``context``."""
    return environment().get_template(template).render(**context)


def no_data(title: str) -> Markup:
    """What a chart without a value says instead."""
    return Markup("<p class='muted'>{}: no data</p>").format(title)


# ------------------------------------------------------------------------- SVG helpers

def fmt_number(v: float | None, digits: int = 3) -> str:
    if v is None or not np.isfinite(v):
        return "–"
    a = abs(v)
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.{digits}g}{suf}"
    return f"{v:.{digits}g}"


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Labels for an axis's ticks, each one different: as few significant digits as tell
    them apart (3 at least; 11.5k, 11.5k, 11.5k for 11,500 to 11,520 says nothing)."""
    for digits in range(3, 16):
        labels = [fmt_number(v, digits) for v in ticks]
        if len(set(labels)) == len(labels):
            return labels
    return labels


#: steps of a time axis, in seconds: whole seconds, minutes, hours, days
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
               172800, 432000, 864000)


def time_ticks(tmax: float, n: int = 8) -> list[float]:
    """Ticks of a time axis from 0 to ``tmax`` seconds at a step a clock reads (never under a
    second, so no two read alike), at most about ``n`` of them."""
    if not np.isfinite(tmax) or tmax <= 0:
        return [0.0]
    step = next((s for s in _TIME_STEPS if tmax / s <= n), _TIME_STEPS[-1] * np.ceil(tmax / n / _TIME_STEPS[-1]))
    return [float(v) for v in np.arange(0.0, tmax + step * 1e-9, step)]


def fmt_clock(s: float, step: float) -> str:
    """A time axis's label: d:hh:mm once the axis spans days, else ``fmt_duration``."""
    if step >= 3600 and s >= 86400:
        s = round(s)
        return f"{s // 86400}d {s // 3600 % 24:02d}:{s // 60 % 60:02d}"
    return fmt_duration(s)


def fmt_duration(s: float) -> str:
    s = round(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not np.isfinite(lo) or not np.isfinite(hi):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** np.floor(np.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return list(np.arange(np.ceil(lo / step) * step, hi + step * 1e-9, step))


def _axis(lo: float, hi: float, n: int = 5) -> tuple[float, float, list[float]]:
    """A y-axis that contains its data: the range widened to whole tick steps on both sides,
    so the lowest and highest gridlines are labelled and bracket every value (a line above
    the top label reads as off the scale)."""
    ticks = _ticks(lo, hi, n)
    if len(ticks) < 2:
        return lo, hi if hi > lo else lo + 1, ticks
    step = ticks[1] - ticks[0]
    a, b = float(np.floor(lo / step + 1e-9) * step), float(np.ceil(hi / step - 1e-9) * step)
    if b <= a:
        b = a + step
    return a, b, [float(v) for v in np.arange(a, b + step * 1e-6, step)]


def bridge_gaps(y: np.ndarray) -> np.ndarray:
    """A sampled series on a finer time grid (host samples every second, buckets of 0.1 s)
    is mostly NaN between its points, and a line through it would be all moves and no
    strokes. Interpolate across interior gaps up to twice the usual spacing of its points;
    longer gaps (a lost node, a stall of the recorder) stay gaps."""
    y = np.asarray(y, float)
    idx = np.flatnonzero(np.isfinite(y))
    if len(idx) < 2:
        return y
    steps = np.diff(idx)
    limit = 2 * int(np.median(steps))
    out = y.copy()
    for a, b in zip(idx[:-1], idx[1:]):
        if 1 < b - a <= limit:
            out[a + 1:b] = np.interp(np.arange(a + 1, b), [a, b], [y[a], y[b]])
    return out


def _path(xs: np.ndarray, ys: np.ndarray) -> str:
    """An SVG path through the finite points; NaN breaks the line, and a point alone between
    two gaps is a dot (a zero-length stroke with round caps), not nothing."""
    out: list[str] = []
    run = 0
    for x, y in zip(xs, ys):
        if np.isfinite(y):
            out.append(f"{'L' if run else 'M'}{x:.1f},{y:.1f}")
            run += 1
        else:
            if run == 1:
                out.append("h0.01")
            run = 0
    if run == 1:
        out.append("h0.01")
    return "".join(out)


def line_chart(t: np.ndarray, *, title: str, lines: list[tuple[str, np.ndarray, str]],
               bands: Sequence[tuple[np.ndarray, np.ndarray, str]] = (),
               spans: Sequence[tuple[float, float]] = (), unit: str = "",
               ylim: tuple[float, float] | None = None, span_fill: str = "#f4b0a0",
               span_label: str = "stall", startup: float = 0.0) -> Markup:
    """Lines (label, y, colour) over time ``t`` (seconds), optional bands (lo, hi, colour)
    and shaded time spans (stalls). ``ylim``: a y range the axis always covers (e.g. 0-1
    for ratios) instead of one fitted to the data. ``startup``: seconds before the first
    step, shaded grey and labelled, so an empty start reads as start-up."""
    ys = [np.asarray(y, float) for _, y, _ in lines] + [np.asarray(b, float) for lo, hi, _ in bands for b in (lo, hi)]
    finite = np.concatenate([y[np.isfinite(y)] for y in ys]) if ys else np.array([])
    if not len(finite) or not len(t):
        return no_data(title)
    y0, y1 = float(finite.min()), float(finite.max())
    if ylim is not None:
        y0, y1 = min(y0, ylim[0]), max(y1, ylim[1])
    elif y1 == y0:                  # a constant series: centre it instead of pinning it to an edge
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    if ylim is None and y0 > 0 and y0 < 0.3 * y1:
        y0 = 0.0
    y0, y1, ticks = _axis(y0, y1)
    tmax = float(t[-1] + (t[1] - t[0]) / 2 if len(t) > 1 else t[-1] + 1)
    if not np.isfinite(tmax) or tmax <= 0:
        tmax = 1.0                  # one instant, or a time axis that ends before it starts
    pw, ph = W - ML - MR, H - MT - MB
    X = ML + np.asarray(t) / tmax * pw
    def Y(v):
        return MT + ph - (np.asarray(v, float) - y0) / (y1 - y0) * ph
    s = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' viewBox='0 0 {W} {H}' role='img'>",
         Markup("<title>{}</title><text x='{}' y='15' style='font-size:13px;font-weight:600'>{}{}</text>").format(
             title, ML, title, f" ({unit})" if unit else ""),
         f"<rect x='{ML}' y='{MT}' width='{pw}' height='{ph}' fill='#fafafa' stroke='#ccc'/>"]
    if startup > 0:
        xs = min(pw, startup / tmax * pw)
        s.append(f"<rect class='startup' x='{ML}' y='{MT}' width='{xs:.1f}' height='{ph}' fill='#d8d8d8' "
                 f"opacity='0.7'><title>start-up: {fmt_duration(startup)} before the first step</title></rect>"
                 + (f"<text x='{ML + 4}' y='{MT + 12}' style='font-size:10px;fill:#666'>start-up</text>"
                    if xs > 40 else ""))
    for a, b in spans:
        xa, xb = ML + a / tmax * pw, ML + b / tmax * pw
        s.append(Markup("<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='{}' opacity='0.6'><title>{} {}–{}"
                        "</title></rect>").format(xa, MT, max(1.0, xb - xa), ph, span_fill, span_label,
                                                  fmt_duration(a), fmt_duration(b)))
    for v, label in zip(ticks, tick_labels(ticks)):
        yy = float(Y(v))
        s.append(f"<line x1='{ML}' x2='{ML + pw}' y1='{yy:.1f}' y2='{yy:.1f}' stroke='#e4e4e4'/>"
                 f"<text x='{ML - 6}' y='{yy + 4:.1f}' text-anchor='end'>{label}</text>")
    xt = time_ticks(tmax, 8)
    step = xt[1] - xt[0] if len(xt) > 1 else 1.0
    for v in xt:
        xx = ML + v / tmax * pw
        if xx <= ML + pw + 0.5:
            s.append(f"<text x='{xx:.1f}' y='{H - 10}' text-anchor='middle'>{fmt_clock(v, step)}</text>")
    for lo, hi, color in bands:
        lo, hi = np.asarray(lo, float), np.asarray(hi, float)
        ok = np.isfinite(lo) & np.isfinite(hi)
        cut = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
        for a, b in zip(cut[::2], cut[1::2]):                   # one polygon per run without gaps
            sl = slice(a, b)
            pts = [f"{x:.1f},{y:.1f}" for x, y in zip(X[sl], Y(hi[sl]))] + \
                  [f"{x:.1f},{y:.1f}" for x, y in zip(X[sl][::-1], Y(lo[sl][::-1]))]
            s.append(f"<polygon points='{' '.join(pts)}' fill='{color}' opacity='0.25'/>")
    for i, (label, y, color) in enumerate(lines):
        s.append(Markup("<path d='{}' fill='none' stroke='{}' stroke-width='1.4' stroke-linecap='round'><title>{}</title></path>").format(
            _path(X, Y(y)), color, label))
        ly = MT + 12 + 14 * i
        if ly < H - MB:
            s.append(Markup("<rect x='{}' y='{}' width='10' height='10' fill='{}'/><text x='{}' y='{}'>{}</text>").format(
                W - MR + 8, ly - 8, color, W - MR + 22, ly + 1, label[:16]))
    s.append("</svg>")
    return Markup("".join(s))


def _png(rgb: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of an (h, w, 3) uint8 array (filter 0 on every row)."""
    h, w, _ = rgb.shape
    raw = np.hstack([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)]).tobytes()
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _colormap(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    f = np.clip((v - lo) / ((hi - lo) or 1.0), 0, 1)
    pos = np.nan_to_num(f) * (len(VIRIDIS) - 1)
    i = np.minimum(pos.astype(int), len(VIRIDIS) - 2)
    frac = (pos - i)[..., None]
    rgb = VIRIDIS[i] * (1 - frac) + VIRIDIS[i + 1] * frac
    rgb[~np.isfinite(v)] = (215, 215, 215)
    return rgb.astype(np.uint8)


def heatmap(hm: dict[str, Any], t_end: float, *, title: str, scale: tuple[float, float] | None = None,
            unit: str = "s", legend: str = "grey: no step") -> Markup:
    """Rows x time buckets as an inline PNG. ``scale``: a fixed colour range (lo, hi);
    by default the 2nd-98th percentile of the values."""
    v = np.asarray(hm["values"], float)
    if not np.isfinite(v).any():
        return no_data(title)
    lo, hi = scale if scale is not None else np.nanpercentile(v, [2, 98])
    rows = v.shape[0]
    ph = int(min(700, max(120, rows * 3)))
    pw = W - ML - MR
    h = MT + ph + MB
    png = base64.b64encode(_png(_colormap(v, lo, hi))).decode()
    s = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{h}' viewBox='0 0 {W} {h}' role='img'>",
         Markup("<text x='{}' y='15' style='font-size:13px;font-weight:600'>{}</text>").format(ML, title),
         (f"<image x='{ML}' y='{MT}' width='{pw}' height='{ph}' preserveAspectRatio='none' "
          f"style='image-rendering:pixelated' href='data:image/png;base64,{png}'/>"),
         f"<rect x='{ML}' y='{MT}' width='{pw}' height='{ph}' fill='none' stroke='#999'/>"]
    labels = hm["labels"]
    for k in range(0, rows, max(1, rows // 10)):
        y = MT + (k + 0.5) * ph / rows
        s.append(Markup("<text x='{}' y='{:.1f}' text-anchor='end'>{}</text>").format(ML - 6, y + 4, labels[k]))
    if not np.isfinite(t_end) or t_end <= 0:
        t_end = 1.0
    xt = time_ticks(t_end, 8)
    step = xt[1] - xt[0] if len(xt) > 1 else 1.0
    for tv in xt:
        x = ML + tv / t_end * pw
        if x <= ML + pw + 0.5:
            s.append(f"<text x='{x:.1f}' y='{h - 10}' text-anchor='middle'>{fmt_clock(tv, step)}</text>")
    bar = tick_labels([lo + k / 4 * (hi - lo) for k in range(5)]) if hi > lo else [fmt_number(lo)] * 5
    for k in range(5):                                   # colour bar
        c = VIRIDIS[k].astype(int)
        s.append(Markup("<rect x='{}' y='{}' width='14' height='22' fill='rgb({},{},{})'/><text x='{}' y='{}'>{}{}"
                        "</text>").format(W - MR + 10, MT + (4 - k) * 22, c[0], c[1], c[2], W - MR + 30,
                                          MT + (4 - k) * 22 + 15, bar[k], f" {unit}" if unit else ""))
    s.append(Markup("<text x='{}' y='{}'>{}</text></svg>").format(W - MR + 10, MT + 128, legend))
    return Markup("".join(s))
