"""Sweep values in a shell command template: inert, and the exact bytes (run by /bin/sh)."""

from __future__ import annotations

import subprocess

import pytest

from hpcml.farm.template import TemplateError, fill

VALUES = ["b; touch {m}", "a'b", 'a"b', "$(touch {m})", "`touch {m}`", "x\ny", "a  b", "*", "\\", "-n", "", "'",
          "\"'$`\\", "$HOME", "{m} && touch {m}"]
# where the placeholder stands -> what the word holds around the value
PLACES = {"{x}": "{}", "'{x}'": "{}", '"{x}"': "{}", "pre_{x}_post": "pre_{}_post", '"a {x} b"': "a {} b",
          "'a '{x}": "a {}", '"$(printf %s "{x}")"': "{}", "$(printf %s {x})": "{}"}


def test_every_value_is_one_inert_word_with_its_bytes_wherever_the_placeholder_stands(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "glob-me").write_text("")
    for place, word in PLACES.items():
        for v in (v.replace("{m}", str(marker)) for v in VALUES):
            if place.startswith("$(") and (v.strip() != v or not v or " " in v or "*" in v or "\n" in v):
                continue        # an unquoted $(...) splits and globs its output: the shell's, not the value's
            cmd = fill(f"printf '%s\\0' {place}", {"x": v})
            out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, cwd=tmp_path, timeout=30)
            got = out.stdout.decode().split("\0")[:-1]
            want = word.format(v.rstrip("\n") if "$(" in place else v)
            assert got == [want], (place, v, cmd, out.stderr)
    assert not marker.exists()


def test_format_spec_and_raw_parameters():
    assert fill("t --d {d:.2f} --n {n}", {"d": 0.123, "n": "a b"}) == "t --d 0.12 --n 'a b'"
    assert fill("t {args} --n {n}", {"args": "--x 1 --y 2", "n": "a b"}, raw={"args"}) == "t --x 1 --y 2 --n 'a b'"


@pytest.mark.parametrize("template, problem", [
    ("echo `echo {x}`", "inside backquotes"),
    ("echo \\{x}", "follows a backslash"),
])
def test_places_no_quoting_protects_are_refused(template, problem):
    with pytest.raises(TemplateError, match=problem):
        fill(template, {"x": "v"})
