"""podman: registry references and root filesystem directories (``--rootfs``).

Host environment: EDF containers inherit the host's variables with the image's winning,
but podman passes none, and ``--env-host`` lets the host win over the image (it replaces
the image's PATH). So hpcml forwards only the variables a task needs, by name
(``-e NAME`` takes the value from the host): Slurm's, the launcher's rank variables and
GPU selection. ``[env]`` is passed with ``-e K=V`` and wins over the image, as in EDF.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcml.env.runtimes.base import Plan, Runtime, oci_reference, wrap_command

FORWARD_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_", "OMPI_")
FORWARD_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                 "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MOUNT_OPTIONS = {"ro", "rw", "private", "rprivate", "shared", "rshared", "slave", "rslave", "unbindable",
                 "runbindable", "bind", "rbind", "nosuid", "suid", "nodev", "dev", "noexec", "exec", "z", "Z"}


def forwarded(environ: Mapping[str, str]) -> list[str]:
    """Host variables a Slurm task's container needs, sorted."""
    return sorted(k for k in environ if k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES)


class Podman(Runtime):
    name = "podman"
    executable = "podman"
    inherits_host_env = False

    refuses = {"squashfs": "podman cannot run a SquashFS image ({image}); use enroot, charliecloud or bubblewrap"}

    def argv(self, plan: Plan, command: list[str]) -> list[str]:
        env, notes = plan.env, plan.notes
        argv = ["podman", "run", "--rm", "--network", "host"]
        if not env.writable:
            argv.append("--read-only")
        for m in plan.mounts:
            opts = [f for f in m.flags if f in MOUNT_OPTIONS]
            dropped = [f for f in m.flags if f not in MOUNT_OPTIONS]
            if dropped:
                notes.append(f"mount {m.target}: flags {'+'.join(dropped)} have no podman equivalent")
            argv += ["-v", f"{m.source}:{m.target}" + (":" + ",".join(opts) if opts else "")]
        if env.workdir:
            argv += ["-w", env.workdir]
        for key in forwarded(plan.environ):
            if key not in plan.variables:
                argv += ["-e", key]
        for key, value in plan.variables.items():
            argv += ["--unsetenv", key] if value is None else ["-e", f"{key}={value}"]
        for dev in env.devices:
            argv += ["--device", dev]
        for key, value in env.annotations.items():
            if not key.startswith("com.hpcml."):
                argv += ["--annotation", f"{key}={value}"]
        if not env.entrypoint:
            argv += ["--entrypoint", ""]
        argv += env.options.get(self.name, [])
        argv += ["--rootfs", env.image] if plan.kind == "dir" else [oci_reference(env.image)]
        if plan.kind == "dir" and env.writable:
            notes.append("writable root filesystem directory: changes are made to the directory itself and persist")
        return argv + wrap_command(env, command, exports=plan.exports)
