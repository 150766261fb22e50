"""``hpcml service render``: a blueprint (and its dependencies) -> validated manifests.

Layout of ``--out DIR`` (commit DIR as the root of the GitOps repository)::

    DIR/<prefix>/<namespace>/_namespace/namespace.yaml     Namespace + default-deny policy
    DIR/<prefix>/<namespace>/<service>/<kind>-<name>.yaml  one object per file
    DIR/argocd/<namespace>-<name>.yaml                      the ArgoCD Applications
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml.errors import UsageError
from hpcml.files import write_atomic
from hpcml.schemas import tag
from hpcml.service import argocd, k8s, validate
from hpcml.service.blueprint import Blueprint
from hpcml.service.resolve import with_dependencies


@dataclass
class Rendering:
    namespace: str
    version: str
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)   # relative path -> objects

    def documents(self) -> list[dict[str, Any]]:
        return [doc for docs in self.files.values() for doc in docs]

    def to_yaml(self) -> str:
        import yaml
        return "".join(f"---\n# {path}\n{yaml.safe_dump(doc, sort_keys=False)}"
                       for path, docs in self.files.items() for doc in docs)

    def to_json(self) -> dict[str, Any]:
        return {"schema": tag("service.render", 1), "namespace": self.namespace, "kubernetes": self.version,
                "files": [{"path": path, "objects": [f"{d['kind']}/{d['metadata']['name']}" for d in docs]}
                          for path, docs in self.files.items()]}


def _file_name(doc: dict[str, Any]) -> str:
    return f"{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"


def render_blueprints(blueprints: list[Blueprint], target: k8s.Target, repo: argocd.Repo,
                      version: str = validate.K8S_VERSION) -> Rendering:
    """Manifests of ``blueprints`` (dependencies first) for one namespace, each validated."""
    if not re.match(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$", target.team):
        raise UsageError(f"expected a lower-case team name of letters, digits and '-', found {target.team!r}", key="team")
    for bp in blueprints:
        if not bp.image:
            raise UsageError("Kubernetes needs an image: this blueprint has only python.packages",
                             file=bp.source or None, key="image")
    out = Rendering(target.namespace, version)
    base = "/".join(p for p in (repo.prefix.strip("/"), target.namespace) if p)
    out.files[f"{base}/{argocd.NAMESPACE_DIR}/namespace.yaml"] = k8s.namespace_manifests(target)
    apps = [argocd.application("namespace", argocd.NAMESPACE_DIR, target, repo, automated=True)]
    known = {bp.name: bp for bp in blueprints}
    for bp in blueprints:
        deps = {d: known[d] for d in bp.depends_on}
        for doc in k8s.service_manifests(bp, target, deps):
            out.files[f"{base}/{bp.name}/{_file_name(doc)}"] = [doc]
        apps.append(argocd.application(bp.name, bp.name, target, repo, automated=bp.kind != "inference"))
    for app in apps:
        out.files[f"argocd/{app['metadata']['name']}.yaml"] = [app]
    validate.validate_all(out.documents(), version)
    return out


def render(ref: str, target: k8s.Target, repo: argocd.Repo | None = None,
           options: dict[str, str] | None = None) -> Rendering:
    return render_blueprints(with_dependencies(ref, options), target, repo or argocd.Repo())


def write(rendering: Rendering, out: Path) -> list[Path]:
    """One YAML file per entry under ``out``; returns the paths written."""
    import yaml
    written = []
    for rel, docs in rendering.files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs))
        written.append(path)
    return written
