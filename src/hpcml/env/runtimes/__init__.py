"""One module per container runtime; ``RUNTIMES`` maps a name to its class, imported when
first used. A site package adds a runtime (a ``Runtime`` subclass) through the
``hpcml.runtimes`` entry-point group; it is chosen by name, never by ``auto``.

``auto`` picks the lightest installed runtime that can run the image's kind:

- a root filesystem directory: bubblewrap, then charliecloud, then podman (``--rootfs``);
- a SquashFS file (.sqsh/.sqfs): enroot, then charliecloud, then bubblewrap (squashfuse);
- a registry reference: pyxis when inside a Slurm allocation but not already inside a
  step and srun has pyxis' ``--container-image``, then podman, then enroot.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping

from hpcml.env.runtimes.base import Launch, Runtime, image_kind
from hpcml.errors import UsageError
from hpcml.registry import Registry, UnknownName

__all__ = ["PREFERENCE", "RUNTIMES", "Launch", "Runtime", "auto", "get", "installed", "pyxis_srun"]

RUNTIMES: Registry[type[Runtime]] = Registry("runtime", "hpcml.runtimes", {
    "bubblewrap": "hpcml.env.runtimes.bubblewrap:Bubblewrap",
    "charliecloud": "hpcml.env.runtimes.charliecloud:Charliecloud",
    "enroot": "hpcml.env.runtimes.enroot:Enroot",
    "podman": "hpcml.env.runtimes.podman:Podman",
    "pyxis": "hpcml.env.runtimes.pyxis:Pyxis",
})
#: the order ``auto`` tries, per image kind (names of RUNTIMES)
PREFERENCE = {
    "dir": ("bubblewrap", "charliecloud", "podman"),
    "squashfs": ("enroot", "charliecloud", "bubblewrap"),
    "ref": ("pyxis", "podman", "enroot"),
}


@functools.lru_cache(maxsize=1)
def pyxis_srun() -> bool:
    """Whether this srun has the pyxis plugin (its options show in ``srun --help``)."""
    if shutil.which("srun") is None:
        return False
    try:
        out = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--container-image" in out


def installed() -> list[str]:
    return [name for name, cls in RUNTIMES.items() if cls().available()]


def get(name: str) -> Runtime:
    """The runtime called ``name``; an unknown name is a usage error listing the known ones."""
    try:
        return RUNTIMES.get(name)()
    except UnknownName as exc:
        raise UsageError(exc.problem, key="runtime") from None


def auto(image: str, environ: Mapping[str, str] | None = None) -> Runtime:
    """The preferred installed runtime for this image (order in the module docstring)."""
    environ = os.environ if environ is None else environ
    kind = image_kind(image)
    for name in PREFERENCE[kind]:
        if name == "pyxis" and (not environ.get("SLURM_JOB_ID") or environ.get("SLURM_STEP_ID")):
            continue
        runtime = RUNTIMES.get(name)()
        if runtime.available():
            return runtime
    have = ", ".join(installed()) or "none"
    raise UsageError(f"no installed runtime runs a {kind} image ({image!r}): tried "
                     f"{', '.join(PREFERENCE[kind])}; installed: {have}", key="runtime")
