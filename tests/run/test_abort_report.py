"""A run that vetting aborted (``hpcml run --vet`` with a protocol no node passes): every
section of its report says the command never started; none says it ran or shows None."""

from __future__ import annotations

import re

from tests.farm.farmtools import hpcml


def test_each_section_of_an_aborted_runs_report_says_what_happened(tmp_path):
    (tmp_path / "p.yaml").write_text("name: impossible\nevals:\n  - {name: mem, type: memory, "
                                     "min_available_fraction: 100%}\n")
    p = hpcml("run", "--vet", "p.yaml", "--dir", "job", "--", "touch", tmp_path / "started", cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    assert not (tmp_path / "started").exists()
    text = hpcml("report", "job", cwd=tmp_path).stdout
    assert "ran without" not in text and "None" not in text and "not started (vetting aborted the run)" in text, text
    assert "vetting found 1 bad node: " in text and "the command never started" in text, text
    html = (tmp_path / "job" / "report.html").read_text()
    job = re.sub(r"<[^>]+>", "|", html.split("id='run-job'>", 1)[1].split("</section>", 1)[0])
    assert "None" not in job and "|tasks||– (the command never started)|" in job, job
    assert "ran without" not in html and "1 nodes" not in html and "node(s)" not in html
