"""Bad input through the real CLI (a subprocess): one line naming file/key/problem, exit 2,
nothing created or run."""

from __future__ import annotations

import json

import pytest

from tests.farm.farmtools import hpcml


@pytest.mark.parametrize("text, expect", [
    ("command: t {lr} {oops}\nproduct: {lr: [1]}\n", "key 'command': the template names parameter 'oops'"),
    ("command: echo\nproduct: {lr: [1, 2}\n", "not valid YAML"),
    ("command: echo {a}\nzip: {a: [1, 2], b: [3]}\n", "key 'zip': lists of different lengths"),
    ("- just\n- a list\n", "expected a mapping"),
    ("command: t {a}\nproduct: {a: [1], wd: [1, 2]}\n", "key 'product.wd': parameter 'wd' is not used by the command"),
])
def test_bad_sweep_is_one_line_exit_2_and_nothing_created(tmp_path, text, expect):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(text)
    p = hpcml("farm", "create", tmp_path / "f", sweep)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcml farm create: error: ") and str(sweep) in lines[0], p.stderr
    assert expect in lines[0], lines[0]
    assert not (tmp_path / "f").exists()


def test_farm_of_another_version_is_refused_and_nothing_runs(tmp_path):
    (tmp_path / "t.txt").write_text(f"touch {tmp_path}/ran\n")
    assert hpcml("farm", "create", tmp_path / "f", tmp_path / "t.txt").returncode == 0
    doc = json.loads((tmp_path / "f" / "farm.json").read_text())
    (tmp_path / "f" / "farm.json").write_text(json.dumps({**doc, "schema": "hpcml.farm/9"}))
    for cmd in (["run"], ["status"], ["results"]):
        p = hpcml("farm", *cmd, tmp_path / "f")
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("\n") == 1 and "key 'schema'" in p.stderr and "hpcml.farm/9" in p.stderr, p.stderr
    assert not (tmp_path / "ran").exists()
    assert not list((tmp_path / "f" / "claims").iterdir())


def test_bad_options_and_missing_farm(tmp_path):
    p = hpcml("farm", "run", tmp_path / "nope")
    assert p.returncode == 2 and "not a farm directory" in p.stderr and p.stderr.count("\n") == 1
    (tmp_path / "t.txt").write_text("true\n")
    hpcml("farm", "create", tmp_path / "f", tmp_path / "t.txt")
    p = hpcml("farm", "run", tmp_path / "f", "--time-limit", "soon")
    assert p.returncode == 2 and "--time-limit" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    p = hpcml("farm", "results", tmp_path / "f", "--sort", "nothing")
    assert p.returncode == 2 and "--sort" in p.stderr and "no parameter, metric or column" in p.stderr, p.stderr
    assert not list((tmp_path / "f" / "claims").iterdir())


def test_every_command_has_help_with_an_example():
    for cmd in ("create", "run", "status", "results"):
        p = hpcml("farm", cmd, "--help")
        assert p.returncode == 0 and f"hpcml farm {cmd} " in p.stdout, p.stdout


def test_a_rejected_create_leaves_nothing_and_the_corrected_one_works(tmp_path):
    bad, good, farm = tmp_path / "bad.yaml", tmp_path / "good.yaml", tmp_path / "f"
    bad.write_text("tasks:\n  - {group: train, command: echo a}\n  - {group: eval, after: [trian], command: echo b}\n")
    good.write_text("tasks:\n  - {group: train, command: echo a}\n  - {group: eval, after: [train], command: echo b}\n")
    p = hpcml("farm", "create", farm, bad)
    assert p.returncode == 2 and "group 'trian'" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not farm.exists()
    p = hpcml("farm", "create", farm, good)
    assert p.returncode == 0, p.stderr
    assert "2 tasks added" in p.stdout
