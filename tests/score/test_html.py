"""The score's HTML page: pure-Python checks of the markup, then the page in headless
Chromium (tests/observe/browser.py): no console errors, no requests, the heatmap drawn."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hpcml.score import html as score_html
from hpcml.score.recording import Recording
from hpcml.score.report import PLOTTED_FIELDS, build
from tests.observe import browser
from tests.score import synth

LAGGING = "nid00001:3"          # synth's slow GPU
DROPPED = 1                     # heatmap row of nid00000:1, which stops half way
VIRIDIS_LOW = np.array([68, 1, 84])


@pytest.fixture(scope="module")
def rep() -> dict:
    return build(synth.recording())


def _missing_recording() -> Recording:
    """synth with no NVLink fields at all, DRAM activity NaN everywhere and an unknown model
    (so interconnect has no peak to divide by)."""
    rec = synth.recording()
    for g in rec.gpus.values():
        g.model = "Mystery GPU"
        g.values = {k: v for k, v in g.values.items() if not k.startswith("nvlink")}
        g.values["dram_active"] = np.full(len(g.t), np.nan, np.float32)
    return rec


def _temporal_recording() -> Recording:
    rec = Recording(source="nvml", temporal_only=True)
    t = 1_700_000_000 + np.arange(60, dtype=float)
    for i in range(2):
        rec.gpu("nid00000", str(i)).set_columns(t, {"gpu_util": np.where(np.arange(60) > 5, 100.0, 0.0),
                                                     "power_usage": np.full(60, 300.0)})
    return rec


def _metric_divs(page: str) -> dict[str, str]:
    """data-metric -> the div's inner markup (works on our markup and Chromium's DOM dump)."""
    return {m.group(1): m.group(2) for m in re.finditer(
        r"<div class=['\"]metric['\"] data-metric=['\"](\w+)['\"]>(.*?)</div>", page, re.S)}


def _with_data(rep: dict) -> set[str]:
    return {k for k, m in rep["series"]["metrics"].items() if any(v is not None for v in m["mean"])}


def _heatmap_png(page: str) -> np.ndarray:
    from PIL import Image
    found = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(found) == 1, "expected exactly one inline PNG (the heatmap)"
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(found[0]))).convert("RGB"))


# ------------------------------------------------------------------ pure Python

def test_none_values_break_lines_and_bands_instead_of_dropping_to_zero(rep):
    r = json.loads(json.dumps(rep))                     # a deep copy, as the JSON report would be
    m = r["series"]["metrics"]["sm_active"]
    for k in ("mean", "min", "max"):
        m[k][50:60] = [None] * 10
    div = _metric_divs(score_html.render(r))["sm_active"]
    path = re.search(r"<path d='([^']*)'", div).group(1)
    points = re.findall(r"([ML])([\d.]+),([\d.]+)", path)
    assert [p[0] for p in points].count("M") == 2, "a None run must lift the pen once"
    assert len(points) == len(m["mean"]) - 10          # no point drawn for a missing bucket
    assert len(re.findall(r"<polygon ", div)) == 2      # the min-max band splits around the gap
    # the line's lowest point is the warm-up (sm_active 0.01), not a 0 put in for the gap
    ys = [float(p[2]) for p in points]
    xs = [float(p[1]) for p in points]
    gap_x = sorted(xs)[49], sorted(xs)[50]               # neighbours of the gap are far apart
    assert gap_x[1] - gap_x[0] > 5 * (xs[1] - xs[0])
    assert max(ys) == pytest.approx(max(ys[:10]))


def test_page_content_matches_the_report(rep):
    page = score_html.render(rep)
    assert "<script" not in page and "<link" not in page and "@import" not in page and "src=" not in page
    assert page.replace("http://www.w3.org/2000/svg", "").count("http://") == 0 and "https://" not in page
    assert f"{rep['score']:.2f}" in page and f"<b>{rep['bound']}</b>-bound" in page
    assert "grey: no sample" in page and "grey: no step" not in page
    # the formulas are the scorer's docstring, rendered
    assert "DRAM activity&#39;s practical peak" in page                 # escaped by the template, once
    assert "<code>M = min(1, DRAM active / 0.8)</code>" in page
    divs = _metric_divs(page)
    assert set(divs) == set(PLOTTED_FIELDS) | {"score"}
    charts = {k for k, v in divs.items() if "<svg" in v}
    assert charts == _with_data(rep) - {"compute", "memory", "interconnect"}
    assert all("no data" in divs[k] for k in set(divs) - charts)
    # heatmap: one pixel per GPU and bucket, fixed 0-1 scale; missing is grey, not "0" purple
    png = _heatmap_png(page)
    assert png.shape[:2] == (rep["gpus"], len(rep["series"]["t"]))
    assert tuple(png[DROPPED, -20]) == (215, 215, 215)
    assert np.abs(png[0, 2].astype(int) - VIRIDIS_LOW).max() < 3          # warm-up: score 0
    # tables: lowest score first
    gpus = re.search(r"<table id='gpus'>(.*?)</table>", page, re.S).group(1)
    assert re.findall(r"<tr><td>([^<]+)</td>", gpus)[0] == LAGGING


def test_gpu_table_is_capped_with_a_note():
    r = build(synth.recording(nodes=25, gpus_per_node=4, seconds=40))
    page = score_html.render(r)
    gpus = re.search(r"<table id='gpus'>(.*?)</table>", page, re.S).group(1)
    assert gpus.count("<tr><td>") == score_html.MAX_GPU_ROWS
    assert f"{100 - score_html.MAX_GPU_ROWS} more GPUs not shown" in page


def test_write_is_atomic_ascii(rep, tmp_path):
    out = score_html.write(rep, tmp_path / "score.html")
    assert out == tmp_path / "score.html" and not list(tmp_path.glob("*.tmp"))
    raw = out.read_bytes()
    raw.decode("ascii")                                 # any locale can write and read it
    assert b"&#963;" in raw                             # sigma in the gssr formula, as a reference


# ------------------------------------------------------------------ headless Chromium

def _load(page: Path, workdir: Path) -> tuple[str, list[str], list[str]]:
    """(DOM after load, console messages, URLs the page itself requested) in headless Chromium.

    Chromium's own background requests (updates, accounts) are not the page's: the page's
    carry the file:// network isolation key in the net log."""
    net = workdir / "net.json"
    p = subprocess.run([browser.chromium(), *browser.FLAGS, f"--user-data-dir={workdir / 'profile-net'}",
                        "--enable-logging=stderr", "--v=0", f"--log-net-log={net}", "--dump-dom", page.as_uri()],
                       check=False, capture_output=True, text=True, timeout=120)
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    log = json.loads(net.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = [e["params"]["url"] for e in log["events"] if e["type"] == start
            and "file://" in str(e.get("params", {}).get("network_isolation_key", ""))]
    return p.stdout, console, urls


def test_the_probe_sees_js_errors_and_requests(tmp_path):
    """The no-errors / no-requests checks below can fail: a bad page trips both."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><img src='http://example.invalid/x.png'>"
                   "<script>undefinedFn();</script></body></html>")
    dom, console, urls = _load(bad, tmp_path)
    assert any("Uncaught" in c for c in console)
    assert urls == ["http://example.invalid/x.png"]


def test_page_renders_in_headless_chromium(rep, tmp_path):
    page = score_html.write(rep, tmp_path / "score.html")
    dom, console, urls = _load(page, tmp_path)
    assert console == [] and urls == []
    assert 'id="hpcml-score"' in dom
    assert re.search(r'id="score">([^<]*)<', dom).group(1) == f"{rep['score']:.2f}"
    assert "<b>compute</b>-bound" in dom
    assert re.search(r'id="top-finding">([^<]*)<', dom).group(1).startswith("GPUs well below")
    rows = re.search(r'<table id="gpus">(.*?)</table>', dom, re.S).group(1)
    assert re.findall(r"<tr><td>([^<]+)</td>", rows)[0] == LAGGING
    divs = _metric_divs(dom)
    charts = {k for k, v in divs.items() if "<svg" in v}
    assert charts == _with_data(rep) - {"compute", "memory", "interconnect"} and len(charts) == 14
    # every chart: the metric charts, the breakdown bars, the contributions and the heatmap
    assert dom.count("<svg") == len(charts) + 3
    # pixels: the page is drawn and the heatmap PNG decoded (score 0 in warm-up = viridis purple)
    pixels, _ = browser.render(page, tmp_path, size=(1200, 2400))
    rgb = pixels.reshape(-1, 3).astype(int)
    assert np.all(np.abs(rgb - VIRIDIS_LOW) < 20, axis=1).sum() > 5000, "the heatmap did not render"
    assert len(np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2])) > 200


def test_missing_data_renders_no_data_not_a_zero_line(tmp_path):
    r = build(_missing_recording())
    assert all(v is None for v in r["series"]["metrics"]["dram_active"]["mean"])
    assert "nvlink_tx_bytes" not in r["series"]["metrics"]
    page = score_html.write(r, tmp_path / "missing.html")
    dom, console, urls = _load(page, tmp_path)
    assert console == [] and urls == []
    divs = _metric_divs(dom)
    for name in ("dram_active", "nvlink_tx_bytes", "nvlink_rx_bytes"):
        assert "<svg" not in divs[name] and "no data" in divs[name], name
    assert "<svg" in divs["pcie_tx_bytes"]
    assert "interconnect (no data)" in dom                         # contributions legend
    bars = re.search(r'<svg[^>]*class="breakdown".*?</svg>', dom, re.S).group(0)
    assert bars.count("no data") == 2                              # memory and interconnect: no bar


def test_temporal_only_shows_the_banner_and_no_score(tmp_path):
    r = build(_temporal_recording())
    page = score_html.write(r, tmp_path / "temporal.html")
    dom, console, urls = _load(page, tmp_path)
    assert console == [] and urls == []
    assert 'id="temporal-only"' in dom and "Temporal utilisation only" in dom
    assert re.search(r'id="score">([^<]*)<', dom).group(1) == "–"
    assert 'class="breakdown"' not in dom and 'data-metric="score"' not in dom
    assert dom.count("temporal utilisation only, no saturation") == 0      # the banner, not a repeat
    assert "<svg" in _metric_divs(dom)["gpu_util"]
