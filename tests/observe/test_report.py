"""The job report on synthetic job directories with known ground truth (hpcml.observe.synthetic).

The HTML test renders the report in headless Chromium (Debian's ``chromium``; installed
here when missing and root) and decodes the screenshot with zlib to check it is not blank.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from hpcml.observe.report import build
from hpcml.observe.store import read_job
from hpcml.observe.synthetic import make_job

SLOW, STALL_STEP, STALL_S, HICCUP, MISSING, CUT = 5, 250, 5.0, (9, 100), 7, 12


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory) -> Path:
    return make_job(tmp_path_factory.mktemp("job") / "obs", 64, 500, slow_ranks={SLOW: 1.4},
                    stalls=[(STALL_STEP, STALL_S)], hiccups={HICCUP: 8.0}, missing=[MISSING],
                    truncated=[CUT])


@pytest.fixture(scope="module")
def rep(job_dir):
    return build(read_job(job_dir))


@pytest.fixture(scope="module")
def clean_rep(tmp_path_factory):
    return build(read_job(make_job(tmp_path_factory.mktemp("clean") / "obs", 32, 300, seed=3)))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", *args],
                          check=False, capture_output=True, text=True, timeout=120)


def test_slow_rank_is_a_chronic_straggler_with_its_node(rep, clean_rep):
    assert [s["rank"] for s in rep.stragglers] == [SLOW]
    s = rep.stragglers[0]
    assert s["node"] == "n2" and s["gpus"] == ["1"] and s["confidence"] > 0.9
    f = next(f for f in rep.findings if f.kind == "chronic_straggler")
    assert "rank 5" in f.message and "n2" in f.message and "--exclude=n2" in f.advice
    assert clean_rep.stragglers == [] and not any(f.kind == "chronic_straggler" for f in clean_rep.findings)


def test_job_wide_stall_is_found_where_it_was_injected(rep, job_dir, clean_rep):
    job = read_job(job_dir)
    tab = job.table
    ts = tab["ts"].cast("int64").to_numpy() / 1e6
    t0 = ts.min()
    is_step = (tab["name"].to_numpy(zero_copy_only=False) == "step") & (tab["rank"].to_numpy() == 0)
    steps = tab["step"].to_numpy(zero_copy_only=False)
    before = ts[is_step & (steps == STALL_STEP - 1)][0] - t0      # the stall is the next step
    after = ts[is_step & (steps == STALL_STEP)][0] - t0
    hits = [s for s in rep.stalls if s["start_s"] < after and s["end_s"] > before]
    assert len(hits) == 1 and hits[0]["ratio"] < 0.5
    assert abs(hits[0]["duration_s"] - STALL_S) < 2.5
    assert any(f.kind == "job_stall" for f in rep.findings)
    assert clean_rep.stalls == []


def test_one_off_hiccup_is_not_chronic(rep):
    rank, step = HICCUP
    assert any(o["rank"] == rank and o["step"] == step and o["ratio"] > 5 for o in rep.one_off_stalls)
    assert rank not in [s["rank"] for s in rep.stragglers]


def test_missing_and_damaged_ranks_are_reported_and_skipped(rep):
    assert rep.missing_ranks == [MISSING]
    assert list(rep.damaged_ranks) == [CUT] and "truncated" in rep.damaged_ranks[CUT]
    assert rep.ranks_with_data == 63 and rep.ranks_expected == 64
    f = next(f for f in rep.findings if f.kind == "missing_rank")
    assert f"rank {MISSING} " in f.message and "killed" in f.advice
    assert len(rep.findings) <= 5 and all(f.advice for f in rep.findings)


def test_throughput_uses_the_logged_metric_else_step_rate(rep, tmp_path):
    assert rep.throughput["name"] == "tokens_per_s"
    assert 40_000 < rep.throughput["median"] < 60_000           # 8192 tokens / ~0.16 s
    plain = build(read_job(make_job(tmp_path / "plain", 8, 200, throughput_metric=None)))
    assert plain.throughput["source"] == "section" and plain.throughput["unit"] == "steps/s per rank"
    assert 4 < plain.throughput["median"] < 12                  # ~0.12 s per step


def test_dataload_bound_job_gets_its_advice(tmp_path):
    r = build(read_job(make_job(tmp_path / "dl", 8, 200, dataload_share=0.6)))
    f = next(f for f in r.findings if f.kind == "data_bound")
    assert "60%" in f.message and "hpcml data" in f.advice
    r = build(read_job(make_job(tmp_path / "ok", 8, 200, dataload_share=0.1)))
    assert not any(f.kind == "data_bound" for f in r.findings)


def test_plots_are_downsampled(job_dir):
    r = build(read_job(job_dir), max_buckets=40, max_rows=16)
    hm = r.plots["heatmap"]
    assert hm["values"].shape == (16, 40) and hm["group"] == 4 and hm["labels"][0] == "0-3"
    assert np.nanmax(hm["values"][SLOW // 4]) > 1.2 * np.nanmedian(hm["values"])   # the slow group shows
    assert all(len(s["median"]) == 40 for s in r.plots["series"])
    assert {g["name"] for g in r.plots["gpu"]} >= {"util_gpu_percent", "power_w"}
    assert {g["name"] for g in r.plots["host"]} >= {"cpu_percent", "mem_used_bytes"}
    full = build(read_job(job_dir))
    assert full.plots["heatmap"]["values"].shape == (63, 100)    # 500 steps / 5, 63 ranks with data


def test_json_output_has_stable_keys_and_html_is_written(job_dir, tmp_path):
    out = tmp_path / "r.html"
    p = _cli(str(job_dir), "--json", "--html", str(out))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert list(d) == ["job_id", "path", "ranks_expected", "ranks_with_data", "nodes", "start", "end",
                       "duration_s", "rows", "throughput", "stalls", "stragglers", "one_off_stalls",
                       "transient_stragglers", "sections", "missing_ranks", "damaged_ranks",
                       "failed_ranks", "recorder_problems", "findings"]
    assert d["job_id"] == "synthetic" and d["missing_ranks"] == [MISSING] and str(CUT) in d["damaged_ranks"]
    assert all(set(f) == {"kind", "message", "advice"} for f in d["findings"])
    assert {"rank", "node", "gpus", "score", "confidence"} <= set(d["stragglers"][0])
    assert {"start_s", "end_s", "duration_s", "ratio"} <= set(d["stalls"][0])
    assert out.stat().st_size > 10_000


def test_terminal_summary_and_default_html_path(job_dir):
    p = _cli(str(job_dir))
    assert p.returncode == 0, p.stderr
    assert "Job synthetic" in p.stdout and "rank 5 on n2" in p.stdout and "stall" in p.stdout
    assert f"missing ranks: [{MISSING}]" in p.stdout
    assert (job_dir / "report.html").exists()


def test_not_a_job_directory_is_a_one_line_error(tmp_path):
    p = _cli(str(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "not a job directory" in p.stderr


def test_html_is_self_contained(rep):
    from hpcml.observe.html import render
    page = render(rep)
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert "https://" not in page and "src=" not in page
    assert page.replace("http://www.w3.org/2000/svg", "").count("http://") == 0
    assert page.count("<svg") >= 6 and "data:image/png;base64," in page


# ------------------------------------------------------------------ headless Chromium

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "chromium"],
                       check=False, capture_output=True, timeout=900, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        return shutil.which("chromium")
    return None


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def decode_png(data: bytes) -> np.ndarray:
    """(h, w, channels) uint8 of an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
        elif kind == b"IDAT":
            idat += body
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, w * bpp + 1)
    out = np.zeros((h, w * bpp), np.uint8)
    prev = np.zeros(w * bpp, np.uint8)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:
            cur = (np.cumsum(line.reshape(w, bpp).astype(np.int64), axis=0) % 256).astype(np.uint8).ravel()
        elif f == 2:
            cur = line + prev
        else:
            cur = bytearray(line.tobytes())
            up = prev.tobytes()
            for i in range(len(cur)):
                a = cur[i - bpp] if i >= bpp else 0
                c = up[i - bpp] if i >= bpp else 0
                cur[i] = (cur[i] + ((a + up[i]) >> 1 if f == 3 else _paeth(a, up[i], c))) & 255
            cur = np.frombuffer(bytes(cur), np.uint8)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)


