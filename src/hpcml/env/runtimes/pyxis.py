"""pyxis: ``srun --container-*``; launches a Slurm step, so use it from a batch script,
not inside ``srun``. ``[env]`` values are exported in srun's environment and named in
``--container-env``, which makes them win over the image's, as in EDF; variables to
unset are dropped from srun's environment and unset by the in-container wrapper. The
image goes in enroot's syntax (``REGISTRY#IMAGE``), which pyxis passes to enroot. pyxis
splits ``--container-mounts`` at ``,``, so a mount with a ``,`` in it is refused, and it writes
each mount into a script bash sources for enroot, so one with ``$``, a backquote or ``"``
is refused too (``enroot.mount_path_problem``)."""

from __future__ import annotations

from hpcml.env.runtimes.base import Plan, Runtime, annotations_note, enroot_reference, wrap_command
from hpcml.env.runtimes.enroot import refuse_mount_paths
from hpcml.errors import UsageError


class Pyxis(Runtime):
    name = "pyxis"
    executable = "srun"
    refuses = {"dir": "pyxis runs a registry reference or a SquashFS image, not a directory: {image}"}
    squashfuse_mounts = False

    def available(self) -> bool:
        from hpcml.env.runtimes import pyxis_srun
        return pyxis_srun()

    def argv(self, plan: Plan, command: list[str]) -> list[str]:
        env, notes = plan.env, plan.notes
        image = enroot_reference(env.image) if plan.kind == "ref" else env.image
        argv = ["srun", f"--container-image={image}"]
        refuse_mount_paths(env, in_shell=True)
        for i, m in enumerate(env.mounts):
            if "," in m.spec():
                raise UsageError(f"{m.spec()!r} has a ',': pyxis splits --container-mounts at ',', "
                                 "so it would be two mounts", file=env.origin.get(f"mounts[{i}]"),
                                 key=f"mounts[{i}]")
        if env.mounts:
            argv.append("--container-mounts=" + ",".join(m.spec() for m in env.mounts))
            if any(m.squashfs for m in env.mounts):
                notes.append("sqsh mounts need CSCS's pyxis; upstream pyxis rejects them")
        if env.workdir:
            argv.append(f"--container-workdir={env.workdir}")
        argv.append("--container-writable" if env.writable else "--container-readonly")
        argv.append("--container-entrypoint" if env.entrypoint else "--no-container-entrypoint")
        exported = {k: v for k, v in plan.variables.items() if v is not None}
        if exported:
            argv.append("--container-env=" + ",".join(exported))
        if env.devices:
            notes.append("devices ignored: enroot shows the host's /dev (ENROOT_RESTRICT_DEV restricts it)")
        unset = [k for k, v in plan.variables.items() if v is None]
        plan.launch_environ = dict(plan.variables)
        notes += annotations_note(env, "pyxis")
        return argv + [*env.options.get(self.name, []),
                       *wrap_command(env, command, unset=unset, exports=plan.exports)]
