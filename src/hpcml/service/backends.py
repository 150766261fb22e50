"""How a blueprint's command becomes a process on this machine: in the service's own venv
(``python.packages``) or in a container through ``hpcml env``'s runtimes (``image``).

A site adds a backend through the entry-point group ``hpcml.service_backends`` (an object
with ``name``, ``usable(bp)``, ``prepare(bp, log)`` and ``launch(bp, expanded, mounts)``; an
instance, not a class).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpcml.errors import UsageError
from hpcml.registry import Registry
from hpcml.service.blueprint import Blueprint
from hpcml.service.placeholders import Expanded


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)     # added to the caller's environment


class Backend(Protocol):
    name: str

    def usable(self, bp: Blueprint) -> bool: ...
    def prepare(self, bp: Blueprint, log: Path) -> None: ...
    def launch(self, bp: Blueprint, ex: Expanded, mounts: dict[str, str]) -> Launch: ...


class ProcessBackend:
    """The command from the service's cached venv (``hpcml.service.envs``)."""

    name = "process"

    def usable(self, bp: Blueprint) -> bool:
        return bp.python is not None

    def prepare(self, bp: Blueprint, log: Path) -> None:
        from hpcml.service.envs import ensure_env
        assert bp.python is not None
        if not bp.python.own:
            ensure_env(bp.name, bp.python.packages, log=log)

    def launch(self, bp: Blueprint, ex: Expanded, mounts: dict[str, str]) -> Launch:
        from hpcml.service.envs import env_path
        assert bp.python is not None
        # own: one of hpcml's commands, by this interpreter (`python -m hpcml`: never another
        # hpcml found on PATH), from the environment hpcml itself runs in
        bin_dir = Path(sys.executable).parent if bp.python.own else env_path(bp.name, bp.python.packages) / "bin"
        exe = bin_dir / ex.command[0]
        if bp.python.own and ex.command[0] == "hpcml":
            argv = [sys.executable, "-m", "hpcml", *ex.command[1:]]
        else:
            argv = [str(exe) if exe.exists() else ex.command[0], *ex.command[1:]]
        return Launch(argv, {**ex.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                             "VIRTUAL_ENV": str(bin_dir.parent)})


class ContainerBackend:
    """The blueprint's image through ``hpcml env``'s runtimes (podman runs with the host's
    network, bubblewrap shares it): volumes and files are bind-mounted at their paths."""

    name = "container"

    def usable(self, bp: Blueprint) -> bool:
        return bp.image is not None

    def prepare(self, bp: Blueprint, log: Path) -> None:
        return None

    def launch(self, bp: Blueprint, ex: Expanded, mounts: dict[str, str]) -> Launch:
        from hpcml.env.model import Environment, Mount
        from hpcml.env.run import render
        assert bp.image is not None
        env = Environment(image=bp.image, mounts=[Mount(src, dst) for src, dst in mounts.items()],
                          env=dict(ex.env))
        launch = render(env, ex.command)
        if launch.prepare:
            raise UsageError(f"runtime {launch.runtime} needs preparing steps for this image; "
                             "run it once with hpcml env run first", key="image")
        return Launch(launch.argv, {k: v for k, v in launch.environ.items() if v is not None})


BACKENDS: Registry[Backend] = Registry("service backend", "hpcml.service_backends",
                                       {"process": "hpcml.service.backends:PROCESS",
                                        "container": "hpcml.service.backends:CONTAINER"})
#: what ``auto`` tries, in order
AUTO = ("process", "container")
PROCESS = ProcessBackend()
CONTAINER = ContainerBackend()


def choose(bp: Blueprint, name: str = "auto") -> Backend:
    """A named backend (a site's plug-in too), or for ``auto`` the first usable built-in (a
    venv before a container): a plug-in runs a blueprint only where it is asked for."""
    if name != "auto":
        backend = BACKENDS.get(name)
        if not backend.usable(bp):
            raise UsageError(f"backend '{name}' cannot run this blueprint", file=bp.source or None,
                             key="python" if name == "process" else "image")
        return backend
    for builtin in AUTO:
        backend = BACKENDS.get(builtin)
        if backend.usable(bp):
            return backend
    raise UsageError("no backend can run this blueprint", file=bp.source or None, key="image")
