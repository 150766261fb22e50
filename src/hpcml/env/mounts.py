"""EDF mount specs ``SRC:DST[:FLAGS]`` (or pyxis's short form ``PATH``: the same path
inside) into ``Mount``.

The accepted flags are the mount options enroot's fstab parser knows (``enroot-mount.c``;
pyxis turns ``+`` into ``,`` and hands them over, as CSCS's CE does), plus CSCS's
``sqsh``, so a spec that validates here also mounts there. Options that are not about
a bind mount (``remount``, ``x-move``, ``x-detach``, fstab's ``auto``/``user``...) are
refused. Written by hand: the syntax is a split on ``:`` and ``+``, and the checks are
what makes the error messages useful.
"""

from __future__ import annotations

import os

from hpcml.env.model import Mount
from hpcml.errors import UsageError

FLAGS = frozenset({
    "ro", "rw", "bind", "rbind", "recursive", "sqsh", "nofail", "silent", "loud",
    "private", "rprivate", "shared", "rshared", "slave", "rslave", "unbindable", "runbindable",
    "nosuid", "suid", "nodev", "dev", "noexec", "exec", "sync", "async", "dirsync", "mand", "nomand",
    "atime", "noatime", "diratime", "nodiratime", "relatime", "norelatime", "strictatime", "nostrictatime",
    "lazytime", "nolazytime", "iversion", "noiversion", "x-create=auto", "x-create=dir", "x-create=file"})


class MountError(UsageError, ValueError):
    """A mount spec that is not ``SRC:DST[:FLAGS]`` with known flags (bad input, exit 2)."""


def is_relative_path(text: str) -> bool:
    """``./x`` and ``../x`` (and ``.``/``..``): resolved against the caller's directory."""
    return text in (".", "..") or text.startswith(("./", "../"))


def resolve_path(text: str, cwd: str) -> str:
    """A ``./`` or ``../`` path against ``cwd`` (not the EDF's directory); others unchanged."""
    return os.path.normpath(os.path.join(cwd, text)) if is_relative_path(text) else text


def parse_mount(spec: str, cwd: str, *, short_form: bool = True) -> Mount:
    """One expanded spec; ``./`` sources are made absolute against ``cwd``. ``short_form``
    (pyxis, CSCS's CE) lets ``PATH`` alone mean ``PATH:PATH``; Sarus Suite refuses it."""
    parts = spec.split(":")
    if len(parts) == 1 and spec:
        if not short_form:
            raise MountError(f"no destination in {spec!r}: Sarus Suite needs SRC:DST "
                             "(the CE's short form PATH means PATH:PATH)")
        if not (spec.startswith("/") or is_relative_path(spec)):
            raise MountError(f"a path alone must be absolute or start with ./ or ../, found {spec!r}")
        path = _no_colon(resolve_path(spec, cwd), cwd, spec)
        return Mount(source=path, target=path)
    if len(parts) < 2:
        raise MountError(f"expected SRC:DST[:FLAGS] or PATH, found {spec!r}")
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
    return Mount(source=_no_colon(resolve_path(src, cwd), cwd, spec), target=dst, flags=flags)


def _no_colon(path: str, cwd: str, spec: str) -> str:
    """A ``./`` path made absolute against a directory with a ``:`` in its name: every
    runtime's mount syntax (``SRC:DST``, pyxis's, podman's ``-v``, enroot's fstab fields)
    would split it there."""
    if ":" in path:
        raise MountError(f"{spec!r} resolves against {cwd!r} to {path!r}, whose ':' every runtime's "
                         "mount syntax reads as a separator: use an absolute path without one")
    return path
