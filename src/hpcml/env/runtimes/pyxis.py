"""pyxis: ``srun --container-*``; launches a Slurm step, so use it from a batch script,
not inside ``srun``. ``[env]`` values are exported in srun's environment and named in
``--container-env``, which makes them win over the image's, as in EDF; variables to
unset are dropped from srun's environment and unset by the in-container wrapper."""

from __future__ import annotations

from collections.abc import Mapping

from hpcml.env.model import Environment
from hpcml.env.runtimes.base import Launch, Runtime, annotations_note, container_env, image_kind, wrap_command
from hpcml.errors import UsageError


class Pyxis(Runtime):
    name = "pyxis"
    executable = "srun"

    def available(self) -> bool:
        from hpcml.env.runtimes import pyxis_srun
        return pyxis_srun()

    def render(self, env: Environment, command: list[str], *, environ: Mapping[str, str] | None = None,
               scratch: str | None = None) -> Launch:
        if image_kind(env.image) == "dir":
            raise UsageError(f"pyxis runs a registry reference or a SquashFS image, not a directory: "
                             f"{env.image!r}", key="image")
        notes: list[str] = []
        argv = ["srun", f"--container-image={env.image}"]
        if env.mounts:
            argv.append("--container-mounts=" + ",".join(m.spec() for m in env.mounts))
            if any(m.squashfs for m in env.mounts):
                notes.append("sqsh mounts need CSCS's pyxis; upstream pyxis rejects them")
        if env.workdir:
            argv.append(f"--container-workdir={env.workdir}")
        argv.append("--container-writable" if env.writable else "--container-readonly")
        argv.append("--container-entrypoint" if env.entrypoint else "--no-container-entrypoint")
        variables = container_env(env)
        exported = {k: v for k, v in variables.items() if v is not None}
        if exported:
            argv.append("--container-env=" + ",".join(exported))
        if env.devices:
            notes.append("devices ignored: enroot shows the host's /dev (ENROOT_RESTRICT_DEV restricts it)")
        unset = [k for k, v in variables.items() if v is None]
        argv += [*env.options.get(self.name, []), *wrap_command(env, command, unset=unset)]
        notes += annotations_note(env, "pyxis")
        return Launch(self.name, argv, environ=dict(variables), notes=notes)
