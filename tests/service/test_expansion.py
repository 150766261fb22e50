"""A blueprint small on disk that asks for GBs once expanded is refused in one line naming
the file, before any Python object is built: YAML aliases (nested: billion laughs; wide:
thousands of aliases of one long string) and ``${options.NAME}`` placeholders (an option
used many times, options of options). Issue 52: 186 KB of YAML, under both old caps, came
to 1.35 GB and ``hpcml service render`` ran for more than 300 s."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.files import YAML_ALIAS_NODES_MAX, YAML_ALIAS_TEXT_MAX, load_yaml
from hpcml.service.blueprint import EXPANDED_MAX, load, loads
from hpcml.service.placeholders import Place, expand

ROOT = Path(__file__).resolve().parents[2]

HEAD = """name: web
description: a web server
image: busybox
ports: [{name: http, port: 8000}]
health: {port: http}
"""


def _wide(copies: int, length: int = 150_000) -> str:
    """Issue 52's file: one long string anchored once, then ``copies`` aliases of it."""
    return (HEAD + f"options: {{big: &big '{'x' * length}'}}\ncommand:\n  - echo\n"
            + "".join("  - *big\n" for _ in range(copies)))


def _refused(text: str, match: str, name: str = "bp.yaml") -> str:
    start = time.monotonic()
    with pytest.raises(UsageError, match=match) as exc:
        loads(text, name)
    assert time.monotonic() - start < 5
    line = str(exc.value)
    assert line.startswith(f"{name}:") and "\n" not in line, line
    return line


def test_the_wide_bomb_of_issue_52_is_refused_at_the_alias_that_crosses_the_bound():
    text = _wide(9000)
    assert len(text) < 256 << 10 and 9000 < YAML_ALIAS_NODES_MAX      # under both old caps
    line = _refused(text, f"aliases expand to more than {YAML_ALIAS_TEXT_MAX >> 20} MiB of text")
    crossing = YAML_ALIAS_TEXT_MAX // 150_000 + 1                       # the first alias past the bound
    assert line.startswith(f"bp.yaml:{HEAD.count(chr(10)) + 3 + crossing}:"), line
    assert "*big alone is 146 KiB" in line


def test_the_wide_bomb_is_refused_by_render_in_seconds(tmp_path):
    """The issue's command: exit 2, one line naming the file, nothing written (it ran > 300 s)."""
    path = tmp_path / "wide.yaml"
    path.write_text(_wide(9000))
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "hpcml", "service", "render", str(path), "--team", "t", "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}:" in lines[0] and "aliases expand to more than" in lines[0], lines
    assert time.monotonic() - start < 60 and not (tmp_path / "out").exists()


def test_billion_laughs_is_refused_by_nodes_and_by_text():
    # the classic: 9 levels of 10 aliases of the level below (10^8 nodes)
    laughs = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
    _refused(HEAD + "command: [echo]\n" + laughs, "aliases expand to more than 10000 nodes")
    # nested with long strings: 1,220 nodes (under the node bound), 3.3 MB of text
    long = "a0: &a0 " + "y" * 3000 + "\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 4))
    _refused(HEAD + "command: [echo]\n" + long, "aliases expand to more than 2 MiB of text")


def test_the_bound_is_on_what_each_alias_names_computed_once_per_anchor():
    """Linear in the document: a deep chain of anchors, each naming the one before twice,
    is measured in milliseconds (its expansion, 2^40 copies, never built)."""
    chain = "a0: &a0 z\n" + "".join(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, 40))
    start = time.monotonic()
    with pytest.raises(UsageError, match="aliases expand to more than"):
        load_yaml(chain, "c.yaml")
    assert time.monotonic() - start < 2


