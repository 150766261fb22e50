"""Headless Chromium for the HTML report tests: render a page, return its pixels and DOM."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from tests import needs

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    """Debian's chromium (``scripts/test`` installs it as root); without it the test fails
    (``HPCML_ALLOW_SKIP_CHROMIUM=1``: skips, tests/needs.py)."""
    for name in ("chromium-browser", "google-chrome"):
        if shutil.which(name):
            return str(shutil.which(name))
    return needs.tool("chromium")


def render(page: Path, workdir: Path, size=(1200, 2000)) -> tuple[np.ndarray, str]:
    """(RGB pixels of a screenshot, the DOM after layout) of ``page``."""
    from PIL import Image
    browser = chromium()
    shot = workdir / "shot.png"
    base = [browser, *FLAGS, f"--user-data-dir={workdir / 'profile'}"]
    p = subprocess.run(base + [f"--screenshot={shot}", f"--window-size={size[0]},{size[1]}", page.as_uri()],
                       check=False, capture_output=True, text=True, timeout=120)
    assert shot.exists(), p.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    dom = subprocess.run(base + ["--dump-dom", page.as_uri()], check=False, capture_output=True,
                         text=True, timeout=120).stdout
    return pixels, dom


def assert_not_blank(pixels: np.ndarray) -> None:
    rgb = pixels.reshape(-1, 3).astype(np.int64)
    colours = np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2])
    assert len(colours) > 200, f"only {len(colours)} colours: the page looks blank"
    white = np.all(rgb > 245, axis=1).mean()
    assert white < 0.97, f"{white:.0%} of the screenshot is white"
    # the heatmap (an inline PNG in SVG) is drawn: viridis' dark purple appears
    purple = np.all(np.abs(rgb - [68, 1, 84]) < 25, axis=1).sum()
    assert purple > 1000, "the step-time heatmap did not render"


# Run in the page after layout: for every chart (an SVG with a plot area, fill #fafafa), the
# rendered boxes of its data marks (lines, bands), of its plot area and of its y gridlines.
_PROBE = """<script>
window.addEventListener('load', () => {
  const box = el => { const b = el.getBBox(); return [b.x, b.y, b.width, b.height]; };
  const out = [...document.querySelectorAll('svg')].map(svg => {
    const plot = [...svg.querySelectorAll('rect')].find(r => r.getAttribute('fill') === '#fafafa');
    if (!plot) return null;
    return {title: (svg.querySelector('title') || {}).textContent || '', plot: box(plot),
            marks: [...svg.querySelectorAll('path, polygon')].map(box),
            grid: [...svg.querySelectorAll('line')].filter(l => l.getAttribute('stroke') === '#e4e4e4')
                  .map(l => l.getBBox().y)};
  }).filter(x => x);
  const pre = document.createElement('pre'); pre.id = 'hpcml-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chart_boxes(page: Path, workdir: Path) -> list[dict]:
    """Each chart of ``page`` as Chromium laid it out: title, plot area, data marks' boxes
    and y gridlines (x, y, width, height in the SVG's own coordinates)."""
    import html
    import json
    import re
    probed = workdir / "probed.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dom = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={workdir / 'profile'}", "--dump-dom",
                          probed.as_uri()], check=False, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="hpcml-probe">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))
