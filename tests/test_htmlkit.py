"""Shared report helpers (hpcml.htmlkit), and every HTML report's escaping: a hostile node
name, command or label goes through the real builders and comes out as text, escaped once."""

from __future__ import annotations

import html
import json
from fnmatch import fnmatch
from html.parser import HTMLParser
from pathlib import Path

import jinja2
import numpy as np
import pytest
from markupsafe import escape

from hpcml import htmlkit
from hpcml.centre import report as centre
from hpcml.files import load_toml
from hpcml.htmlkit import _path, bridge_gaps
from hpcml.observe import html as observe_html
from hpcml.observe.report import Limits, Report
from hpcml.observe.report import build as observe_build
from hpcml.observe.store import read_job
from hpcml.run import report as run_report
from hpcml.score import html as score_html
from hpcml.score.recording import Recording
from hpcml.score.report import build as score_build
from hpcml.testing.synthetic_job import make_job
from tests.score import synth

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'
QUOTE = "'><svg onload=alert(3)>"


def test_sparse_samples_are_bridged_and_real_gaps_kept():
    nan = np.nan
    y = np.array([nan, 1, nan, nan, nan, 2, nan, nan, nan, 3] + [nan] * 12 + [5, nan])
    out = bridge_gaps(y)
    assert np.allclose(out[1:10], [1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75, 3])
    assert np.isnan(out[0]) and np.isnan(out[10:22]).all() and out[22] == 5 and np.isnan(out[23])
    assert "L" not in _path(np.arange(len(y)), y)           # the old drawing: moves only
    assert "L" in _path(np.arange(len(y)), out)


def test_the_environment_escapes_and_is_strict():
    env = htmlkit.environment()
    assert env.autoescape is True and env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):              # a misspelt name fails, not an empty cell
        htmlkit.render("centre.html.j2", since="today")


# ------------------------------------------------------------------ hostile values, escaped once

