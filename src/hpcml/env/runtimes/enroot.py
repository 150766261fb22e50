"""enroot (standalone): a SquashFS image, or a registry reference imported first into
the EDF image store (``EDF_IMAGESTORE``, else ``$SCRATCH/.edf_imagestore``, else
``~/.edf_imagestore``). Mounts use fstab fields, not Docker's ``:ro``; enroot has no
working-directory or unset option, so those go into the in-container wrapper. The
container inherits the caller's environment. enroot reads ``-e`` and ``--mount`` values
line by line, so one with a newline is refused (``one_line``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from hpcml.env.model import Environment
from hpcml.env.runtimes.base import Plan, Runtime, annotations_note, enroot_reference, entrypoint_note, wrap_command
from hpcml.errors import UsageError


def image_store(environ: Mapping[str, str]) -> str:
    if environ.get("EDF_IMAGESTORE"):
        return environ["EDF_IMAGESTORE"]
    base = environ.get("SCRATCH") or os.path.expanduser("~")
    return os.path.join(base, ".edf_imagestore")


def docker_uri(ref: str) -> str:
    """EDF's ``[USER@][REGISTRY#]IMAGE[:TAG]`` is enroot's own syntax after ``docker://``; a
    registry written Docker's way (``nvcr.io/nvidia/pytorch``) gets its ``#``."""
    return "docker://" + enroot_reference(ref)


def one_line(env: Environment, variables: Mapping[str, str | None]) -> None:
    """enroot joins its ``-e`` and ``--mount`` values with newlines and reads them back line
    by line, so a newline in one (``x\\nLD_PRELOAD=/tmp/evil.so``) would set another variable
    or add another mount: refused, naming the key (a NUL cannot be passed at all)."""
    values = [(f"env.{k}", v) for k, v in variables.items() if v is not None]
    values += [(f"mounts[{i}]", m.spec()) for i, m in enumerate(env.mounts)]
    for key, value in values:
        if "\n" in value or "\0" in value:
            what = "a newline" if "\n" in value else "a NUL character"
            raise UsageError(f"{what} in the value: enroot reads its -e and --mount values line by line, "
                             "so the rest would be another setting", file=env.origin.get(key), key=key)


def fstab_field(path: str) -> str:
    """``path`` as one field of an fstab line: enroot turns a ``--mount`` value's ``:`` into
    spaces and reads the line with ``getmntent``, which splits fields at blanks and decodes
    ``\\040``, ``\\011``, ``\\012`` and ``\\134``; escaped as pyxis escapes what it hands
    enroot (``fstab_escape``), so ``/data/my set`` is one source, not a source ``/data/my``
    mounted at ``set``."""
    return (path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
            .replace("\n", "\\012"))


#: what pyxis's rc script (``echo "SRC DST FLAGS"``, sourced by bash) would expand in a path
SHELL_SPECIAL = ('$', '`', '"')


def mount_path_problem(path: str, *, in_shell: bool = False) -> str | None:
    """Why enroot would not mount ``path`` as written, or None. enroot refuses an fstab field
    that holds whitespace other than what ``fstab_field`` escapes (its ``[^[:space:]]``
    check: a carriage return, a form feed, U+3000); pyxis (``in_shell``) writes each mount
    into a script bash sources, where ``$``, a backquote or ``"`` would be expanded or end
    the string (``/a$HOME`` mounted ``/a/root``; a backquote ran a command)."""
    for ch in path:
        if ch.isspace() and ch not in " \t\n":
            return (f"{ascii(ch)} in {ascii(path)}: enroot refuses a mount whose paths hold whitespace "
                    "other than a space or a tab")
        if in_shell and ch in SHELL_SPECIAL:
            return (f"{ch!r} in {ascii(path)}: pyxis writes each mount into a shell script for enroot, "
                    "where it would be expanded")
    return None


def refuse_mount_paths(env: Environment, *, in_shell: bool = False) -> None:
    """Every mount's source and target through ``mount_path_problem``, refused in one line
    naming its key."""
    for i, m in enumerate(env.mounts):
        for path in (m.source, m.target):
            if problem := mount_path_problem(path, in_shell=in_shell):
                raise UsageError(problem, file=env.origin.get(f"mounts[{i}]"), key=f"mounts[{i}]")


class Enroot(Runtime):
    name = "enroot"
    executable = "enroot"
    refuses = {"dir": "enroot runs a SquashFS image or a registry reference, not a directory: {image}"}

    def argv(self, plan: Plan, command: list[str]) -> list[str]:
        env, notes = plan.env, plan.notes
        one_line(env, plan.variables)
        refuse_mount_paths(env)
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
            argv += ["--mount", f"{fstab_field(m.source)}:{fstab_field(m.target)}:none:{opts}"]
        for key, value in plan.variables.items():
            if value is not None:
                argv += ["-e", f"{key}={value}"]
        if env.devices:
            notes.append("devices ignored: enroot shows the host's /dev (ENROOT_RESTRICT_DEV restricts it)")
        unset = [k for k, v in plan.variables.items() if v is None]
        notes += entrypoint_note(env, "enroot start with a command") + annotations_note(env, "enroot")
        return argv + [*env.options.get(self.name, []), image,
                       *wrap_command(env, command, workdir=env.workdir, unset=unset, exports=plan.exports)]
