"""Container images for the env tests, built once per session: a busybox root filesystem
(bubblewrap, charliecloud) and the same imported into podman (removed at the end)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import needs
from tests.env import rootfs

#: one image per pytest-xdist worker: each worker's session imports it and removes it at its end
IMAGE_REF = f"localhost/hpcml-test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}:1"


@pytest.fixture(scope="session")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return rootfs.build_rootfs(tmp_path_factory.mktemp("rootfs"))
    except RuntimeError as exc:
        needs.missing("busybox-static", f"no busybox root filesystem: {exc}")


@pytest.fixture(scope="session")
def bubblewrap_image(root: Path) -> str:
    rootfs.ensure("bwrap", "bubblewrap")
    probe = subprocess.run(["bwrap", "--ro-bind", str(root), "/", "--proc", "/proc", "--dev", "/dev",
                            "/bin/true"], capture_output=True, text=True)
    if probe.returncode != 0:
        needs.missing("bubblewrap", f"bubblewrap cannot create a sandbox here: {probe.stderr.strip()}")
    return str(root)


@pytest.fixture(scope="session")
def podman_image(root: Path, tmp_path_factory: pytest.TempPathFactory):
    rootfs.ensure("podman", "podman")
    rootfs.ensure("runc", "runc")
    conf = rootfs.podman_conf(tmp_path_factory.mktemp("podman") / "containers.conf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONTAINERS_CONF", str(conf))
        env = dict(os.environ)
        try:
            rootfs.podman_import(root, IMAGE_REF, env)
        except RuntimeError as exc:
            needs.missing("podman", str(exc))
        try:
            probe = subprocess.run(["podman", "run", "--rm", IMAGE_REF, "/bin/true"], capture_output=True,
                                   text=True, env=env)
            if probe.returncode != 0:
                needs.missing("podman", f"podman cannot run a container here: {probe.stderr.strip()}")
            yield IMAGE_REF
        finally:
            subprocess.run(["podman", "rmi", "-f", IMAGE_REF], capture_output=True, env=env)


@pytest.fixture(scope="session")
def charliecloud_image(root: Path) -> str:
    rootfs.ensure("ch-run", "charliecloud-runtime")
    return str(root)