class _Parsed(HTMLParser):
    """What a browser's parser makes of a page: its elements, attribute names and text."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.text: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs |= {name for name, _ in attrs}

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def assert_escaped_once(page: str, shown: list[str]) -> None:
    """Each value of ``shown`` is on the page as its literal text: escaped (no element or
    handler made of it), and only once (no ``&lt;`` left visible)."""
    parsed = _Parsed(page)
    text = "".join(parsed.text)
    assert not parsed.tags & {"script", "img"}, parsed.tags
    assert not {a for a in parsed.attrs if a.startswith("on")}, parsed.attrs
    for value in shown:
        assert value not in page, value
        assert str(escape(value)) in page, value
        assert value in text, value                          # the reader sees what the data said
    assert "&lt;" not in text and "&gt;" not in text and "&#" not in text, "escaped twice"


def test_the_check_catches_raw_and_double_escaped_values():
    with pytest.raises(AssertionError):
        assert_escaped_once(f"<p>{SCRIPT}</p>", [SCRIPT])
    with pytest.raises(AssertionError):
        assert_escaped_once(f"<p>{html.escape(str(escape(SCRIPT)))}</p>", [SCRIPT])
    assert_escaped_once(f"<p>{escape(SCRIPT)}</p>", [SCRIPT])


@pytest.fixture(scope="module")
def hostile_observe(tmp_path_factory) -> Report:
    """A job whose second node is named ``SCRIPT`` (its rank 5 a straggler), whose ID is ``IMG``
    and whose throughput metric is named ``QUOTE``."""
    d = make_job(tmp_path_factory.mktemp("hostile") / "obs", 8, 200, slow_ranks={5: 1.5}, job_id=IMG,
                 throughput_metric=QUOTE, seed=1)
    for meta in d.glob("*.json"):
        doc = json.loads(meta.read_text())
        if doc.get("node") == "n2":
            doc["node"] = SCRIPT
        if "nodes" in doc:
            doc["nodes"] = [SCRIPT if n == "n2" else n for n in doc["nodes"]]
        meta.write_text(json.dumps(doc))
    rep = observe_build(read_job(d), limits=Limits(min_straggler_s=10))
    assert rep.stragglers and rep.stragglers[0]["node"] == SCRIPT
    return rep


@pytest.fixture(scope="module")
def hostile_score() -> dict:
    """synth's recording with its second node named ``SCRIPT``, its GPUs' model ``IMG`` and a
    metadata field ``QUOTE``."""
    rec = synth.recording()
    out = Recording(source=IMG, meta={"job_id": SCRIPT, "label": QUOTE})
    for (node, index), g in rec.gpus.items():
        out.gpu(SCRIPT if node == "nid00001" else node, index, IMG).set_columns(g.t, g.values)
    return score_build(out)


def test_observe_report_escapes_node_job_and_metric_names_once(hostile_observe):
    page = observe_html.render(hostile_observe)
    assert_escaped_once(page, [SCRIPT, IMG, QUOTE])
    assert page.count("<svg") >= 6                           # the charts are markup, not text


def test_score_report_escapes_node_model_and_labels_once(hostile_score):
    page = score_html.render(hostile_score)
    assert_escaped_once(page, [SCRIPT, IMG, QUOTE])
    assert "<svg" in page and "<code>" in page


def _run_report(obs: Report, score: dict) -> dict:
    """``run.report.build``'s dict for a job whose command, node, stderr and findings are hostile."""
    return {
        "path": "/scratch/job", "schema": run_report.SCHEMA,
        "job": {"command": ["python", SCRIPT], "mode": "slurm", "job_id": IMG, "ntasks": 8, "nodes": ["n1", SCRIPT],
                "master": "n1:29500", "launch": ["srun", QUOTE], "duration_s": 12.5, "attempt": 1, "started": 1000.0},
        "ending": {"exit_code": 1, "aborted": False, "requeued": None,
                   "first_failure": {"rank": 5, "node": SCRIPT, "exit_code": 1, "failed_ranks": 1,
                                     "stderr_tail": [f"ValueError: {IMG}"]}},
        "findings": [{"source": "run", "kind": "failed_rank", "message": f"rank 5 on {SCRIPT} failed", "advice": QUOTE}],
        "vet": {"protocol": QUOTE, "decision": "continue", "good": ["n1"], "bad": [SCRIPT], "duration_s": 4.0},
        "excluded": {SCRIPT: [IMG]}, "env": {"edf": SCRIPT},
        "attempts": [{"attempt": 0, "requeued": {"by": "slurm", "restart_count": 1}, "exit_code": 0,
                      "requeue_gap_s": 30.0, "observe_missing": IMG, "restart": None, "nodes": [SCRIPT]}],
        "recovery": None, "mlflow": {"line": IMG, "dropped": 0},
        "watch": {"timeline": [{"kind": "hang", "what": SCRIPT, "began": 1001.0, "detected": 1003.0}],
                  "hang": {"action": "report", "timeout": 2.0,
                           "verdict": {"culprits": [{"rank": 5, "node": SCRIPT, "where": QUOTE, "why": IMG}]}},
                  "stragglers": []},
        "observe_missing": None, "score_missing": None,
        "_parts": {"observe": obs, "score": score, "attempts": [None]},
    }


def test_run_report_escapes_command_node_stderr_and_embedded_parts_once(hostile_observe, hostile_score, tmp_path):
    rep = _run_report(hostile_observe, hostile_score)
    page = run_report.write(rep, tmp_path / "report.html").read_text()
    assert_escaped_once(page, [SCRIPT, IMG, QUOTE])
    assert "class='hpcml-observe'" in page and "class='hpcml-score'" in page and "<h2>Chronic" not in page
    # the embedded parts escape what they escape on their own pages, and nothing twice
    assert page.count(str(escape(SCRIPT))) > observe_html.render(hostile_observe).count(str(escape(SCRIPT)))


