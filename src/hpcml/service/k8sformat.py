"""The field formats the Kubernetes API server enforces and its OpenAPI schemas do not.

kubernetes-validate checks a manifest against the OpenAPI schema: types and keys, not
the formats of names, keys, images and paths, so ``a_b`` as a name, ``../../etc/passwd``
as a ConfigMap key or an image with a newline passed offline and failed (or worse) on the
cluster. Ported by hand, since no Python package ships them, from k8s.io/apimachinery
``pkg/util/validation`` (IsDNS1123Label, IsDNS1123Subdomain, IsDNS1035Label, IsConfigMapKey,
IsQualifiedName, IsValidLabelValue, IsValidPortName, IsEnvVarName) and kubernetes
``pkg/apis/core/validation`` (which name format each kind takes, volume mounts); an image is
parsed with the reference grammar of distribution/reference, as the kubelet does before it
pulls. Go's ``$`` never matches before a trailing newline and Python's does: every pattern
here is matched with ``fullmatch``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from hpcml.files import key_text

Rule = Callable[[Any], "str | None"]

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS1035_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_CONFIGMAP_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")
_QUALIFIED_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_PORT_NAME_RE = re.compile(r"[-a-z0-9]+")
# 1.32 also has RelaxedEnvironmentVariableValidation (beta: any printable ASCII but '='); a
# centre may turn that gate off, so the portable rule is the one every cluster accepts.
_ENV_RE = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
_IMAGE_RE = re.compile(
    rf"(?P<name>(?:(?:{_DOMAIN}|\[[a-fA-F0-9:]+\])(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII)                    # Go's \w: a tag 'v1é' is not a tag
CONFIGMAP_MAX = 1 << 20          # core.MaxSecretSize: data + binaryData of one ConfigMap (or Secret)


def _regex(pattern: re.Pattern, max_len: int, what: str) -> Rule:
    def rule(value: Any) -> str | None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            return what
        return f"longer than {max_len} characters" if len(value) > max_len else None
    return rule


dns1123_label = _regex(_LABEL_RE, 63, "not a DNS-1123 label (lower-case letters, digits and '-', "
                                      "starting and ending with a letter or digit)")
dns1123_subdomain = _regex(_SUBDOMAIN_RE, 253, "not a DNS-1123 subdomain (DNS-1123 labels joined by '.')")
dns1035_label = _regex(_DNS1035_RE, 63, "not a DNS-1035 label (lower-case letters, digits and '-', "
                                        "starting with a letter, ending with a letter or digit)")
env_name = _regex(_ENV_RE, 1 << 20, "not an environment variable name (letters, digits, '_', '-' and '.', "
                                    "not starting with a digit)")


def configmap_key(value: Any) -> str | None:
    """IsConfigMapKey: a file name inside the volume, so never a path or '..'."""
    if not isinstance(value, str) or not _CONFIGMAP_KEY_RE.fullmatch(value):
        return "not a ConfigMap/Secret key (letters, digits, '-', '_' and '.': a file name, not a path)"
    if value in (".", "..") or value.startswith(".."):
        return "not a ConfigMap/Secret key (must not be '.' or start with '..')"
    return "longer than 253 characters" if len(value) > 253 else None


def qualified_name(value: Any) -> str | None:
    """IsQualifiedName (label and selector keys): an optional DNS subdomain prefix and '/'."""
    if not isinstance(value, str):
        return "not a qualified name"
    prefix, _, name = value.rpartition("/")
    if "/" in value and (not prefix or dns1123_subdomain(prefix)):
        return "not a qualified name: its prefix before '/' is not a DNS-1123 subdomain"
    if not _QUALIFIED_RE.fullmatch(name) or len(name) > 63:
        return ("not a qualified name (at most 63 letters, digits, '-', '_' and '.', starting and ending "
                "with a letter or digit, after an optional DNS subdomain and '/')")
    return None


def label_value(value: Any) -> str | None:
    if not isinstance(value, str) or (value and not _QUALIFIED_RE.fullmatch(value)) or len(value) > 63:
        return ("not a label value (empty, or at most 63 letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit)")
    return None


def port_name(value: Any) -> str | None:
    """IsValidPortName: an IANA service name (what a probe or targetPort refers to)."""
    if (not isinstance(value, str) or not _PORT_NAME_RE.fullmatch(value) or len(value) > 15
            or not re.search("[a-z]", value) or "--" in value or value[0] == "-" or value[-1] == "-"):
        return ("not a port name (at most 15 lower-case letters, digits and single '-', "
                "with a letter, not starting or ending with '-')")
    return None


def port_ref(value: Any) -> str | None:
    """A port given by number or by name (probes, a Service's targetPort)."""
    return None if isinstance(value, int) and not isinstance(value, bool) else port_name(value)


def image(value: Any) -> str | None:
    """distribution/reference: [host[:port]/]path[:tag][@digest], no whitespace anywhere."""
    m = _IMAGE_RE.fullmatch(value) if isinstance(value, str) else None
    if not m:
        return "not an image reference ([registry/]name[:tag][@digest], no whitespace or upper case in the name)"
    return "an image name longer than 255 characters" if len(m.group("name")) > 255 else None


def mount_path(value: Any) -> str | None:
    """validateVolumeMounts refuses '..' elements; the container runtime needs an absolute path."""
    if not isinstance(value, str) or not value.startswith("/"):
        return "not an absolute path"
    if ".." in value.split("/"):
        return "must not contain '..' (a mount path that climbs out of where it says)"
    return None


def ingress_host(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith("*."):
        value = value[2:]
    return dns1123_subdomain(value)


def http_path(value: Any) -> str | None:
    return None if isinstance(value, str) and value.startswith("/") else "not an absolute path (must start with '/')"


# Field paths ([] for any list index, * for any keys) -> rule; names by kind below.
_FIELDS: dict[str, Rule] = {
    "metadata.namespace": dns1123_label,
    "*.containers[].name": dns1123_label,
    "*.containers[].image": image,
    "*.containers[].env[].name": env_name,
    "*.secretKeyRef.name": dns1123_subdomain,
    "*.secretKeyRef.key": configmap_key,
    "*.containers[].ports[].name": port_name,
    "*.volumeMounts[].name": dns1123_label,
    "*.volumeMounts[].mountPath": mount_path,
    "*.httpGet.port": port_ref,
    "*.httpGet.path": http_path,
    "*.tcpSocket.port": port_ref,
    "*.volumes[].name": dns1123_label,
    "*.volumes[].configMap.name": dns1123_subdomain,
    "*.persistentVolumeClaim.claimName": dns1123_subdomain,
    "*.matchExpressions[].key": qualified_name,
    "*.matchExpressions[].values[]": label_value,
    "spec.storageClassName": dns1123_subdomain,
    "spec.ingressClassName": dns1123_subdomain,
    "spec.rules[].host": ingress_host,
    "spec.rules[].http.paths[].path": http_path,
    "spec.rules[].http.paths[].backend.service.name": dns1035_label,
    "spec.rules[].http.paths[].backend.service.port.name": port_name,
    "spec.tls[].hosts[]": ingress_host,
    "spec.tls[].secretName": dns1123_subdomain,
    "spec.destination.namespace": dns1123_label,
}
_SERVICE_FIELDS: dict[str, Rule] = {"spec.ports[].name": dns1123_label, "spec.ports[].targetPort": port_ref}
_PATTERNS = [(re.compile(re.escape(p).replace(r"\*", ".*").replace(r"\[\]", r"\[\d+\]")), r) for p, r in _FIELDS.items()]
_SERVICE_PATTERNS = [(re.compile(re.escape(p).replace(r"\[\]", r"\[\d+\]")), r) for p, r in _SERVICE_FIELDS.items()]
# pkg/apis/core/validation: a Namespace is a DNS-1123 label, a Service a DNS-1035 label (it
# becomes a DNS name of its own), every other kind hpcml renders a DNS-1123 subdomain.
_NAME_RULE: dict[str, Rule] = {"Namespace": dns1123_label, "Service": dns1035_label}


def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any, bool]]:
    """(path, value, is_key): every scalar, and every key of a mapping of names to values
    (labels, selectors, ConfigMap data) since those keys are formats of their own."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*path, k), k, True
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, (*path, i))
    else:
        yield path, node, False


def _is_label_map(kind: str, path: tuple) -> bool:
    return bool(path) and (path[-1] in ("labels", "matchLabels", "nodeSelector")
                           or (kind == "Service" and path == ("spec", "selector")))


def _key_rule(kind: str, parent: tuple) -> Rule | None:
    if _is_label_map(kind, parent):
        return qualified_name
    if kind == "ConfigMap" and parent in (("data",), ("binaryData",)):
        return configmap_key
    return None


def _value_rule(kind: str, path: tuple) -> Rule | None:
    if _is_label_map(kind, path[:-1]):
        return label_value
    if path == ("metadata", "name"):
        return _NAME_RULE.get(kind, dns1123_subdomain)
    text = key_text(path)
    for pattern, rule in (_SERVICE_PATTERNS if kind == "Service" else []) + _PATTERNS:
        if pattern.fullmatch(text):
            return rule
    return None


def problems(doc: dict[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """(field path, value, problem) of each field of ``doc`` the API server would refuse."""
    kind = str(doc.get("kind", ""))
    for path, value, is_key in _leaves(doc):
        rule = _key_rule(kind, path[:-1]) if is_key else _value_rule(kind, path)
        problem = rule(value) if rule else None
        if problem:
            yield (f"{key_text(path[:-1])} key" if is_key else key_text(path)), value, problem
    yield from _pod_problems(doc)
    if kind == "ConfigMap":
        size = sum(len(str(k).encode()) + len(str(v).encode())
                   for part in ("data", "binaryData") for k, v in (doc.get(part) or {}).items())
        if size > CONFIGMAP_MAX:
            yield "data", f"{size} bytes", f"larger than {CONFIGMAP_MAX} bytes, the most a ConfigMap holds"


def _pod_problems(doc: dict[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """A volume mount names a volume of the pod, and no two mounts share a path."""
    pod = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    if not isinstance(pod, dict):
        return
    volumes = {v.get("name") for v in pod.get("volumes") or [] if isinstance(v, dict)}
    for c, container in enumerate(pod.get("containers") or []):
        seen: set[str] = set()
        for m, mount in enumerate(container.get("volumeMounts") or [] if isinstance(container, dict) else []):
            where = f"spec.template.spec.containers[{c}].volumeMounts[{m}]"
            if mount.get("name") not in volumes:
                yield f"{where}.name", mount.get("name"), "no volume of the pod has this name"
            if mount.get("mountPath") in seen:
                yield f"{where}.mountPath", mount.get("mountPath"), "another volume is mounted there already"
            seen.add(mount.get("mountPath"))
