"""bubblewrap: a root filesystem directory, or a SquashFS image mounted with squashfuse
(plus fuse-overlayfs when writable). The lightest runtime; it inherits the caller's
environment, which is the EDF's semantics for host variables."""

from __future__ import annotations

import os
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


class Bubblewrap(Runtime):
    name = "bubblewrap"
    executable = "bwrap"

    def render(self, env: Environment, command: list[str], *, environ: Mapping[str, str] | None = None,
               scratch: str | None = None) -> Launch:
        kind = image_kind(env.image)
        if kind == "ref":
            raise UsageError(f"bubblewrap runs a root filesystem directory or a SquashFS file, "
                             f"not a registry reference: {env.image!r}", key="image")
        scratch = scratch_dir(env, scratch)
        mounts, prepare, cleanup = squashfs_mounts(env, scratch)
        notes: list[str] = []
        root = env.image
        if kind == "squashfs":
            lower = os.path.join(scratch, "image")
            prepare += [["mkdir", "-p", lower], ["squashfuse", env.image, lower]]
            root, unmount = lower, [["fusermount", "-u", lower]]
            if env.writable:
                upper, work, root = (os.path.join(scratch, d) for d in ("upper", "work", "root"))
                prepare += [["mkdir", "-p", upper, work, root],
                            ["fuse-overlayfs", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", root]]
                unmount.insert(0, ["fusermount", "-u", root])
                notes.append("writable SquashFS image: changes go to a fuse-overlayfs layer that is "
                             "discarded at exit")
            cleanup = unmount + cleanup
            if not any(c[0] == "rm" for c in cleanup):
                cleanup.append(["rm", "-rf", scratch])
        elif env.writable:
            notes.append("writable root filesystem directory: changes are made to the directory itself "
                         "and persist")
        argv = ["bwrap", "--bind" if env.writable else "--ro-bind", root, "/",
                "--proc", "/proc", "--dev", "/dev"]
        if not env.writable:
            argv += ["--tmpfs", "/tmp"]
            if mounts:
                notes.append("read-only root: mount targets must already exist in the image")
        for m in mounts:
            argv += ["--ro-bind" if m.readonly else "--bind", m.source, m.target]
        for dev in env.devices:
            if dev.startswith("/dev/"):
                argv += ["--dev-bind", dev, dev]
            else:
                notes.append(f"device {dev!r} ignored: bubblewrap binds device paths, not CDI names")
        if env.workdir:
            argv += ["--chdir", env.workdir]
        for key, value in container_env(env).items():
            argv += ["--unsetenv", key] if value is None else ["--setenv", key, value]
        argv += ["--die-with-parent", "--unshare-pid", *env.options.get(self.name, [])]
        argv += wrap_command(env, command)
        notes += entrypoint_note(env, "bubblewrap") + annotations_note(env, "bubblewrap")
        return Launch(self.name, argv, prepare=prepare, cleanup=cleanup, notes=notes)