def test_centre_report_escapes_node_user_and_check_once():
    rep = {"since": 1_750_000_000.0, "window_s": 30 * 86400.0,
           "totals": {"jobs": 2, "gpu_hours": 10.0, "node_hours": 2.5, "gpu_hours_lost": 0.0, "time_lost_s": 0.0,
                      "failed": 0, "hung": 0, "unverified": 0},
           "nodes": [{"node": SCRIPT, "jobs": 2, "straggler": 2, "culprit": 0, "crashed": 0, "lost": 0, "excluded": 0,
                      "last": 1_750_000_000.0, "vet": {"reports": 1, "bad": 1,
                                                       "failing_checks": [{"check": QUOTE, "count": 1}]}}],
           "owners": [{"user": IMG, "account": SCRIPT, "jobs": 2, "gpu_hours": 10.0, "mean_score": 0.5,
                       "idle_gpu_hours": 5.0, "lowest": [{"job": QUOTE, "score": 0.5, "bound": "memory"}]}],
           "accounts": [{"account": SCRIPT, "jobs": 2, "gpu_hours": 10.0, "gpu_hours_lost": 0.0, "time_lost_s": 0.0}]}
    assert_escaped_once(centre.render_html(rep), [SCRIPT, IMG, QUOTE])


def test_templates_are_package_data():
    """pyproject's package-data names every template, so an installed wheel has them."""
    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    patterns = load_toml(pyproject.read_text(), str(pyproject))["tool"]["setuptools"]["package-data"]["hpcml"]
    names = [f"templates/{p.name}" for p in htmlkit.TEMPLATES.iterdir()]
    assert names and all(any(fnmatch(n, pat) for pat in patterns) for n in names), (names, patterns)


def _outside(chart: dict) -> list[str]:
    """Data marks outside the plot area or beyond the labelled gridlines: an axis that does
    not contain its data."""
    px, py, pw, ph = chart["plot"]
    top, bottom = min(chart["grid"]), max(chart["grid"])
    bad = []
    for x, y, w, h in chart["marks"]:
        if x < px - 0.5 or x + w > px + pw + 0.5 or y < py - 0.5 or y + h > py + ph + 0.5:
            bad.append(f"{chart['title']}: mark {x, y, w, h} leaves the plot {px, py, pw, ph}")
        elif y < top - 0.5 or y + h > bottom + 0.5:
            bad.append(f"{chart['title']}: mark spans y {y:.1f}-{y + h:.1f}, gridlines only {top:.1f}-{bottom:.1f}")
    return bad


def test_chart_axes_contain_their_data_in_chromium(tmp_path):
    """Rendered by Chromium, every line and band of a chart lies inside its plot area and
    between its lowest and highest labelled gridline: spikes, negative values, a constant
    series, values near 1e15, a lone point between gaps, and a real observe report's page
    (a straggler, a stall, a hang at the end) with its throughput and series charts."""
    from tests.observe.browser import chart_boxes
    nan = np.nan
    t = np.arange(60) * 0.5
    cases = {"spike": np.r_[np.ones(59), 1e6], "negative": np.linspace(-5, 3, 60), "constant": np.full(60, 4906.5),
             "huge": np.linspace(1e15, 1.0000001e15, 60), "lone": np.r_[[nan] * 30, [3.0], [nan] * 29],
             "odd": np.linspace(0.013, 4907.3, 60), "ratio": np.linspace(0.2, 1.3, 60)}
    charts = [htmlkit.line_chart(t, title=k, lines=[(k, y, "#000")], ylim=(0, 1) if k == "ratio" else None,
                                 bands=[(y * 0.9, y * 1.1, "#00f")] if k == "odd" else ())
              for k, y in cases.items()]
    page = tmp_path / "charts.html"
    page.write_text("<!doctype html><html><body>" + "".join(map(str, charts)) + "</body></html>")
    got = chart_boxes(page, tmp_path)
    assert [c["title"] for c in got] == list(cases)
    assert all(c["marks"] for c in got)
    assert [b for c in got for b in _outside(c)] == []
    job = make_job(tmp_path / "obs", 8, 300, slow_ranks={3: 1.5}, stalls=[(150, 6.0)], seed=5)
    real = tmp_path / "report.html"
    observe_html.write(observe_build(read_job(job), limits=Limits(min_straggler_s=10)), real)
    got = chart_boxes(real, tmp_path)
    assert any(c["title"] == "Throughput" for c in got), [c["title"] for c in got]
    assert [b for c in got for b in _outside(c)] == []


