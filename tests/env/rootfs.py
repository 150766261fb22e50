"""A tiny root filesystem for container tests: Debian's static busybox and the
directories the runtimes bind onto. Also the podman configuration this sandbox needs
(see notes/containers.md: ulimits, runc, host network)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests import needs

APPLETS = ("sh", "cat", "env", "ls", "pwd", "echo", "touch", "mkdir", "id", "test", "true", "false")
DIRS = ("bin", "proc", "dev", "tmp", "etc", "data", "work", "mnt", "sys", "home", "run")
PODMAN_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
netns = "host"

[engine]
runtime = "runc"
"""


def ensure(tool: str, package: str) -> None:
    """``tool`` is on PATH (``scripts/test`` installs Debian's ``package`` as root), or the
    test fails (``HPCML_ALLOW_SKIP_<PACKAGE>=1``: skips; tests/needs.py)."""
    needs.tool(tool, what=package)


def build_rootfs(root: Path) -> Path:
    """busybox-static with a few applets, and the usual mount points."""
    ensure("busybox", "busybox-static")
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise RuntimeError("/bin/busybox missing")
    for d in DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    for f in ("passwd", "group", "hosts", "resolv.conf"):
        (root / "etc" / f).touch()
    return root


def podman_conf(path: Path) -> Path:
    path.write_text(PODMAN_CONF)
    return path


def podman_import(root: Path, ref: str, env: dict[str, str]) -> None:
    """``tar -C ROOT -c . | podman import - REF``, with an image variable to test precedence."""
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    proc = subprocess.run(["podman", "import", "-q", "--change", "ENV=IMAGE_VAR=from-image",
                           "--change", "ENV=PATH=/bin", "-", ref],
                          stdin=tar.stdout, capture_output=True, text=True, env=env)
    tar.stdout.close()
    tar.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"podman import failed: {proc.stderr.strip()}")


def host_root_edf(path: Path, *mounted: Path) -> Path:
    """An EDF whose image is this host's own root filesystem (bubblewrap, read-only), so
    this Python and hpcml run inside. The container's /tmp is its own: the checkout and the
    interpreter's prefix (either may live under /tmp, as in a fresh CI clone) and ``mounted``
    are bound in at the same paths."""
    import sys
    checkout = Path(__file__).resolve().parents[2]
    dirs = list(dict.fromkeys(str(p) for p in (checkout, Path(sys.prefix).resolve(), *mounted)))
    path.write_text('image = "/"\nwritable = false\nmounts = [' + ", ".join(f'"{d}:{d}"' for d in dirs) + "]\n")
    return path
