"""The API server's field formats, checked offline: each object hpcml renders with a name,
key, image, env name or mount path that Kubernetes would refuse (and that its OpenAPI
schema lets through) is refused by ``validate`` in one line naming the object, the field
and the rule, exit 2; from a blueprint file, ``service render`` refuses it by the same rule,
naming the blueprint's file and key."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.service import catalogue, k8s, k8sformat, render, validate
from tests import needs

needs.module("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = (catalogue.DIRECTORY / "prometheus.yaml").read_text()


def _doc(kind: str) -> dict:
    docs = render.render("prometheus", k8s.Target("vision")).documents()
    return copy.deepcopy(next(d for d in docs if d["kind"] == kind))


def _container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _set_secret(doc: dict, key: str) -> None:
    _container(doc)["env"] = [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": key}}}]


# (object, what is broken, the field path the message names): each passes the OpenAPI schema.
CASES = [
    ("Deployment", lambda d: d["metadata"].__setitem__("name", "team/prometheus"), "metadata.name"),
    ("PersistentVolumeClaim", lambda d: d["metadata"].__setitem__("name", "prometheus_tsdb"), "metadata.name"),
    ("NetworkPolicy", lambda d: d["metadata"].__setitem__("name", "a..b"), "metadata.name"),
    ("Service", lambda d: d["metadata"].__setitem__("name", "prometheus.web"), "metadata.name"),
    ("ConfigMap", lambda d: d["data"].__setitem__("../../etc/passwd", "root::0:0::/:/bin/sh"), "data key"),
    ("Deployment", lambda d: _container(d).__setitem__("image", "docker.io/prom/prometheus:v2\nmalicious"),
     "containers[0].image"),
    ("Deployment", lambda d: _container(d).__setitem__("env", [{"name": "A\nB", "value": "1"}]),
     "containers[0].env[0].name"),
    ("Deployment", lambda d: _container(d)["volumeMounts"][0].__setitem__("mountPath", "/cfg/../.."),
     "volumeMounts[0].mountPath"),
    ("Deployment", lambda d: _set_secret(d, "../token"), "secretKeyRef.key"),
    ("Deployment", lambda d: _container(d)["ports"][0].__setitem__("name", "http_web"), "ports[0].name"),
    ("Deployment", lambda d: _container(d)["volumeMounts"][0].__setitem__("name", "nope"), "volumeMounts[0].name"),
    ("Deployment", lambda d: d["metadata"]["labels"].__setitem__("app.kubernetes.io/name", "a b"), "metadata.labels"),
]


@pytest.mark.parametrize("kind, break_it, field", CASES)
def test_each_field_the_api_server_refuses_is_refused_offline(kind, break_it, field):
    doc = _doc(kind)
    break_it(doc)
    with pytest.raises(validate.InvalidManifest) as exc:
        validate.validate(doc)
    message = str(exc.value)
    assert exc.value.exit_code == 2 and "\n" not in message, message
    assert message.startswith(f"{kind}/") and field in message and "Kubernetes API server rule" in message, message


@pytest.mark.parametrize("rule, value", [
    (k8sformat.dns1123_subdomain, "team-vision.mlflow-1"),
    (k8sformat.qualified_name, "app.kubernetes.io/name"),
    (k8sformat.image, "docker.io/library/python:3.11-slim"),
    (k8sformat.image, "localhost:5000/team/img@sha256:" + "a" * 64),
    (k8sformat.image, "ghcr.io/open-webui/open-webui:v0.6.5"),
    (k8sformat.env_name, "MLFLOW_TRACKING_URI"),
    (k8sformat.configmap_key, "prometheus.yml"),
    (k8sformat.mount_path, "/etc/hpcml-prometheus/"),
    (k8sformat.port_name, "http"),
])
def test_what_the_api_server_accepts_passes(rule, value):
    assert rule(value) is None


@pytest.mark.parametrize("old, new, field", [
    ("prometheus.yml: |", "../../etc/passwd: |", "key 'files[0].content'"),
    ("image: docker.io/prom/prometheus:v2.53.0", 'image: "docker.io/prom/prometheus:v2.53.0\\nX"', "key 'image'"),
    ("options:", 'env: {"A\\nB": "1"}\noptions:', "key 'env.A\\nB'"),
    ("mount: /prometheus,", "mount: /cfg/../..,", "key 'volumes[0].mount'"),
])
def test_a_blueprint_file_with_such_a_field_is_not_rendered(tmp_path, old, new, field):
    """Refused by the same rule before any manifest is built, named as the blueprint's key
    (``hpcml.service.checks``, which ``validate`` and ``up`` run too)."""
    assert old in PROMETHEUS
    bad = tmp_path / "bad.yaml"
    bad.write_text(PROMETHEUS.replace(old, new, 1))
    with pytest.raises(UsageError) as exc:
        render.render(str(bad), k8s.Target("vision"))
    assert str(exc.value).startswith(f"{bad}: {field}: ") and "\n" not in str(exc.value)
    if "passwd" not in new:
        return
    out = subprocess.run([sys.executable, "-m", "hpcml", "service", "render", str(bad), "--team", "vision",
                          "--out", str(tmp_path / "gitops")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "../../etc/passwd" in lines[0] and not (tmp_path / "gitops").exists(), lines