_LABELS = """<script>
window.addEventListener('load', () => {
  const out = [...document.querySelectorAll('svg')].map(svg => ({
    title: (svg.querySelector('title') || {}).textContent || '',
    x: [...svg.querySelectorAll("text[text-anchor='middle']")].map(t => { const b = t.getBBox(); return [t.textContent, b.x, b.width]; }),
    y: [...svg.querySelectorAll("text[text-anchor='end']")].map(t => t.textContent)}));
  const pre = document.createElement('pre'); pre.id = 'labels'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def test_axis_labels_read_right_at_every_length_in_chromium(tmp_path):
    """Issue 70: a 5 s job's time axis read 0:00 0:00 0:01 0:02 0:02 and its throughput axis
    11.5k six times. Laid out by Chromium, every chart's labels on each axis differ and the
    time labels do not overlap: 5 s, 90 s, 2 h and 5 days; values that vary in the fourth
    digit, and a heatmap's colour bar."""
    import html
    import json
    import re
    import subprocess

    from tests.observe.browser import FLAGS, chromium
    charts = []
    for seconds in (5.0, 90.0, 7200.0, 5 * 86400.0):
        t = np.linspace(0, seconds, 200)
        charts.append(htmlkit.line_chart(t, title=f"{seconds:g} s", lines=[("tput", 11_500 + 20 * np.sin(t), "#000")]))
    hm = {"values": np.random.default_rng(0).uniform(11_500, 11_520, (4, 50)), "labels": ["a", "b", "c", "d"]}
    charts.append(htmlkit.heatmap(hm, 5.0, title="heat", unit="ms"))
    page = tmp_path / "labels.html"
    page.write_text("<!doctype html><html><body>" + "".join(map(str, charts)) + _LABELS + "</body></html>")
    dom = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="labels">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    got = [c for c in json.loads(html.unescape(found.group(1))) if c["x"] or c["y"]]
    assert len(got) >= 4
    for chart in got:
        xs = [text for text, _, _ in chart["x"]]
        assert len(xs) >= 3 and len(set(xs)) == len(xs), (chart["title"], xs)
        for (_, a, wa), (_, b, _) in zip(chart["x"], chart["x"][1:]):
            assert a + wa < b, (chart["title"], chart["x"])          # no two time labels overlap
        ys = [y for y in chart["y"] if y]
        assert len(set(ys)) == len(ys), (chart["title"], ys)


def test_no_page_shows_a_control_character_or_a_direction_override_as_it_is():
    """Node names and GPU ids come from files anyone could write: an ESC in one ran in the
    terminal of whoever printed the HTML file, and U+202E showed a cell's text reversed."""
    from hpcml.htmlkit import environment
    page = environment().from_string("<td>{{ node }}</td><pre>{{ log }}</pre>").render(
        node="nid\x1b[31mRED\x07\u202eevil\r", log="line 1\n\tline 2")
    assert not any(c in page for c in "\x1b\x07\u202e\r"), repr(page)
    assert "nid\\u001b[31mRED\\u0007\\u202eevil\\u000d" in page
    assert "line 1\n\tline 2" in page                        # a log's lines and tabs stay