def test_html_renders_in_headless_chromium(job_dir, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed and cannot be installed here (not root / no apt)")
    page = tmp_path / "report.html"
    assert _cli(str(job_dir), "--html", str(page)).returncode == 0
    shot = tmp_path / "shot.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
           page.as_uri()]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert shot.exists(), p.stderr[-2000:]
    img = decode_png(shot.read_bytes())
    assert img.shape[:2] == (2000, 1200)
    rgb = img[..., :3].reshape(-1, 3).astype(np.int64)
    colours = np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2])
    assert len(colours) > 200, f"only {len(colours)} colours: the page looks blank"
    white = np.all(rgb > 245, axis=1).mean()
    assert white < 0.97, f"{white:.0%} of the screenshot is white"
    # the heatmap (an inline PNG in SVG) is drawn: viridis' dark purple appears
    purple = np.all(np.abs(rgb - [68, 1, 84]) < 25, axis=1).sum()
    assert purple > 1000, "the step-time heatmap did not render"
    # a DOM dump shows the findings were laid out (no JS: the page is static)
    dom = subprocess.run(cmd[:-3] + ["--dump-dom", page.as_uri()], check=False, capture_output=True,
                         text=True, timeout=120)
    assert "id=\"hpcml-report\"" in dom.stdout and "rank 5 on n2" in dom.stdout
