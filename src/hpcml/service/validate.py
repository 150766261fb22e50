"""Offline validation of rendered manifests against the Kubernetes OpenAPI schemas.

``kubernetes-validate`` (PyPI) ships the JSON Schemas of each Kubernetes release and
validates a manifest with no API server; its strict schemas also refuse unknown keys.
It has no schemas for custom resources, so ArgoCD's Application is checked against the
schema beside this module (``data/argocd-application.schema.json``) with jsonschema.
Both are the ``service`` extra's; without it, one line says how to install it. The
schemas check types and keys only: the field formats the API server enforces (names, keys,
images, env names, mount paths) are ``k8sformat``'s, checked after them on every object.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from hpcml.errors import HpcmlError

#: the Kubernetes release the manifests are validated against (RKE2 1.32; kubectl 1.32 here)
K8S_VERSION = "1.32"
_MISSING = "validating manifests needs the service extra: pip install 'hpcml[service]'"


class InvalidManifest(HpcmlError):
    """A rendered manifest that its schema refuses (a bug in a blueprint or in hpcml)."""


class InvalidField(InvalidManifest):
    """A field the API server would refuse (a name, key, image, env name or mount path): it
    comes from the blueprint or an option, so it is bad input: exit 2."""

    exit_code = 2


def _where(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    name = meta.get("name", "?") if isinstance(meta, dict) else "?"
    return f"{doc.get('kind', '?')}/{name if str(name).isprintable() else repr(name)}"


def check_formats(doc: dict[str, Any]) -> None:
    """The API server's field formats (``k8sformat``), which the schemas do not check."""
    from hpcml.service import k8sformat
    for field, value, problem in k8sformat.problems(doc):
        raise InvalidField(f"{_where(doc)}: {field}: {problem}, found {value!r} (Kubernetes API server rule)")


@lru_cache(maxsize=1)
def _application_validator() -> Any:
    import jsonschema
    schema = json.loads(resources.files("hpcml.service").joinpath("data/argocd-application.schema.json").read_text("utf-8"))
    return jsonschema.Draft202012Validator(schema)


def validate(doc: dict[str, Any], version: str = K8S_VERSION) -> str:
    """Validate one manifest (schema, then field formats); returns what it was checked against,
    raises ``InvalidManifest`` (``InvalidField``, exit 2, for a format the API server refuses)."""
    try:
        import kubernetes_validate
    except ImportError:
        raise HpcmlError(_MISSING) from None
    if doc.get("apiVersion", "").startswith("argoproj.io/"):
        errors = sorted(_application_validator().iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            path = ".".join(str(p) for p in errors[0].path)
            raise InvalidManifest(f"{_where(doc)}: {path or '(top)'}: {errors[0].message} (ArgoCD Application schema)")
        check_formats(doc)
        return "argocd.argoproj.io/v1alpha1 (hpcml's schema)"
    try:
        got = kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise InvalidManifest(f"{_where(doc)}: {path or '(top)'}: {exc.message} (Kubernetes {version})") from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise InvalidManifest(f"{_where(doc)}: no schema for {doc.get('apiVersion')} in Kubernetes {version}: "
                              f"{exc.message}") from None
    check_formats(doc)
    return f"Kubernetes {got}"


def validate_all(docs: list[dict[str, Any]], version: str = K8S_VERSION) -> None:
    for doc in docs:
        validate(doc, version)
