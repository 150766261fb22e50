"""What every runtime module shares: the rendered launch, the runtime interface, and the
pieces that are the same for all of them (hpcml's venv/startup wrapper, image kinds,
SquashFS data mounts through squashfuse).

Runtimes differ in what they can express natively (podman has ``-w``, enroot has no
working-directory option; bwrap can unset a variable, pyxis cannot). What a runtime
cannot express goes into one ``/bin/sh -c`` wrapper inside the container, so the
behaviour is the same everywhere; what cannot be papered over goes into ``Launch.notes``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from hpcml.env.model import Environment, Mount, image_problem
from hpcml.errors import UsageError
from hpcml.schemas import tag

SQUASHFS_SUFFIXES = (".sqsh", ".sqfs", ".squashfs")


@dataclass
class Launch:
    """The exact launch: run ``prepare`` in order, exec ``argv`` with ``environ`` applied
    to the caller's environment (None removes a variable), then run ``cleanup``."""

    runtime: str
    argv: list[str]
    environ: dict[str, str | None] = field(default_factory=dict)
    prepare: list[list[str]] = field(default_factory=list)
    cleanup: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """As shell lines a person could paste: prepare, exports, the launch, cleanup. Every
        word is quoted, names too: pasting runs only what the launch says."""
        out = [shlex.join(cmd) for cmd in self.prepare]
        for key, value in self.environ.items():
            name = shlex.quote(key)
            out.append(f"unset {name}" if value is None else f"export {name}={shlex.quote(value)}")
        out.append(shlex.join(self.argv))
        out += [shlex.join(cmd) for cmd in self.cleanup]
        return out

    def to_json(self) -> dict:
        return {"schema": tag("env.launch", 1), "runtime": self.runtime, "argv": self.argv, "environ": self.environ,
                "prepare": self.prepare, "cleanup": self.cleanup, "notes": self.notes}


@dataclass
class Plan:
    """What every launch works out before a runtime writes its own argv: the image kind,
    the per-process scratch directory, the mounts (EDF ``sqsh`` data mounts already
    squashfused when the runtime cannot mount them), the variables to set in the container,
    and the prepare/cleanup commands and notes a runtime adds to."""

    env: Environment
    kind: str
    scratch: str
    environ: Mapping[str, str]
    mounts: list[Mount]
    variables: dict[str, str | None]
    prepare: list[list[str]] = field(default_factory=list)
    cleanup: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    launch_environ: dict[str, str | None] = field(default_factory=dict)
    exports: list[str] = field(default_factory=list)    # for wrap_command: [env] set in the container


class Runtime:
    """One container runtime. Subclasses set ``name``, ``executable`` and ``refuses`` (image
    kind → why, ``{image}`` substituted) and write their argv in ``argv``; ``render`` is the
    template every built-in shares. Rendering has no side effects, so it works where the
    runtime is absent. A plug-in may override ``render`` whole."""

    name = ""
    executable = ""
    refuses: Mapping[str, str] = {}
    squashfuse_mounts = True    # False: the runtime mounts EDF sqsh files itself (pyxis)
    inherits_host_env = True    # False: the container sees only the image's variables (podman)

    def available(self) -> bool:
        return shutil.which(self.executable) is not None

    def render(self, env: Environment, command: list[str], *, environ: Mapping[str, str] | None = None,
               scratch: str | None = None) -> Launch:
        problem = image_problem(env.image)
        if problem:
            raise UsageError(problem, file=env.origin.get("image"), key="image")
        kind = image_kind(env.image)
        if kind in self.refuses:
            raise UsageError(self.refuses[kind].format(image=repr(env.image)), key="image")
        where = scratch_dir(env, scratch)
        mounts, prepare, cleanup = squashfs_mounts(env, where) if self.squashfuse_mounts else (list(env.mounts), [], [])
        plan = Plan(env, kind, where, os.environ if environ is None else environ, mounts, container_env(env),
                    prepare, cleanup)
        if env.env_template:
            plan.exports = export_lines(env, plan.variables, plan.environ, host_fallback=not self.inherits_host_env)
            plan.variables = {}
        argv = self.argv(plan, command)
        return Launch(self.name, argv, environ=plan.launch_environ, prepare=plan.prepare, cleanup=plan.cleanup,
                      notes=plan.notes)

    def argv(self, plan: Plan, command: list[str]) -> list[str]:
        """The runtime's own command line; add to ``plan``'s prepare, cleanup and notes."""
        raise NotImplementedError


def image_kind(image: str) -> str:
    """``squashfs`` (a .sqsh/.sqfs file), ``dir`` (a path: a root filesystem directory) or
    ``ref`` (a registry reference). Decided from the name, so that rendering does not need
    the image to exist."""
    if image.endswith(SQUASHFS_SUFFIXES):
        return "squashfs"
    if image.startswith(("/", "./", "../", "~")):
        return "dir"
    return "ref"


def scratch_dir(env: Environment, scratch: str | None) -> str:
    """Where a launch keeps its mount points: per process, so that each Slurm task of
    ``srun hpcml env run`` has its own."""
    if scratch:
        return scratch
    tag = hashlib.sha1(env.image.encode()).hexdigest()[:8]
    return os.path.join(tempfile.gettempdir(), f"hpcml-env-{os.getpid()}-{tag}")


def container_env(env: Environment) -> dict[str, str | None]:
    """The variables to set (None: unset) in the container: [env], plus
    ``PYTHONNOUSERSITE=1`` unless ``com.hpcml.user_site`` is true, because ~/.local
    packages shadowing the image's is the most common venv-in-container breakage."""
    out = dict(env.env)
    if not env.user_site:
        out.setdefault("PYTHONNOUSERSITE", "1")
    return out


