"""A tiny root filesystem for container tests: Debian's static busybox and the
directories the runtimes bind onto. Also the podman configuration this sandbox needs
(see notes/containers.md: ulimits, runc, host network)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

APPLETS = ("sh", "cat", "env", "ls", "pwd", "echo", "touch", "mkdir", "id", "test", "true", "false")
DIRS = ("bin", "proc", "dev", "tmp", "etc", "data", "work", "mnt", "sys", "home", "run")
PODMAN_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
netns = "host"

[engine]
runtime = "runc"
"""


def apt_install(*packages: str) -> str | None:
    """Install Debian packages as root; None on success, else why not."""
    if os.geteuid() != 0:
        return f"not root: cannot install {' '.join(packages)}"
    cmd = ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=120", "install", "--no-install-recommends", *packages]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "-q", "update"], capture_output=True, env=env)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return None if proc.returncode == 0 else f"apt-get install {' '.join(packages)} failed: {proc.stderr.strip()[-300:]}"


def ensure(tool: str, package: str) -> str | None:
    """None when ``tool`` is on PATH (installing ``package`` if needed), else why not."""
    if shutil.which(tool):
        return None
    return apt_install(package) or (None if shutil.which(tool) else f"{tool} not found after installing {package}")


def build_rootfs(root: Path) -> Path:
    """busybox-static with a few applets, and the usual mount points."""
    why = ensure("busybox", "busybox-static")
    busybox = Path("/bin/busybox")
    if why or not busybox.exists():
        raise RuntimeError(why or "/bin/busybox missing")
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
