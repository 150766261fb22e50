"""A blueprint -> the Kubernetes manifests of one service in a team's namespace.

Plain dicts, written by hand rather than through a Helm chart: hpcml has no Helm here
and one blueprint maps to a handful of objects. Per service: a Deployment (one replica,
``Recreate``, so two pods never share a volume), a Service, a PersistentVolumeClaim per
volume, a ConfigMap per ``files`` entry, a NetworkPolicy that opens only the declared
ports and only to pods of the same namespace (plus the ingress controller's namespace for
a public port), an Ingress for a public port; GPU services get ``nvidia.com/gpu`` limits,
node affinity on the labels ``gpu=true`` and ``gpu.vendor=<vendor>``, and a toleration
for GPU nodes' taint. Per namespace: the Namespace and a default-deny ingress policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcml.service.blueprint import Blueprint
from hpcml.service.placeholders import Place, expand

LABEL = "app.kubernetes.io/name"
MANAGED = {"app.kubernetes.io/managed-by": "hpcml"}


@dataclass(frozen=True)
class Target:
    """Where manifests go: the team's namespace and how public ports are reached."""

    team: str
    domain: str = "apps.example.org"              # Ingress host: <service>-<team>.<domain>
    ingress_class: str | None = None
    ingress_namespace: str = "ingress-nginx"      # where the ingress controller's pods run

    @property
    def namespace(self) -> str:
        return self.team if self.team.startswith("team-") else f"team-{self.team}"


def quantity_bytes(n: float) -> str:
    """Bytes as a Kubernetes quantity (Mi or Gi when exact)."""
    n = int(n)
    for suffix, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)


def quantity_cpu(cores: float) -> str:
    return str(int(cores)) if cores == int(cores) else f"{round(cores * 1000)}m"


def _meta(name: str, target: Target, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": target.namespace, "labels": {LABEL: name, **MANAGED}, **extra}


def namespace_manifests(target: Target) -> list[dict[str, Any]]:
    """The team's Namespace and its default-deny ingress policy."""
    ns = target.namespace
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": ns, "labels": {"hpcml.io/team": target.team, **MANAGED}}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": "default-deny-ingress", "namespace": ns, "labels": dict(MANAGED)},
         "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}},
    ]


def _place(bp: Blueprint, deps: dict[str, Blueprint]) -> Place:
    services = {name: {p.name: f"http://{name}:{p.port}" for p in dep.ports} for name, dep in deps.items()}
    return Place(host="0.0.0.0", ports={p.name: p.port for p in bp.ports},
                 volumes={v.name: v.mount for v in bp.volumes}, files={f.name: f.mount for f in bp.files},
                 services=services)


def _container(bp: Blueprint, deps: dict[str, Blueprint]) -> dict[str, Any]:
    ex = expand(bp, _place(bp, deps))
    r = bp.resources
    requests = {"cpu": quantity_cpu(r.cpu), "memory": quantity_bytes(r.memory)}
    limits = {"memory": quantity_bytes(r.memory)}
    if bp.gpu_resource:
        limits[bp.gpu_resource] = str(r.gpus)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in ex.env.items()]
    env += [{"name": s.env, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key, "optional": s.optional}}}
            for s in bp.secrets]
    health = bp.port(bp.health.port)
    probe: dict[str, Any] = ({"httpGet": {"path": bp.health.http, "port": health.name}} if bp.health.http
                             else {"tcpSocket": {"port": health.name}})
    container: dict[str, Any] = {
        "name": bp.name, "image": bp.image, "command": ex.command,
        "ports": [{"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in bp.ports],
        "resources": {"requests": requests, "limits": limits},
        "readinessProbe": {**probe, "periodSeconds": 5},
        "startupProbe": {**probe, "periodSeconds": 5, "failureThreshold": max(1, int(bp.health.timeout // 5))},
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": [{"name": v.name, "mountPath": v.mount} for v in bp.volumes]
        + [{"name": f"files-{f.name}", "mountPath": f.mount, "readOnly": True} for f in bp.files],
    }
    if env:
        container["env"] = env
    return container


def _gpu_scheduling(bp: Blueprint) -> dict[str, Any]:
    if not bp.gpu_resource:
        return {}
    vendor = bp.resources.gpu_vendor or "nvidia"
    terms = [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["true"]},
                                   {"key": "gpu.vendor", "operator": "In", "values": [vendor]}]}]
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
            "tolerations": [{"key": bp.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}]}


def service_manifests(bp: Blueprint, target: Target, deps: dict[str, Blueprint] | None = None) -> list[dict[str, Any]]:
    """Every object of one service (not the namespace's own)."""
    deps = deps or {}
    name, out = bp.name, []
    for vol in bp.volumes:
        spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": quantity_bytes(vol.size)}}}
        if vol.storage_class:
            spec["storageClassName"] = vol.storage_class
        out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": _meta(f"{name}-{vol.name}", target), "spec": spec})
    ex = expand(bp, _place(bp, deps))
    for f in bp.files:
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{name}-{f.name}", target),
                    "data": ex.files[f.name]})
    volumes = [{"name": v.name, "persistentVolumeClaim": {"claimName": f"{name}-{v.name}"}} for v in bp.volumes]
    volumes += [{"name": f"files-{f.name}", "configMap": {"name": f"{name}-{f.name}"}} for f in bp.files]
    pod: dict[str, Any] = {"containers": [_container(bp, deps)], **_gpu_scheduling(bp)}
    if volumes:
        pod["volumes"] = volumes
    selector = {LABEL: name}
    out.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, target),
                "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector},
                         "template": {"metadata": {"labels": {**selector, **MANAGED}}, "spec": pod}}})
    out.append({"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, target),
                "spec": {"selector": selector, "ports": [{"name": p.name, "port": p.port, "targetPort": p.name,
                                                          "protocol": "TCP"} for p in bp.ports]}})
    ingress_from: list[dict[str, Any]] = [{"podSelector": {}}]
    public = [p for p in bp.ports if p.public]
    rules = [{"from": ingress_from, "ports": [{"protocol": "TCP", "port": p.port} for p in bp.ports]}]
    if public:
        rules.append({"from": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": target.ingress_namespace}}}],
                      "ports": [{"protocol": "TCP", "port": p.port} for p in public]})
    out.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(name, target),
                "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": rules}})
    for p in public:
        host = f"{name}-{target.team}.{target.domain}"
        spec = {"rules": [{"host": host, "http": {"paths": [{"path": p.path, "pathType": "Prefix", "backend": {
                    "service": {"name": name, "port": {"name": p.name}}}}]}}],
                "tls": [{"hosts": [host], "secretName": f"{name}-{p.name}-tls"}]}
        if target.ingress_class:
            spec["ingressClassName"] = target.ingress_class
        out.append({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                    "metadata": _meta(f"{name}-{p.name}", target), "spec": spec})
    return out