def test_a_blueprint_with_some_aliases_still_loads(tmp_path):
    path = tmp_path / "bp.yaml"
    path.write_text(HEAD + """options:
  cmd: &cmd "exec python -m http.server ${port.http} --bind ${host}"
command: [sh, -c, *cmd]
env: &env {A: "1", B: "${host}"}
files:
  - {name: a, mount: /a, content: &conf {"site.conf": "port ${port.http}"}}
  - {name: b, mount: /b, content: {<<: *conf, "more.conf": "x"}}
  - {name: c, mount: /c, content: *env}
""")
    bp = load(path)
    assert bp.command == ["sh", "-c", bp.options["cmd"]] and "http.server" in bp.options["cmd"]
    assert bp.files[1].content == {"site.conf": "port ${port.http}", "more.conf": "x"}
    assert bp.files[2].content == bp.env == {"A": "1", "B": "${host}"}
    # and a large but reasonable reuse: 12 aliases of 150 KB (1.7 MB), under both bounds
    assert len(loads(_wide(12), "bp.yaml").command) == 13


def test_an_option_used_many_times_cannot_make_gbs():
    """No alias at all: one 100 KB option and 6,000 strings that use it (600 MB once filled)."""
    text = (HEAD + f"options: {{b: '{'x' * 100_000}'}}\ncommand:\n"
            + "".join("  - ${options.b}\n" for _ in range(6000)))
    assert len(text) < 256 << 10
    line = _refused(text, f"more than {EXPANDED_MAX >> 20} MiB")
    assert "key 'command[" in line and "${options.b} is 98 KiB" in line


def test_options_of_options_cannot_make_gbs():
    """The placeholder billion laughs: each option uses the one above it ten times."""
    levels = ["  o0: xxxxxxxxxx\n"] + [f"  o{i}: '{('${options.o' + str(i - 1) + '}') * 10}'\n" for i in range(1, 10)]
    text = HEAD + "command: ['${options.o9}']\noptions:\n" + "".join(levels)
    _refused(text, "more than 4 MiB")
    # three levels (10,000 characters) are fine, and are what expand() gives
    small = HEAD + "command: ['${options.o3}']\noptions:\n" + "".join(levels[:4])
    ex = expand(loads(small, "bp.yaml"), Place(host="h", ports={"http": 1}, volumes={}, files={}))
    assert ex.command == ["x" * 10_000]


@pytest.mark.parametrize("options", [
    "{a: '${options.b}', b: x}",      # an option below (was: a KeyError traceback in expand)
    "{a: 'x${options.a}'}",           # itself
])
def test_an_option_uses_only_the_options_above_it(options):
    line = _refused(HEAD + f"command: ['${{options.a}}']\noptions: {options}\n", "only the options above it")
    assert "key 'options.a'" in line


@pytest.mark.parametrize("value, problem", [
    ("${options.b}", "only the options above it"),
    ("${port.nosuch}", "no port called 'nosuch'"),
    ("x" * (EXPANDED_MAX // 10), "more than 4 MiB"),
])
def test_a_set_value_is_checked_like_the_blueprint(value, problem):
    bp = loads(HEAD + "command: ['${options.a}', '${options.a}', '${options.a}', '${options.a}', '${options.a}', "
                      "'${options.a}', '${options.a}', '${options.a}', '${options.a}', '${options.a}', "
                      "'${options.a}']\noptions: {a: x, b: y}\n", "bp.yaml")
    with pytest.raises(UsageError, match=problem) as exc:
        bp.with_options({"a": value})
    assert "\n" not in str(exc.value) and exc.value.key == "set"
    assert bp.with_options({"a": "${port.http}"}).options["a"] == "${port.http}"


def test_every_yaml_reader_of_service_goes_through_the_bounded_loader():
    """Nothing under src/hpcml/service parses YAML but through hpcml.files (dumping is fine)."""
    allowed = {"safe_dump", "safe_dump_all", "dump", "dump_all"}
    found = []
    for path in sorted((ROOT / "src" / "hpcml" / "service").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "yaml" and node.attr not in allowed:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: yaml.{node.attr}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if any(n and (n.startswith("ruamel") or n.startswith("omegaconf")) for n in names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {names}")
                if isinstance(node, ast.ImportFrom) and node.module == "yaml":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from yaml import ...")
    assert found == []
