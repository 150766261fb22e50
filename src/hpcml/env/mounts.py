"""EDF mount specs ``SRC:DST[:FLAGS]`` into ``Mount``.

The accepted flags are the ones enroot and Pyxis accept (an EDF goes to them unchanged
at CSCS), so a spec that validates here also mounts there. Written by hand: the syntax is
a split on ``:`` and ``+``, and the checks are what makes the error messages useful.
"""

from __future__ import annotations

import os

from hpcml.env.model import Mount
from hpcml.errors import UsageError

FLAGS = frozenset({"ro", "rw", "private", "rprivate", "shared", "rshared", "slave", "rslave",
                   "nosuid", "nodev", "noexec", "bind", "rbind", "recursive", "sqsh"})


class MountError(UsageError, ValueError):
    """A mount spec that is not ``SRC:DST[:FLAGS]`` with known flags (bad input, exit 2)."""


def is_relative_path(text: str) -> bool:
    """``./x`` and ``../x`` (and ``.``/``..``): resolved against the caller's directory."""
    return text in (".", "..") or text.startswith(("./", "../"))


def resolve_path(text: str, cwd: str) -> str:
    """A ``./`` or ``../`` path against ``cwd`` (not the EDF's directory); others unchanged."""
    return os.path.normpath(os.path.join(cwd, text)) if is_relative_path(text) else text


def parse_mount(spec: str, cwd: str) -> Mount:
    """One expanded spec; ``./`` sources are made absolute against ``cwd``."""
    parts = spec.split(":")
    if len(parts) < 2:
        raise MountError(f"expected SRC:DST[:FLAGS], found {spec!r} (no destination)")
    if len(parts) > 3:
        raise MountError(f"expected SRC:DST[:FLAGS], found {spec!r} (too many ':')")
    src, dst = parts[0], parts[1]
    if not src:
        raise MountError(f"empty source in {spec!r}")
    if not dst:
        raise MountError(f"empty destination in {spec!r}")
    if not dst.startswith("/"):
        raise MountError(f"destination must be an absolute path, found {dst!r} in {spec!r}")
    if not (src.startswith("/") or is_relative_path(src)):
        raise MountError(f"source must be absolute or start with ./ or ../, found {src!r} in {spec!r}")
    flags: tuple[str, ...] = ()
    if len(parts) == 3:
        flags = tuple(parts[2].split("+"))
        for flag in flags:
            if flag not in FLAGS:
                what = "an empty flag" if not flag else f"unknown flag {flag!r}"
                raise MountError(f"{what} in {spec!r}; known: {', '.join(sorted(FLAGS))}")
    return Mount(source=resolve_path(src, cwd), target=dst, flags=flags)
