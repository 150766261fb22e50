"""charliecloud: ``ch-run`` on a root filesystem directory or a SquashFS file. ch-run
cannot create bind destinations (they must exist in the image, as must /sys,
/etc/passwd and /etc/group) and has no read-only bind; the container inherits the
caller's environment."""

from __future__ import annotations

from hpcml.env.runtimes.base import Plan, Runtime, annotations_note, entrypoint_note, wrap_command


class Charliecloud(Runtime):
    name = "charliecloud"
    executable = "ch-run"
    refuses = {"ref": "charliecloud runs a directory or a SquashFS file; pull {image} with ch-image first"}

    def argv(self, plan: Plan, command: list[str]) -> list[str]:
        env, notes = plan.env, plan.notes
        argv = ["ch-run"]
        if env.writable:
            if plan.kind == "dir":
                argv.append("--write")
                notes.append("writable root filesystem directory: changes are made to the directory itself "
                             "and persist")
            else:
                notes.append("writable ignored: ch-run mounts a SquashFS image read-only")
        for m in plan.mounts:
            argv.append(f"--bind={m.source}:{m.target}")
        ro = [m.target for m in plan.mounts if m.readonly]
        if ro:
            notes.append(f"read-only mounts are writable under ch-run (no ro bind): {', '.join(ro)}")
        if plan.mounts:
            notes.append("mount targets must already exist in the image")
        if env.workdir:
            argv.append(f"--cd={env.workdir}")
        if any(v is not None for v in plan.variables.values()):
            argv.append("--env-no-expand")        # values are final: the EDF was expanded already
        for key, value in plan.variables.items():
            argv.append(f"--unset-env={key}" if value is None else f"--set-env={key}={value}")
        if env.devices:
            notes.append("devices ignored: ch-run shows the host's /dev")
        notes += entrypoint_note(env, "charliecloud") + annotations_note(env, "charliecloud")
        return argv + [*env.options.get(self.name, []), env.image, "--",
                       *wrap_command(env, command, exports=plan.exports)]
