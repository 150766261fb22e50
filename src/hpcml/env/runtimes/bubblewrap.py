"""bubblewrap: a root filesystem directory, or a SquashFS image mounted with squashfuse
(plus fuse-overlayfs when writable). The lightest runtime; it inherits the caller's
environment, which is the EDF's semantics for host variables."""

from __future__ import annotations

import os

from hpcml.env.runtimes.base import Plan, Runtime, annotations_note, entrypoint_note, wrap_command


class Bubblewrap(Runtime):
    name = "bubblewrap"
    executable = "bwrap"
    refuses = {"ref": "bubblewrap runs a root filesystem directory or a SquashFS file, "
                      "not a registry reference: {image}"}

    def argv(self, plan: Plan, command: list[str]) -> list[str]:
        env = plan.env
        root = env.image
        if plan.kind == "squashfs":
            root = self._mount_image(plan)
        elif env.writable:
            plan.notes.append("writable root filesystem directory: changes are made to the directory itself "
                              "and persist")
        argv = ["bwrap", "--bind" if env.writable else "--ro-bind", root, "/",
                "--proc", "/proc", "--dev", "/dev"]
        if not env.writable:
            argv += ["--tmpfs", "/tmp"]
            if plan.mounts:
                plan.notes.append("read-only root: mount targets must already exist in the image")
        for m in plan.mounts:
            argv += ["--ro-bind" if m.readonly else "--bind", m.source, m.target]
        for dev in env.devices:
            if dev.startswith("/dev/"):
                argv += ["--dev-bind", dev, dev]
            else:
                plan.notes.append(f"device {dev!r} ignored: bubblewrap binds device paths, not CDI names")
        if env.workdir:
            argv += ["--chdir", env.workdir]
        for key, value in plan.variables.items():
            argv += ["--unsetenv", key] if value is None else ["--setenv", key, value]
        argv += ["--die-with-parent", "--unshare-pid", *env.options.get(self.name, [])]
        plan.notes += entrypoint_note(env, "bubblewrap") + annotations_note(env, "bubblewrap")
        return argv + wrap_command(env, command, exports=plan.exports)

    @staticmethod
    def _mount_image(plan: Plan) -> str:
        """squashfuse the image under the scratch directory (with a fuse-overlayfs layer on
        top when writable); returns the root to bind."""
        env, scratch = plan.env, plan.scratch
        lower = os.path.join(scratch, "image")
        plan.prepare += [["mkdir", "-p", lower], ["squashfuse", env.image, lower]]
        root, unmount = lower, [["fusermount", "-u", lower]]
        if env.writable:
            upper, work, root = (os.path.join(scratch, d) for d in ("upper", "work", "root"))
            plan.prepare += [["mkdir", "-p", upper, work, root],
                             ["fuse-overlayfs", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", root]]
            unmount.insert(0, ["fusermount", "-u", root])
            plan.notes.append("writable SquashFS image: changes go to a fuse-overlayfs layer that is "
                              "discarded at exit")
        plan.cleanup = unmount + plan.cleanup
        if not any(c[0] == "rm" for c in plan.cleanup):
            plan.cleanup.append(["rm", "-rf", scratch])
        return root