def wrap_command(env: Environment, command: list[str], *, workdir: str | None = None,
                 unset: list[str] | tuple[str, ...] = (), exports: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The command, wrapped in ``/bin/sh -c`` when something must happen inside the
    container first: set ``[env]`` (``Plan.exports``), unset variables and change directory
    (for runtimes that cannot), run the ``com.hpcml.startup`` lines, activate
    ``com.hpcml.venv``. Unchanged otherwise."""
    steps: list[str] = list(exports)
    if unset:
        steps.append("unset " + " ".join(shlex.quote(n) for n in unset))
    if workdir:                             # "-x" would be cd's option, "-" its previous directory
        steps.append(f"cd {shlex.quote(workdir if workdir.startswith('/') else './' + workdir)}")
    steps += env.startup
    if env.venv:
        steps.append(f". {shlex.quote(env.venv.rstrip('/') + '/bin/activate')}")
    if not steps:
        return list(command)
    script = "set -e\n" + "\n".join(steps) + '\nexec "$@"'
    return ["/bin/sh", "-c", script, "sh", *command]


def export_lines(env: Environment, variables: Mapping[str, str | None], host: Mapping[str, str], *,
                 host_fallback: bool) -> list[str]:
    """Shell lines that set ``variables`` inside the container, for an EDF whose ``[env]``
    references variables: only there is the environment CSCS resolves them against (the
    image's over the host's), so the runtime sets none of them and ``wrap_command`` runs
    these first. Every value is computed before any is exported, since ``[env]`` entries
    cannot see each other. ``host_fallback`` (a runtime that passes no host variables)
    first gives each referenced variable the image lacks its host value, as a shell
    variable that does not reach the command."""
    from hpcml.env.expand import references, to_shell
    lines: list[str] = []
    if host_fallback:
        referenced = dict.fromkeys(n for raw in env.env_template.values() for n in references(raw))
        lines += [f'[ -n "${{{n}+x}}" ] || {n}={shlex.quote(host[n])}' for n in referenced if n in host]
    sets: list[str] = []
    for i, (name, value) in enumerate(variables.items()):
        if value is None:
            sets.append(f"unset {shlex.quote(name)}")
            continue
        if name in env.env_template:
            lines.append(to_shell(env.env_template[name], f"_hpcml_env{i}"))
        else:
            lines.append(f"_hpcml_env{i}={shlex.quote(value)}")
        sets.append(f'export {shlex.quote(name)}="$_hpcml_env{i}"; unset _hpcml_env{i}')
    return lines + sets


def squashfs_mounts(env: Environment, scratch: str) -> tuple[list[Mount], list[list[str]], list[list[str]]]:
    """EDF ``sqsh`` mounts for runtimes without them: squashfuse each file under
    ``scratch`` and bind that directory read-only instead. Returns (mounts, prepare, cleanup)."""
    mounts: list[Mount] = []
    prepare: list[list[str]] = []
    cleanup: list[list[str]] = []
    for i, m in enumerate(env.mounts):
        if not m.squashfs:
            mounts.append(m)
            continue
        point = os.path.join(scratch, f"mount{i}")
        prepare += [["mkdir", "-p", point], ["squashfuse", m.source, point]]
        cleanup.insert(0, ["fusermount", "-u", point])
        mounts.append(Mount(point, m.target, ("ro",)))
    if prepare:
        cleanup.append(["rm", "-rf", scratch])
    return mounts, prepare, cleanup


def entrypoint_note(env: Environment, runtime: str) -> list[str]:
    return [f"entrypoint = true ignored: {runtime} does not run the image's ENTRYPOINT"] if env.entrypoint else []


def annotations_note(env: Environment, runtime: str) -> list[str]:
    """Annotations nothing acts on: hpcml's own and the hooks (applied from the site file
    by ``hpcml.env.hooks``) are not among them."""
    other = sorted(k for k in env.annotations if not k.startswith(("com.hpcml.", "com.hooks.")))
    return [f"annotations ignored by {runtime} (no OCI hooks): {', '.join(other)}"] if other else []


def registry_of(ref: str) -> str | None:
    """The registry of a slash-form reference (``nvcr.io/nvidia/pytorch:25.01-py3``,
    ``host:5000/ns/img:tag``), as Docker decides it: a first component with a ``.`` or a
    ``:`` (a port), or ``localhost``; None for a Docker Hub name or an EDF ``#`` form."""
    if "#" in ref or "/" not in ref:
        return None
    first = ref.split("/", 1)[0].rsplit("@", 1)[-1]
    return first if ("." in first or ":" in first or first == "localhost") else None


def enroot_reference(ref: str) -> str:
    """A reference in enroot's (and pyxis's) syntax ``[USER@][REGISTRY#]IMAGE[:TAG]``: CSCS
    EDFs also write the registry Docker's way (``ghcr.io/org/img:tag``), which enroot would
    look up on Docker Hub, so the first ``/`` after a registry becomes ``#``."""
    registry = registry_of(ref)
    if registry is None:
        return ref
    head, _, image = ref.partition("/")
    return f"{head}#{image}"


def oci_reference(ref: str) -> str:
    """EDF's ``[USER@][REGISTRY#]IMAGE[:TAG]`` as an OCI reference (``REGISTRY/IMAGE[:TAG]``,
    Docker Hub when no registry, as in EDF); the user is dropped (credentials live elsewhere)."""
    if "#" in ref:
        registry, image = ref.split("#", 1)
        return registry.rsplit("@", 1)[-1] + "/" + image
    if registry_of(ref) is not None:
        return ref
    return "docker.io/" + ref
