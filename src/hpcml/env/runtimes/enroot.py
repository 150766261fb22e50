"""enroot (standalone): a SquashFS image, or a registry reference imported first into
the EDF image store (``EDF_IMAGESTORE``, else ``$SCRATCH/.edf_imagestore``, else
``~/.edf_imagestore``). Mounts use fstab fields, not Docker's ``:ro``; enroot has no
working-directory or unset option, so those go into the in-container wrapper. The
container inherits the caller's environment."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from hpcml.env.runtimes.base import Plan, Runtime, annotations_note, enroot_reference, entrypoint_note, wrap_command


def image_store(environ: Mapping[str, str]) -> str:
    if environ.get("EDF_IMAGESTORE"):
        return environ["EDF_IMAGESTORE"]
    base = environ.get("SCRATCH") or os.path.expanduser("~")
    return os.path.join(base, ".edf_imagestore")


def docker_uri(ref: str) -> str:
    """EDF's ``[USER@][REGISTRY#]IMAGE[:TAG]`` is enroot's own syntax after ``docker://``; a
    registry written Docker's way (``nvcr.io/nvidia/pytorch``) gets its ``#``."""
    return "docker://" + enroot_reference(ref)


class Enroot(Runtime):
    name = "enroot"
    executable = "enroot"
    refuses = {"dir": "enroot runs a SquashFS image or a registry reference, not a directory: {image}"}

    def argv(self, plan: Plan, command: list[str]) -> list[str]:
        env, notes = plan.env, plan.notes
        image = env.image
        if plan.kind == "ref":
            image = os.path.join(image_store(plan.environ), re.sub(r"[^A-Za-z0-9_.-]+", "+", env.image) + ".sqsh")
            plan.prepare.insert(0, ["sh", "-c",
                                    'test -e "$1" || { mkdir -p "$(dirname "$1")" && enroot import -o "$1" "$2"; }',
                                    "sh", image, docker_uri(env.image)])
        argv = ["enroot", "start"]
        if env.writable:
            argv.append("--rw")
        for m in plan.mounts:
            opts = "x-create=auto,rbind" + (",ro" if m.readonly else "")
            extra = [f for f in m.flags if f not in ("ro", "rw")]
            if extra:
                notes.append(f"mount {m.target}: flags {'+'.join(extra)} not passed to enroot")
            argv += ["--mount", f"{m.source}:{m.target}:none:{opts}"]
        for key, value in plan.variables.items():
            if value is not None:
                argv += ["-e", f"{key}={value}"]
        if env.devices:
            notes.append("devices ignored: enroot shows the host's /dev (ENROOT_RESTRICT_DEV restricts it)")
        unset = [k for k, v in plan.variables.items() if v is None]
        notes += entrypoint_note(env, "enroot start with a command") + annotations_note(env, "enroot")
        return argv + [*env.options.get(self.name, []), image,
                       *wrap_command(env, command, workdir=env.workdir, unset=unset, exports=plan.exports)]
