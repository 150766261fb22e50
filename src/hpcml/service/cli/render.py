"""``hpcml service list``, ``validate`` and ``render``: the catalogue and Kubernetes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hpcml.schemas import tag
from hpcml.service.cli.options import JSON, SET, parse_set


def list_blueprints(as_json: bool = JSON) -> None:
    """List the blueprints found by name (the bundled catalogue, $HPCML_SERVICE_PATH, site catalogues).

        hpcml service list
    """
    from hpcml.service import catalogue
    from hpcml.service.blueprint import load
    rows = [(name, load(path)) for name, path in catalogue.available().items()]
    if as_json:
        print(json.dumps({"schema": tag("service.list", 1), "blueprints": [
            {"name": n, "file": bp.source, "kind": bp.kind, "description": bp.description} for n, bp in rows]}, indent=2))
        return
    for name, bp in rows:
        print(f"{name:<14} {bp.kind:<11} {bp.description}  ({bp.source})")


def validate(blueprint: str = typer.Argument(..., help="A blueprint: a NAME from the catalogue or a path to a .yaml file.")) -> None:
    """Check a blueprint (and the blueprints it depends on) without running anything.

        hpcml service validate ./my-service.yaml

    Exit codes: 0 ok, 2 bad blueprint (one line naming the file, line and key).
    """
    from hpcml.service.resolve import with_dependencies
    chain = with_dependencies(blueprint)
    print(f"ok: {', '.join(bp.name for bp in chain)}")


def render(
    blueprint: str = typer.Argument(..., help="A blueprint: a NAME from the catalogue or a path to a .yaml file."),
    team: str = typer.Option(..., "--team", help="The team: manifests go to its namespace team-TEAM."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write one file per object under this directory "
                                                           "(default: print them as one YAML stream)."),
    options: Optional[list[str]] = SET,
    domain: str = typer.Option("apps.example.org", "--domain", help="Ingress hosts are SERVICE-TEAM.DOMAIN."),
    ingress_class: Optional[str] = typer.Option(None, "--ingress-class", help="The Ingress class to use."),
    repo: str = typer.Option("https://git.example.org/hpc/services.git", "--repo",
                             help="The Git repository ArgoCD syncs from (where --out DIR is committed)."),
    revision: str = typer.Option("HEAD", "--revision", help="The branch, tag or commit ArgoCD syncs."),
    as_json: bool = JSON,
) -> None:
    """Render Kubernetes manifests (and ArgoCD Applications) for a team, validated offline.

        hpcml service render mlflow --team vision --out gitops

    Objects: Namespace, Deployment, Service, PersistentVolumeClaim, ConfigMap, NetworkPolicy
    (namespace isolation, declared ports only), Ingress (public ports), nvidia.com/gpu limits with
    GPU node affinity and tolerations, one ArgoCD Application per service. Each is validated against
    the Kubernetes 1.32 OpenAPI schemas (needs the service extra:
    pip install 'hpcml\\[service]', in a clone pip install -e '.\\[service]').

    Exit codes: 0 written, 1 a manifest failed validation, 2 bad blueprint or option.
    """
    from hpcml.service import argocd, k8s
    from hpcml.service import render as rendering
    result = rendering.render(blueprint, k8s.Target(team, domain=domain, ingress_class=ingress_class),
                              argocd.Repo(url=repo, revision=revision), parse_set(options))
    if out is not None:
        written = rendering.write(result, out)
        if not as_json:
            print(f"{len(written)} files under {out} (namespace {result.namespace}, "
                  f"validated against Kubernetes {result.version})")
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    elif out is None:
        print(result.to_yaml(), end="")
