"""Kubernetes rendering: the whole catalogue, each object validated offline against the
Kubernetes 1.32 OpenAPI schemas (kubernetes-validate) and ArgoCD's Application schema."""

from __future__ import annotations

import copy

import pytest
import yaml

from hpcml.service import catalogue, k8s, render, validate


def _objects(rendering, kind):
    return [d for d in rendering.documents() if d["kind"] == kind]


@pytest.mark.parametrize("name", sorted(catalogue.available()))
def test_every_blueprint_renders_and_validates(name):
    r = render.render(name, k8s.Target("vision"))
    kinds = {d["kind"] for d in r.documents()}
    assert {"Namespace", "Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy", "Application"} <= kinds
    for doc in r.documents():               # again, one by one: each against its own schema
        against = validate.validate(doc)
        assert against == ("argocd.argoproj.io/v1alpha1 (hpcml's schema)" if doc["kind"] == "Application"
                           else f"Kubernetes {validate.K8S_VERSION}")
        broken = copy.deepcopy(doc)          # and the same check refuses what the API server refuses
        broken["metadata"]["name"] = "Not_A_DNS_Name"
        with pytest.raises(validate.InvalidManifest):
            validate.validate(broken)
        if doc["kind"] != "Application":
            assert doc["metadata"].get("namespace", doc["metadata"]["name"]) == "team-vision"


def test_gpu_service_gets_limits_affinity_and_tolerations():
    r = render.render("ollama", k8s.Target("vision"))
    pod = _objects(r, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exprs = {e["key"]: e["values"] for e in terms[0]["matchExpressions"]}
    assert exprs == {"gpu": ["true"], "gpu.vendor": ["nvidia"]}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    app = next(a for a in _objects(r, "Application") if a["metadata"]["name"].endswith("-ollama"))
    assert "automated" not in app["spec"]["syncPolicy"]      # GPUs are costly: synced by hand


def test_cpu_service_has_no_gpu_and_no_ingress_and_only_its_port_open():
    r = render.render("mlflow", k8s.Target("vision"))
    pod = _objects(r, "Deployment")[0]["spec"]["template"]["spec"]
    assert "affinity" not in pod and "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
    assert not _objects(r, "Ingress")
    policies = {p["metadata"]["name"]: p["spec"] for p in _objects(r, "NetworkPolicy")}
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert policies["mlflow"]["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 5000}]}]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "mlflow-postgres", "key": "password", "optional": True}


def test_public_port_gets_an_ingress_and_the_front_end_finds_its_back_end():
    r = render.render("open-webui", k8s.Target("vision"), options=None)
    (ingress,) = _objects(r, "Ingress")
    assert ingress["spec"]["rules"][0]["host"] == "open-webui-vision.apps.example.org"
    dep = next(d for d in _objects(r, "Deployment") if d["metadata"]["name"] == "open-webui")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OLLAMA_BASE_URL"] == "http://ollama:11434"


@pytest.mark.parametrize("break_it, message", [
    (lambda d: d["spec"].__setitem__("replicas", "one"), "replicas"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("resurces", {}), "resurces"),
])
def test_validation_can_fail(break_it, message):
    r = render.render("mlflow", k8s.Target("vision"))
    dep = copy.deepcopy(_objects(r, "Deployment")[0])
    break_it(dep)
    with pytest.raises(validate.InvalidManifest, match=message):
        validate.validate(dep)


def test_argocd_application_validation_can_fail():
    app = copy.deepcopy(_objects(render.render("mlflow", k8s.Target("vision")), "Application")[0])
    del app["spec"]["source"]["repoURL"]
    with pytest.raises(validate.InvalidManifest, match="repoURL"):
        validate.validate(app)


def test_out_writes_one_file_per_object(tmp_path):
    r = render.render("tensorboard", k8s.Target("vision"))
    written = render.write(r, tmp_path)
    assert len(written) == len(r.files)
    docs = [d for p in written for d in yaml.safe_load_all(p.read_text())]
    assert sorted(d["kind"] for d in docs) == sorted(d["kind"] for d in r.documents())
    assert (tmp_path / "argocd" / "team-vision-tensorboard.yaml").is_file()
