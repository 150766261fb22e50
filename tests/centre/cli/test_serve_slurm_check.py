"""``hpcml centre serve --slurm-check off``: the warning says what goes unchecked, reports too."""

from __future__ import annotations

from hpcml.centre.cli.serve import _verifier


def test_without_slurm_checks_the_warning_names_reports_as_well_as_summaries(capsys, tmp_path):
    v = _verifier("hpcml centre serve", "off", None, str(tmp_path / "munge.socket"))
    assert v.slurm is None
    err = capsys.readouterr().err
    assert err.startswith("hpcml centre serve: warning: no Slurm checks (--slurm-check off)")
    assert "summary or vetting report" in err and "whatever job and nodes" in err and "whatever node" in err
