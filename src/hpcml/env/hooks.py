"""EDF hook annotations (``com.hooks.*``) turned into mounts, environment, devices and
runtime options, as the site hooks file (``hpcml.env.site``) says; unknown ones warn."""

from __future__ import annotations

import dataclasses

from hpcml.env.model import Environment
from hpcml.env.site import HOOK_PREFIX, Hook, Site, Variant

# The hooks' annotation keys known from CSCS's Container Engine and Sarus Suite.
KNOWN_KEYS: dict[str, frozenset[str]] = {
    "cxi": frozenset({"enabled"}),
    "aws_ofi_nccl": frozenset({"enabled", "variant"}),
    "netstack": frozenset({"enabled", "source", "version", "name"}),
    "ssh": frozenset({"enabled", "authorize_ssh_key", "port"}),
    "nvidia_cuda_mps": frozenset({"enabled"}),
    "dcgm": frozenset({"enabled"}),
    "slurm": frozenset({"enabled"}),
}

# What the job loses when a hook is asked for but the site does not provide it.
CONSEQUENCE = {
    "cxi": "the container gets no Slingshot libfabric; NCCL will fall back to TCP",
    "aws_ofi_nccl": "NCCL gets no libfabric network plugin and will fall back to TCP sockets",
    "netstack": "the host's network stack is not injected",
    "ssh": "no SSH server runs in the container",
    "nvidia_cuda_mps": "no CUDA MPS daemon: ranks sharing a GPU are time-sliced",
    "dcgm": "no DCGM in the container: GPU health and profiling metrics are missing",
    "slurm": "the Slurm client and its configuration are not injected",
}

TRUE = frozenset({"true", "1", "yes", "on"})


def _short(hook: str) -> str:
    return hook[len(HOOK_PREFIX):]


def enabled_hooks(annotations: dict[str, str]) -> list[str]:
    """Hook names (``com.hooks.NAME``) the annotations switch on, in annotation order."""
    out: list[str] = []
    for key, value in annotations.items():
        if not key.startswith(HOOK_PREFIX):
            continue
        name, _, sub = key[len(HOOK_PREFIX):].partition(".")
        on = (sub == "enabled" and str(value).strip().lower() in TRUE) or (name == "netstack" and sub == "source")
        if on and HOOK_PREFIX + name not in out:
            out.append(HOOK_PREFIX + name)
    return out


def _unknown_annotations(annotations: dict[str, str], site: Site) -> list[str]:
    warnings = []
    for key in annotations:
        if not key.startswith(HOOK_PREFIX):
            continue
        name, _, sub = key[len(HOOK_PREFIX):].partition(".")
        known = KNOWN_KEYS.get(name)
        if known is None and HOOK_PREFIX + name in site.hooks:
            known = frozenset({"enabled", "variant"})
        if known is None:
            warnings.append(f"annotations.{key}: unknown hook {name!r}; it is ignored "
                            f"(known: {', '.join(sorted(set(KNOWN_KEYS) | {_short(h) for h in site.hooks}))})")
        elif sub not in known:
            warnings.append(f"annotations.{key}: unknown key {sub!r} of hook {name!r}; it is ignored "
                            f"(known: {', '.join(sorted(known))})")
    return warnings


def chosen_variant(env: Environment, hook_name: str, hook: Hook) -> tuple[str | None, Variant | None, str | None]:
    """(variant name, its spec, a warning) for ``hook_name`` on this site."""
    asked = env.annotations.get(f"{hook_name}.variant")
    if not hook.variants:
        return asked, None, None
    name = asked or hook.default_variant
    if name is None:
        return None, None, (f"annotations.{hook_name}.variant: not set and the site has no default; "
                            f"choose one of {', '.join(hook.variants)}")
    if name not in hook.variants:
        return name, None, (f"annotations.{hook_name}.variant: {name!r} is not configured on this site "
                            f"(it has {', '.join(hook.variants)}); {CONSEQUENCE.get(_short(hook_name), 'the hook is not applied')}")
    return name, hook.variants[name], None


def _resolve_order(enabled: list[str], site: Site) -> list[str]:
    """The enabled hooks plus what they imply, each once, implied ones after their hook."""
    out: list[str] = []
    todo = list(enabled)
    while todo:
        name = todo.pop(0)
        if name in out:
            continue
        out.append(name)
        hook = site.hooks.get(name)
        if hook:
            todo.extend(hook.implies)
    return out


def apply_hooks(env: Environment, site: Site) -> tuple[Environment, list[str]]:
    """A new Environment with each enabled hook's mounts, env and devices added, and warnings.

    The EDF's own ``[env]`` values and mount targets win over a hook's; an earlier hook wins
    over a later one. Added values are recorded in ``origin`` as ``site hook NAME (FILE)``.
    """
    warnings = _unknown_annotations(env.annotations, site)
    new = dataclasses.replace(env, mounts=list(env.mounts), devices=list(env.devices),
                              env=dict(env.env), origin=dict(env.origin))
    targets = {m.target for m in new.mounts}
    for name in _resolve_order(enabled_hooks(env.annotations), site):
        hook = site.hooks.get(name)
        if hook is None:
            if _short(name) not in KNOWN_KEYS:
                continue                  # already warned about as an unknown hook
            warnings.append(f"annotations.{name}.enabled: this site's hooks file has no {_short(name)} entry: "
                            f"{CONSEQUENCE.get(_short(name), 'the hook is not applied')} (site file: {site.source})")
            continue
        _, variant, warning = chosen_variant(env, name, hook)
        if warning:
            warnings.append(warning)
            if hook.variants and variant is None:
                continue
        origin = f"site hook {name} ({site.source})"
        for part in (hook, variant) if variant else (hook,):
            for key, value in part.env.items():
                if key not in new.env:
                    new.env[key] = value
                    new.origin[f"env.{key}"] = origin
            for mount in part.mount_list():
                if mount.target not in targets:
                    targets.add(mount.target)
                    new.origin[f"mounts[{len(new.mounts)}]"] = origin
                    new.mounts.append(mount)
            for device in part.devices:
                if device not in new.devices:
                    new.devices.append(device)
    return new, warnings


def runtime_options(env: Environment, site: Site, runtime: str) -> list[str]:
    """Extra argv for ``runtime`` from the enabled hooks (and their variants) on this site."""
    argv: list[str] = []
    for name in _resolve_order(enabled_hooks(env.annotations), site):
        hook = site.hooks.get(name)
        if hook is None:
            continue
        _, variant, _ = chosen_variant(env, name, hook)
        if hook.variants and variant is None:
            continue
        for part in (hook, variant) if variant else (hook,):
            argv.extend(part.options.get(runtime, []))
    return argv
