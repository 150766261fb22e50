"""``hpcml service validate`` refuses what ``up`` and ``render`` refuse (issue 63): one set
of checks, run by every command that takes a blueprint, each problem one line naming the
blueprint's file and key, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcml.errors import HpcmlError, UsageError
from hpcml.service import argocd, catalogue, k8s, render
from hpcml.service.blueprint import load
from hpcml.service.checks import check
from hpcml.service.cli import app as service_app
from hpcml.service.resolve import with_dependencies
from tests import needs

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = (catalogue.DIRECTORY / "prometheus.yaml").read_text()


def _validate_cli(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", "service", "validate", str(path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


@pytest.mark.parametrize("key", ["../../etc/passwd", "/etc/passwd", "a/b", ".."])
def test_validate_refuses_a_file_key_that_leaves_its_directory(tmp_path, key):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PROMETHEUS.replace("prometheus.yml: |", f"{json.dumps(key)}: |", 1))
    out = _validate_cli(bad)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1 and "Traceback" not in out.stderr, out
    assert lines[0].startswith(f"hpcml service validate: error: {bad}: key 'files[0].content': ")
    assert lines[0].endswith(f"found {key!r}") and "not a ConfigMap/Secret key" in lines[0]


#: blueprints that ``render``'s own manifest checks refuse, each by another rule: (edits of
#: prometheus.yaml, the key the one line names, or None where only the rendered objects show it)
HOSTILE = {
    "file key leaves its directory": ([("prometheus.yml: |", "../../etc/passwd: |")], "files[0].content"),
    "absolute file key": ([("prometheus.yml: |", "/etc/passwd: |")], "files[0].content"),
    "image with a newline": ([("image: docker.io/prom/prometheus:v2.53.0",
                               'image: "docker.io/prom/prometheus:v2.53.0\\nX"')], "image"),
    "env name with a newline": ([("options:", 'env: {"A\\nB": "1"}\noptions:')], "env.A\\nB"),
    "volume mount climbs out": ([("mount: /prometheus,", "mount: /cfg/../..,")], "volumes[0].mount"),
    "files mount climbs out": ([("mount: /etc/hpcml-prometheus", "mount: /etc/../../x")], "files[0].mount"),
    "secret key is a path": ([("options:", "secrets: [{env: PW, secret: db, key: ../token}]\noptions:")],
                             "secrets[0].key"),
    "port name Kubernetes refuses": ([("{name: http, port: 9090}", "{name: prometheus-metrics, port: 9090}"),
                                      ("{port: http,", "{port: prometheus-metrics,"),
                                      ("${port.http}", "${port.prometheus-metrics}")], "ports[0].name"),
    "two mounts at one path": ([("mount: /prometheus,", "mount: /etc/hpcml-prometheus,")], None),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_validate_refuses_everything_render_refuses(tmp_path, case):
    """Render's manifest checks alone (the shared check bypassed) refuse each blueprint, and
    ``validate`` refuses it too, in one line naming the file (and the key where it has one)."""
    needs.module("kubernetes_validate")
    edits, key = HOSTILE[case]
    text = PROMETHEUS
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    bad = tmp_path / "prometheus.yaml"
    bad.write_text(text)
    with pytest.raises(HpcmlError) as by_render:
        render.render_blueprints([load(bad)], k8s.Target("vision"), argocd.Repo())
    assert by_render.value.exit_code == 2 and "Kubernetes API server rule" in str(by_render.value)
    out = CliRunner().invoke(service_app, ["validate", str(bad)])
    assert out.exit_code == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.output
    assert out.stderr.startswith(f"hpcml service validate: error: {bad}: ")
    assert (f"key '{key}'" in out.stderr) if key else "Kubernetes API server rule" in out.stderr
    for command in (["render", str(bad), "--team", "vision"], ["up", str(bad), "--state-dir", str(tmp_path)]):
        out = CliRunner().invoke(service_app, command)          # the same line, from the same check
        assert out.exit_code == 2 and out.stderr.count("\n") == 1, out.output
    assert not (tmp_path / "prometheus").exists()                # up started nothing


@pytest.mark.parametrize("name", sorted(catalogue.available()))
def test_every_catalogue_blueprint_passes(name):
    check(with_dependencies(name))


def test_a_python_only_blueprint_is_held_to_the_same_rules():
    """No image, so no manifests: the field rules still apply (``up`` writes the files)."""
    text = PROMETHEUS.replace("image: docker.io/prom/prometheus:v2.53.0", "python: {packages: [pip]}", 1)
    with pytest.raises(UsageError, match=r"key 'files\[0\]\.content'"):
        from hpcml.service.blueprint import loads
        check([loads(text.replace("prometheus.yml: |", "../x: |", 1), "p.yaml")])
