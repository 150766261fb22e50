"""The checks of a blueprint that every command taking one runs, before anything runs.

``validate`` once said ok to a blueprint whose ``files[].content`` key was
``../../etc/passwd``, which ``up`` (a file written outside its directory) and ``render`` (a
ConfigMap key the API server refuses) both refused: each command had its own checks. Now
``resolve.with_dependencies``, through which ``validate``, ``up`` and ``render`` all load a
blueprint, ends with ``check``, so a blueprint one of them refuses none of them accepts.

A blueprint says what a service is, wherever it runs, so it is held to the rules of every
place: each field a place turns into a file name, a path, a variable or a Kubernetes field
is checked with the API server's rule for it (``k8sformat``; a file key is a ConfigMap key,
so a file name, never a path), and named as the blueprint's file and key. Then, as a
backstop for any rule not mapped to a key here, the objects ``render`` would write for the
blueprint are built and checked with the same ``validate.check_formats`` that ``render`` runs.

What only one place needs is not a blueprint's fault and stays with that place: an image
(Kubernetes runs no ``python.packages``), the team (``render --team``), the address and
the secrets in the caller's environment (``up``), an installed backend. The OpenAPI
schemas check hpcml's own output (types, keys), not the blueprint's, and need the
``service`` extra: ``render`` alone runs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hpcml.errors import UsageError
from hpcml.files import key_text
from hpcml.service import k8sformat
from hpcml.service.blueprint import Blueprint

Field = tuple[tuple, Any, k8sformat.Rule]


def check(chain: list[Blueprint]) -> None:
    """Refuse ``chain`` (dependencies first) if any place would refuse one of its blueprints:
    one line naming the file and key, exit 2."""
    for bp in chain:
        for path, value, rule in _fields(bp):
            problem = rule(value)
            if problem:
                raise field_error(bp, path, value, problem)
    _manifests(chain)


def check_file_key(bp: Blueprint, i: int, key: str) -> None:
    """A key of ``files[i].content`` is a file name (a ConfigMap key), never a path such as
    ``../../x`` or ``/tmp/x``: ``up`` writes it under the state directory."""
    problem = k8sformat.configmap_key(key)
    if problem:
        raise field_error(bp, ("files", i, "content"), key, problem)


def field_error(bp: Blueprint, path: tuple, value: Any, problem: str) -> UsageError:
    shown = key_text(tuple(p if not isinstance(p, str) or p.isprintable() else repr(p)[1:-1] for p in path))
    return UsageError(f"{problem}, found {value!r}", file=bp.source or None, key=shown)


def _fields(bp: Blueprint) -> Iterator[Field]:
    """(key path, value, rule) of each field a place uses as a name, key or path."""
    env_name, subdomain = k8sformat.env_name, k8sformat.dns1123_subdomain
    if bp.image is not None:
        yield ("image",), bp.image, k8sformat.image
    for i, port in enumerate(bp.ports):
        yield ("ports", i, "name"), port.name, k8sformat.port_name
        yield ("ports", i, "path"), port.path, k8sformat.http_path
    for i, vol in enumerate(bp.volumes):
        yield ("volumes", i, "mount"), vol.mount, k8sformat.mount_path
        if vol.storage_class is not None:
            yield ("volumes", i, "storage_class"), vol.storage_class, subdomain
    for i, f in enumerate(bp.files):
        yield ("files", i, "mount"), f.mount, k8sformat.mount_path
        for key in f.content:
            yield ("files", i, "content"), key, k8sformat.configmap_key
    for name in bp.env:
        yield ("env", name), name, env_name
    for i, s in enumerate(bp.secrets):
        yield ("secrets", i, "env"), s.env, env_name
        yield ("secrets", i, "secret"), s.secret, subdomain
        yield ("secrets", i, "key"), s.key, k8sformat.configmap_key
    if bp.auth.env is not None:
        yield ("auth", "env"), bp.auth.env, env_name
    if bp.health.http is not None:
        yield ("health", "http"), bp.health.http, k8sformat.http_path


def _manifests(chain: list[Blueprint]) -> None:
    """Each blueprint's objects as ``render`` writes them (``k8s.service_manifests``), checked
    as ``render`` checks them; a problem names the blueprint's file. A chain with a blueprint
    without an image has none: ``render`` refuses it for that."""
    from hpcml.service import k8s, validate
    if not all(bp.image for bp in chain):
        return
    known = {bp.name: bp for bp in chain}
    for bp in chain:
        for doc in k8s.service_manifests(bp, k8s.Target("validate"), {d: known[d] for d in bp.depends_on}):
            try:
                validate.check_formats(doc)
            except validate.InvalidField as exc:
                raise UsageError(f"in the manifests 'hpcml service render' writes: {exc}",
                                 file=bp.source or None) from None
