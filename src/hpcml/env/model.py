"""A resolved container environment: what an EDF (and its base environments) asks for,
with where each value came from. Parsing lives in ``edf``; rendering in ``runtimes``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Annotations of this namespace are hpcml's EDF extension: CSCS's parser passes
# annotations through untouched, so an EDF that uses them stays valid there.
HPCML_PREFIX = "com.hpcml."
VENV = HPCML_PREFIX + "venv"                 # path of a venv (on shared storage) to activate
STARTUP = HPCML_PREFIX + "startup"           # shell commands run before the command, one per line
USER_SITE = HPCML_PREFIX + "user_site"       # "true" keeps ~/.local visible (default: hidden)


@dataclass(frozen=True)
class Mount:
    source: str                       # absolute host path (after expansion and ./ resolution)
    target: str                       # absolute path in the container
    flags: tuple[str, ...] = ()       # EDF flags, e.g. ("ro", "private"); ("sqsh",) mounts a SquashFS file

    @property
    def readonly(self) -> bool:
        return "ro" in self.flags

    @property
    def squashfs(self) -> bool:
        return "sqsh" in self.flags

    def spec(self) -> str:
        return f"{self.source}:{self.target}" + (":" + "+".join(self.flags) if self.flags else "")


@dataclass
class Environment:
    """Defaults follow the CSCS Container Engine (Pyxis-based): no entrypoint, writable
    (``edf.load(engine="sarus-suite")`` sets Sarus Suite's entrypoint default instead)."""

    file: Path | None = None                       # the EDF this was resolved from
    image: str = ""                                # registry ref, a .sqsh file or a rootfs directory
    workdir: str | None = None
    entrypoint: bool = False
    writable: bool = True
    mounts: list[Mount] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)     # None: unset in the container
    # [env] values that reference variables, as written: the container's environment (image
    # over host) resolves them at start; ``env`` holds the host-only preview
    env_template: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)    # flattened dotted keys
    origin: dict[str, str] = field(default_factory=dict)         # "image", "env.X", "mounts[2]" -> EDF path
    chain: list[Path] = field(default_factory=list)              # base environments first, this file last
    options: dict[str, list[str]] = field(default_factory=dict)  # runtime -> extra argv from site hooks

    @property
    def venv(self) -> str | None:
        return self.annotations.get(VENV) or None

    @property
    def startup(self) -> list[str]:
        return [line for line in self.annotations.get(STARTUP, "").splitlines() if line.strip()]

    @property
    def user_site(self) -> bool:
        return self.annotations.get(USER_SITE, "false").lower() == "true"


def image_problem(image: str) -> str | None:
    """Why ``image`` cannot be launched, or None: every runtime takes the image as a bare
    argument, where a leading ``-`` (``--rc=/tmp/evil.sqsh``) is read as an option."""
    if image.startswith("-"):
        return f"{image!r} starts with '-', which a runtime would read as an option (a file here: {'./' + image!r})"
    return None
