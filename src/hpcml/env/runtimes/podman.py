"""podman: registry references and root filesystem directories (``--rootfs``).

Host environment: EDF containers inherit the host's variables with the image's winning,
but podman passes none, and ``--env-host`` lets the host win over the image (it replaces
the image's PATH). So hpcml forwards only the variables a task needs, by name
(``-e NAME`` takes the value from the host): Slurm's, the launcher's rank variables and
GPU selection. ``[env]`` is passed with ``-e K=V`` and wins over the image, as in EDF.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hpcml.env.model import Environment
from hpcml.env.runtimes.base import Launch, Runtime, container_env, image_kind, oci_reference, scratch_dir, squashfs_mounts, wrap_command
from hpcml.errors import UsageError

FORWARD_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_", "OMPI_")
FORWARD_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                 "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MOUNT_OPTIONS = {"ro", "rw", "private", "rprivate", "shared", "rshared", "slave", "rslave", "z", "Z"}


def forwarded(environ: Mapping[str, str]) -> list[str]:
    """Host variables a Slurm task's container needs, sorted."""
    return sorted(k for k in environ if k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES)


class Podman(Runtime):
    name = "podman"
    executable = "podman"

    def render(self, env: Environment, command: list[str], *, environ: Mapping[str, str] | None = None,
               scratch: str | None = None) -> Launch:
        environ = os.environ if environ is None else environ
        kind = image_kind(env.image)
        if kind == "squashfs":
            raise UsageError(f"podman cannot run a SquashFS image ({env.image}); use enroot, charliecloud "
                             "or bubblewrap", key="image")
        mounts, prepare, cleanup = squashfs_mounts(env, scratch_dir(env, scratch))
        notes: list[str] = []
        argv = ["podman", "run", "--rm", "--network", "host"]
        if not env.writable:
            argv.append("--read-only")
        for m in mounts:
            opts = [f for f in m.flags if f in MOUNT_OPTIONS]
            dropped = [f for f in m.flags if f not in MOUNT_OPTIONS]
            if dropped:
                notes.append(f"mount {m.target}: flags {'+'.join(dropped)} have no podman equivalent")
            argv += ["-v", f"{m.source}:{m.target}" + (":" + ",".join(opts) if opts else "")]
        if env.workdir:
            argv += ["-w", env.workdir]
        variables = container_env(env)
        for key in forwarded(environ):
            if key not in variables:
                argv += ["-e", key]
        for key, value in variables.items():
            argv += ["--unsetenv", key] if value is None else ["-e", f"{key}={value}"]
        for dev in env.devices:
            argv += ["--device", dev]
        for key, value in env.annotations.items():
            if not key.startswith("com.hpcml."):
                argv += ["--annotation", f"{key}={value}"]
        if not env.entrypoint:
            argv += ["--entrypoint", ""]
        argv += env.options.get(self.name, [])
        argv += ["--rootfs", env.image] if kind == "dir" else [oci_reference(env.image)]
        if kind == "dir" and env.writable:
            notes.append("writable root filesystem directory: changes are made to the directory itself and persist")
        argv += wrap_command(env, command)
        return Launch(self.name, argv, prepare=prepare, cleanup=cleanup, notes=notes)
