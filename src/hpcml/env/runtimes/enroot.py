"""enroot (standalone): a SquashFS image, or a registry reference imported first into
the EDF image store (``EDF_IMAGESTORE``, else ``$SCRATCH/.edf_imagestore``, else
``~/.edf_imagestore``). Mounts use fstab fields, not Docker's ``:ro``; enroot has no
working-directory or unset option, so those go into the in-container wrapper. The
container inherits the caller's environment."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from hpcml.env.model import Environment
from hpcml.env.runtimes.base import (
    Launch,
    Runtime,
    annotations_note,
    container_env,
    entrypoint_note,
    image_kind,
    scratch_dir,
    squashfs_mounts,
    wrap_command,
)
from hpcml.errors import UsageError


def image_store(environ: Mapping[str, str]) -> str:
    if environ.get("EDF_IMAGESTORE"):
        return environ["EDF_IMAGESTORE"]
    base = environ.get("SCRATCH") or os.path.expanduser("~")
    return os.path.join(base, ".edf_imagestore")


def docker_uri(ref: str) -> str:
    """EDF's ``[USER@][REGISTRY#]IMAGE[:TAG]`` is enroot's own syntax after ``docker://``."""
    return "docker://" + ref


class Enroot(Runtime):
    name = "enroot"
    executable = "enroot"

    def render(self, env: Environment, command: list[str], *, environ: Mapping[str, str] | None = None,
               scratch: str | None = None) -> Launch:
        environ = os.environ if environ is None else environ
        kind = image_kind(env.image)
        if kind == "dir":
            raise UsageError(f"enroot runs a SquashFS image or a registry reference, not a directory: "
                             f"{env.image!r}", key="image")
        mounts, prepare, cleanup = squashfs_mounts(env, scratch_dir(env, scratch))
        notes: list[str] = []
        image = env.image
        if kind == "ref":
            image = os.path.join(image_store(environ), re.sub(r"[^A-Za-z0-9_.-]+", "+", env.image) + ".sqsh")
            prepare.insert(0, ["sh", "-c", 'test -e "$1" || { mkdir -p "$(dirname "$1")" && enroot import -o "$1" "$2"; }',
                               "sh", image, docker_uri(env.image)])
        argv = ["enroot", "start"]
        if env.writable:
            argv.append("--rw")
        for m in mounts:
            opts = "x-create=auto,rbind" + (",ro" if m.readonly else "")
            extra = [f for f in m.flags if f not in ("ro", "rw")]
            if extra:
                notes.append(f"mount {m.target}: flags {'+'.join(extra)} not passed to enroot")
            argv += ["--mount", f"{m.source}:{m.target}:none:{opts}"]
        variables = container_env(env)
        for key, value in variables.items():
            if value is not None:
                argv += ["-e", f"{key}={value}"]
        if env.devices:
            notes.append("devices ignored: enroot shows the host's /dev (ENROOT_RESTRICT_DEV restricts it)")
        unset = [k for k, v in variables.items() if v is None]
        argv += [*env.options.get(self.name, []), image, *wrap_command(env, command, workdir=env.workdir, unset=unset)]
        notes += entrypoint_note(env, "enroot start with a command") + annotations_note(env, "enroot")
        return Launch(self.name, argv, prepare=prepare, cleanup=cleanup, notes=notes)
