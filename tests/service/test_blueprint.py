"""Blueprints: the bundled catalogue loads; a malformed one is one line naming the key, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.service import catalogue
from hpcml.service.blueprint import load, loads
from hpcml.service.placeholders import Place, expand
from hpcml.service.resolve import with_dependencies

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = (catalogue.DIRECTORY / "mlflow.yaml").read_text()


def test_the_catalogue_has_the_issue_s_services_and_each_loads():
    names = set(catalogue.available())
    assert {"mlflow", "tensorboard", "prometheus", "ollama", "open-webui"} <= names
    for path in catalogue.available().values():
        bp = load(path)
        assert bp.name == path.stem


def test_dependencies_come_first():
    assert [bp.name for bp in with_dependencies("open-webui")] == ["ollama", "open-webui"]


def test_placeholders_are_filled_for_this_machine(tmp_path):
    bp = loads(MLFLOW, "mlflow.yaml")
    ex = expand(bp, Place(host="127.0.0.1", ports={"http": 5123}, volumes={"data": str(tmp_path)}, files={}))
    assert ex.command[ex.command.index("--port") + 1] == "5123"
    assert ex.command[ex.command.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path}/mlflow.db"


@pytest.mark.parametrize("old, new, key", [
    ("kind: supporting", "kind: supporting\nimagee: x", "'imagee'"),
    ("{cpu: 1, memory: 2 GiB}", "{cpu: 1, memory: lots}", "'resources.memory'"),
    ("{cpu: 1, memory: 2 GiB}", "{cpu: 1x, memory: 2 GiB}", "'resources.cpu'"),
    ("{cpu: 1, memory: 2 GiB}", "{cpu: 1, memory: 2 GiB, gpus: 1}", "'resources.gpus'"),
    ("{name: http, port: 5000}", "{name: http, port: 5000, public: true}", "'ports[0].public'"),
    ('"${port.http}"', '"${port.web}"', "'command["),
    ("kind: supporting", "kind: supporting\n1: x", "'1'"),           # YAML reads it as an int key
    ("kind: supporting", "kind: supporting\n~: x", "'~'"),           # None
])
def test_a_malformed_blueprint_names_file_line_and_key(old, new, key):
    assert old in MLFLOW
    with pytest.raises(UsageError) as exc:
        loads(MLFLOW.replace(old, new, 1), "bad.yaml")
    assert str(exc.value).startswith("bad.yaml:") and f"key {key}" in str(exc.value)


@pytest.mark.parametrize("old, new, key", [
    ("kind: supporting", "kind: supporting\nportz: []", "portz"),
    ("{cpu: 1, memory: 2 GiB}", "{cpu: 1, memory: 2 GB of RAM}", "resources.memory"),
    ("{cpu: 1, memory: 2 GiB}", "{cpu: 1, memory: 2 GiB, gpus: 2}", "resources.gpus"),
    ("kind: supporting", "kind: supporting\n1: 2", "1"),
])
def test_the_cli_gives_one_line_and_exit_2(tmp_path, old, new, key):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MLFLOW.replace(old, new, 1))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for args in (["validate", str(bad)], ["render", str(bad), "--team", "ml"], ["up", str(bad), "--state-dir", str(tmp_path)]):
        out = subprocess.run([sys.executable, "-m", "hpcml", "service", *args], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and f"key '{key}'" in lines[0] and "Traceback" not in out.stderr, lines
        assert lines[0].startswith(f"hpcml service {args[0]}: error: {bad}:")


def test_a_top_level_key_that_is_not_a_string_is_named_with_its_line():
    """``1: x`` is an int key to YAML: one line naming the file, line and key, not a TypeError."""
    text = MLFLOW.replace("kind: supporting", "kind: supporting\ntrue: x", 1)
    line = text.splitlines().index("true: x") + 1
    with pytest.raises(UsageError) as exc:
        loads(text, "bad.yaml")
    assert (exc.value.file, exc.value.key, exc.value.line) == ("bad.yaml", "true", line)
    assert str(exc.value) == f"bad.yaml:{line}: key 'true': keys should be strings (found True)"


def test_an_unknown_blueprint_name_lists_the_known_ones():
    with pytest.raises(UsageError, match="known: .*mlflow"):
        catalogue.find("mlfow")


def test_a_site_directory_adds_blueprints(tmp_path, monkeypatch):
    (tmp_path / "mysite-mlflow.yaml").write_text(MLFLOW.replace("name: mlflow", "name: mysite-mlflow"))
    monkeypatch.setenv("HPCML_SERVICE_PATH", str(tmp_path))
    assert load(catalogue.find("mysite-mlflow")).name == "mysite-mlflow"
