"""The site hooks file: what each EDF hook annotation (``com.hooks.NAME``) needs on this site.

CSCS's hooks are compiled into the Container Engine; elsewhere nothing injects Slingshot
libfabric or the NCCL plugin. A site file says, per hook, which mounts, environment,
devices and runtime options stand in for it, so the same EDF works on any site that
describes its hooks. Lookup: ``--site FILE``, else ``$HPCML_ENV_SITE``, else the packaged
``data/site-default.yaml`` (an example site, not a real one).

    hooks:
      com.hooks.cxi:
        mounts: ["/opt/cray/libfabric/1.22.0:/opt/cray/libfabric/1.22.0:ro"]
        env: {FI_PROVIDER: cxi}
        devices: ["hpe.com/cxi=all"]
      com.hooks.aws_ofi_nccl:
        implies: [com.hooks.cxi]
        default_variant: cuda12
        variants:
          cuda12: {cuda: 12, mounts: [...], env: {...}}
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hpcml.env.expand import is_variable_name
from hpcml.env.model import Mount
from hpcml.env.mounts import MountError, parse_mount
from hpcml.errors import UsageError
from hpcml.files import load_yaml, read_config

SITE_ENV_VAR = "HPCML_ENV_SITE"
HOOK_PREFIX = "com.hooks."
#: runtimes a site may give options for besides hpcml.env.runtimes.RUNTIMES (checked by ``hpcml env check``)
OTHER_RUNTIMES = ("apptainer",)


def runtime_names() -> list[str]:
    """Every runtime name a site file may use: the registered runtimes (plug-ins included)."""
    from hpcml.env.runtimes import RUNTIMES
    return [*RUNTIMES.names(), *OTHER_RUNTIMES]


class _Additions(BaseModel):
    """What enabling a hook (or one of its variants) adds to the environment."""

    model_config = ConfigDict(extra="forbid")

    env: dict[str, str] = {}
    mounts: list[str] = []
    devices: list[str] = []
    options: dict[str, list[str]] = {}    # runtime name -> extra argv for that runtime

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not is_variable_name(name):
                raise ValueError(f"{name!r} is not a variable name (letters, digits and _, not starting "
                                 "with a digit)")
        return env

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, specs: list[str]) -> list[str]:
        for spec in specs:
            try:
                parse_mount(spec, "/")
            except MountError as exc:
                raise ValueError(str(exc)) from None
            if not spec.startswith("/"):
                raise ValueError(f"a site mount source must be absolute, found {spec!r}")
        return specs

    @field_validator("options")
    @classmethod
    def _options(cls, options: dict[str, list[str]]) -> dict[str, list[str]]:
        known = runtime_names() if options else []
        for name in options:
            if name not in known:
                raise ValueError(f"expected a runtime ({', '.join(known)}), found {name!r}")
        return options

    def mount_list(self) -> list[Mount]:
        return [parse_mount(spec, "/") for spec in self.mounts]


class Variant(_Additions):
    cuda: int | None = Field(default=None, ge=1)     # CUDA major the plugin build needs
    rocm: int | None = Field(default=None, ge=1)     # ROCm major the plugin build needs


class Hook(_Additions):
    description: str = ""
    implies: list[str] = []
    variants: dict[str, Variant] = {}
    default_variant: str | None = None

    @field_validator("implies")
    @classmethod
    def _implies(cls, names: list[str]) -> list[str]:
        for n in names:
            if not n.startswith(HOOK_PREFIX):
                raise ValueError(f"expected a hook name 'com.hooks.NAME', found {n!r}")
        return names


class SiteFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    site: str = ""                       # a name for messages
    hooks: dict[str, Hook] = {}

    @field_validator("hooks")
    @classmethod
    def _names(cls, hooks: dict[str, Hook]) -> dict[str, Hook]:
        for name, hook in hooks.items():
            rest = name[len(HOOK_PREFIX):]
            if not name.startswith(HOOK_PREFIX) or not rest or "." in rest:
                raise ValueError(f"expected a hook name 'com.hooks.NAME', found {name!r}")
            if hook.default_variant and hook.default_variant not in hook.variants:
                raise ValueError(f"{name}: default_variant {hook.default_variant!r} is not one of "
                                 f"its variants ({', '.join(hook.variants) or 'none'})")
            for implied in hook.implies:
                if implied not in hooks:
                    raise ValueError(f"{name}: implies {implied!r}, which has no entry in this file")
        return hooks


@dataclass
class Site:
    """A validated site file and where it came from."""

    spec: SiteFile
    source: str

    @property
    def hooks(self) -> dict[str, Hook]:
        return self.spec.hooks

    @property
    def name(self) -> str:
        return self.spec.site or self.source


def parse_site(text: str, source: str) -> Site:
    """Validate a site file's text; any problem is a one-line ``UsageError`` (exit 2)."""
    data = load_yaml(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"expected a mapping with keys site, hooks, found {type(data).__name__}",
                         file=source)
    try:
        return Site(SiteFile.model_validate(data), source)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        found = err.get("input")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (known: env, mounts, devices, options, and for hooks description, implies, " \
                  "variants, default_variant; for variants cuda, rocm)" if len(err["loc"]) > 2 else \
                  "unknown key (known: site, hooks)"
        elif err["type"] != "value_error":
            msg += f", found {type(found).__name__} {found!r}" if not isinstance(found, (dict, list)) \
                else f", found a {'mapping' if isinstance(found, dict) else 'list'}"
        raise UsageError(msg, file=source, key=key or None) from None


def default_site() -> Site:
    text = importlib.resources.files("hpcml.env").joinpath("data/site-default.yaml").read_text()
    return parse_site(text, "site-default.yaml (packaged example)")


def load_site(path: str | Path | None = None, *, environ: Mapping[str, str] | None = None) -> Site:
    """``path``, else ``$HPCML_ENV_SITE``, else the packaged example site."""
    environ = os.environ if environ is None else environ
    chosen = str(path) if path else environ.get(SITE_ENV_VAR) or None
    if chosen is None:
        return default_site()
    how = "" if path else f" (from ${SITE_ENV_VAR})"
    text = read_config(chosen, what=f"the site hooks file{how}")
    return parse_site(text, chosen)
