"""The GitOps path: one ArgoCD ``Application`` per rendered service directory.

The team's manifests are meant to be committed to a Git repository that ArgoCD watches;
each Application points at one directory (``<prefix>/<namespace>/<service>``) and deploys
into the team's namespace. The namespace's own objects get an Application of their own, so
no two Applications claim one object. Inference services (GPUs: costly) sync by hand, the
others automatically, as the CSCS service plane does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcml.service.k8s import MANAGED, Target

API_VERSION = "argoproj.io/v1alpha1"
NAMESPACE_DIR = "_namespace"


@dataclass(frozen=True)
class Repo:
    url: str = "https://git.example.org/hpc/services.git"
    revision: str = "HEAD"
    prefix: str = "services"
    argocd_namespace: str = "argocd"
    project: str = "default"
    server: str = "https://kubernetes.default.svc"


def application(name: str, directory: str, target: Target, repo: Repo, *, automated: bool) -> dict[str, Any]:
    """An Application deploying ``<prefix>/<namespace>/<directory>`` into the team's namespace."""
    sync: dict[str, Any] = {"syncOptions": ["CreateNamespace=false"]}
    if automated:
        sync["automated"] = {"prune": True, "selfHeal": True}
    path = "/".join(p for p in (repo.prefix.strip("/"), target.namespace, directory) if p)
    return {"apiVersion": API_VERSION, "kind": "Application",
            "metadata": {"name": f"{target.namespace}-{name}", "namespace": repo.argocd_namespace,
                         "labels": {"hpcml.io/team": target.team, **MANAGED}},
            "spec": {"project": repo.project,
                     "source": {"repoURL": repo.url, "targetRevision": repo.revision, "path": path},
                     "destination": {"server": repo.server, "namespace": target.namespace},
                     "syncPolicy": sync}}
