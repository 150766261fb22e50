"""An EDF as the runtime will see it: parsed and resolved, then the site's hooks applied.

The site file (YAML, pydantic) is read only when the environment enables a hook: most
EDFs have none, and ``hpcml env run`` pays for every import on each container start.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpcml.env.edf import load
from hpcml.env.model import Environment


def uses_hooks(env: Environment) -> bool:
    return any(key.startswith("com.hooks.") for key in env.annotations)


def resolve(edf: str | Path, *, site: str | Path | None = None, environ: Mapping[str, str] | None = None,
            cwd: str | Path | None = None, require_image: bool = True,
            lenient: bool | None = None) -> tuple[Environment, list[str]]:
    """The environment with hooks applied, and every warning (unknown keys when lenient, hooks)."""
    resolved = load(edf, environ=environ, cwd=cwd, require_image=require_image, lenient=lenient)
    env, warnings = resolved.env, list(resolved.warnings)
    if uses_hooks(env) or site:
        from hpcml.env.hooks import apply_hooks, runtime_options
        from hpcml.env.runtimes import RUNTIMES
        from hpcml.env.site import load_site
        site_ = load_site(site, environ=environ)
        env, hook_warnings = apply_hooks(env, site_)
        env.options = {name: opts for name in RUNTIMES if (opts := runtime_options(env, site_, name))}
        warnings += hook_warnings
    return env, warnings
