"""charliecloud: ``ch-run`` on a root filesystem directory or a SquashFS file. ch-run
cannot create bind destinations (they must exist in the image, as must /sys,
/etc/passwd and /etc/group) and has no read-only bind; the container inherits the
caller's environment."""

from __future__ import annotations

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


class Charliecloud(Runtime):
    name = "charliecloud"
    executable = "ch-run"

    def render(self, env: Environment, command: list[str], *, environ: Mapping[str, str] | None = None,
               scratch: str | None = None) -> Launch:
        kind = image_kind(env.image)
        if kind == "ref":
            raise UsageError(f"charliecloud runs a directory or a SquashFS file; pull {env.image!r} with "
                             "ch-image first", key="image")
        mounts, prepare, cleanup = squashfs_mounts(env, scratch_dir(env, scratch))
        notes: list[str] = []
        argv = ["ch-run"]
        if env.writable:
            if kind == "dir":
                argv.append("--write")
                notes.append("writable root filesystem directory: changes are made to the directory itself "
                             "and persist")
            else:
                notes.append("writable ignored: ch-run mounts a SquashFS image read-only")
        for m in mounts:
            argv.append(f"--bind={m.source}:{m.target}")
        ro = [m.target for m in mounts if m.readonly]
        if ro:
            notes.append(f"read-only mounts are writable under ch-run (no ro bind): {', '.join(ro)}")
        if mounts:
            notes.append("mount targets must already exist in the image")
        if env.workdir:
            argv.append(f"--cd={env.workdir}")
        variables = container_env(env)
        if any(v is not None for v in variables.values()):
            argv.append("--env-no-expand")        # values are final: the EDF was expanded already
        for key, value in variables.items():
            argv.append(f"--unset-env={key}" if value is None else f"--set-env={key}={value}")
        if env.devices:
            notes.append("devices ignored: ch-run shows the host's /dev")
        argv += [*env.options.get(self.name, []), env.image, "--", *wrap_command(env, command)]
        notes += entrypoint_note(env, "charliecloud") + annotations_note(env, "charliecloud")
        return Launch(self.name, argv, prepare=prepare, cleanup=cleanup, notes=notes)
