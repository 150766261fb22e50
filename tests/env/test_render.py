"""Exact launches rendered from hand-built Environments, for every runtime (no runtime
needs to be installed)."""

from __future__ import annotations

import pytest

from hpcml.env.model import STARTUP, USER_SITE, VENV, Environment, Mount
from hpcml.env.runtimes import PREFERENCE, RUNTIMES, auto, get
from hpcml.env.runtimes.base import image_kind, oci_reference, wrap_command
from hpcml.errors import UsageError

CMD = ["python", "train.py", "--lr", "1e-3"]
NOUSER = "PYTHONNOUSERSITE"


def full(image: str, **kw) -> Environment:
    base = dict(image=image, workdir="/work", writable=False, entrypoint=False,
                mounts=[Mount("/scratch/data", "/data", ("ro",)), Mount("/scratch/out", "/out")],
                devices=["/dev/fuse"], env={"OMP_NUM_THREADS": "4", "HTTP_PROXY": None},
                annotations={"com.hooks.cxi.enabled": "true", "com.example.tag": "x"})
    base.update(kw)
    return Environment(**base)


def render(name: str, env: Environment, command=CMD, environ=None):
    return get(name).render(env, command, environ=environ or {}, scratch="/s")


def test_bubblewrap_read_only_directory():
    launch = render("bubblewrap", full("/images/rootfs"))
    assert launch.argv == [
        "bwrap", "--ro-bind", "/images/rootfs", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--ro-bind", "/scratch/data", "/data", "--bind", "/scratch/out", "/out",
        "--dev-bind", "/dev/fuse", "/dev/fuse", "--chdir", "/work",
        "--setenv", "OMP_NUM_THREADS", "4", "--unsetenv", "HTTP_PROXY", "--setenv", NOUSER, "1",
        "--die-with-parent", "--unshare-pid", *CMD]
    assert launch.prepare == [] and launch.environ == {}
    assert "read-only root: mount targets must already exist in the image" in launch.notes
    assert any("com.example.tag" in n for n in launch.notes)          # nothing acts on it
    assert not any("com.hooks.cxi" in n for n in launch.notes)       # hooks are applied from the site file


def test_bubblewrap_writable_squashfs_uses_squashfuse_and_overlay():
    launch = render("bubblewrap", Environment(image="/img/x.sqsh", writable=True))
    assert launch.prepare == [
        ["mkdir", "-p", "/s/image"], ["squashfuse", "/img/x.sqsh", "/s/image"],
        ["mkdir", "-p", "/s/upper", "/s/work", "/s/root"],
        ["fuse-overlayfs", "-o", "lowerdir=/s/image,upperdir=/s/upper,workdir=/s/work", "/s/root"]]
    assert launch.cleanup == [["fusermount", "-u", "/s/root"], ["fusermount", "-u", "/s/image"], ["rm", "-rf", "/s"]]
    assert launch.argv[:4] == ["bwrap", "--bind", "/s/root", "/"]
    assert "--tmpfs" not in launch.argv
    with pytest.raises(UsageError, match="registry reference"):
        render("bubblewrap", Environment(image="nvcr.io#nvidia/pytorch:25.01-py3"))


def test_podman_registry_image():
    environ = {"SLURM_PROCID": "1", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/root", "HTTP_PROXY": "p"}
    launch = render("podman", full("nvcr.io/nvidia/pytorch:25.01-py3"), environ=environ)
    assert launch.argv == [
        "podman", "run", "--rm", "--network", "host", "--read-only",
        "-v", "/scratch/data:/data:ro", "-v", "/scratch/out:/out", "-w", "/work",
        "-e", "CUDA_VISIBLE_DEVICES", "-e", "SLURM_PROCID",
        "-e", "OMP_NUM_THREADS=4", "--unsetenv", "HTTP_PROXY", "-e", f"{NOUSER}=1",
        "--device", "/dev/fuse", "--annotation", "com.hooks.cxi.enabled=true",
        "--annotation", "com.example.tag=x", "--entrypoint", "",
        "nvcr.io/nvidia/pytorch:25.01-py3", *CMD]


def test_podman_rootfs_entrypoint_and_sqsh_rejected():
    launch = render("podman", Environment(image="/images/rootfs", entrypoint=True))
    assert launch.argv[-len(CMD) - 2:] == ["--rootfs", "/images/rootfs", *CMD]
    assert "--entrypoint" not in launch.argv and "--read-only" not in launch.argv
    with pytest.raises(UsageError, match="SquashFS"):
        render("podman", Environment(image="/img/x.sqsh"))


def test_enroot_fstab_mounts_and_wrapper_for_workdir_and_unset():
    launch = render("enroot", full("/img/x.sqsh", writable=True))
    script = "set -e\nunset HTTP_PROXY\ncd /work\nexec \"$@\""
    assert launch.argv == [
        "enroot", "start", "--rw",
        "--mount", "/scratch/data:/data:none:x-create=auto,rbind,ro",
        "--mount", "/scratch/out:/out:none:x-create=auto,rbind",
        "-e", "OMP_NUM_THREADS=4", "-e", f"{NOUSER}=1",
        "/img/x.sqsh", "/bin/sh", "-c", script, "sh", *CMD]
    assert any("devices ignored" in n for n in launch.notes)


def test_enroot_registry_ref_imported_into_image_store():
    launch = render("enroot", Environment(image="nvcr.io#nvidia/pytorch:25.01-py3"),
                    environ={"SCRATCH": "/scratch"})
    store = "/scratch/.edf_imagestore/nvcr.io+nvidia+pytorch+25.01-py3.sqsh"
    assert launch.prepare[0][-2:] == [store, "docker://nvcr.io#nvidia/pytorch:25.01-py3"]
    assert launch.argv[2] == "--rw" and store in launch.argv


def test_pyxis_exports_env_and_names_it():
    launch = render("pyxis", full("nvcr.io#nvidia/pytorch:25.01-py3", entrypoint=True,
                                  mounts=[Mount("/scratch/data", "/data", ("ro", "private"))]))
    assert launch.argv == [
        "srun", "--container-image=nvcr.io#nvidia/pytorch:25.01-py3",
        "--container-mounts=/scratch/data:/data:ro+private", "--container-workdir=/work",
        "--container-readonly", "--container-entrypoint", f"--container-env=OMP_NUM_THREADS,{NOUSER}",
        "/bin/sh", "-c", "set -e\nunset HTTP_PROXY\nexec \"$@\"", "sh", *CMD]
    assert launch.environ == {"OMP_NUM_THREADS": "4", "HTTP_PROXY": None, NOUSER: "1"}
    assert launch.lines()[:3] == ["export OMP_NUM_THREADS=4", "unset HTTP_PROXY", f"export {NOUSER}=1"]


def test_pyxis_writable_no_entrypoint():
    launch = render("pyxis", Environment(image="./x.sqsh", annotations={USER_SITE: "true"}))
    assert launch.argv == ["srun", "--container-image=./x.sqsh", "--container-writable",
                           "--no-container-entrypoint", *CMD]


def test_charliecloud():
    launch = render("charliecloud", full("/images/x.sqfs", entrypoint=True))
    assert launch.argv == [
        "ch-run", "--bind=/scratch/data:/data", "--bind=/scratch/out:/out", "--cd=/work", "--env-no-expand",
        "--set-env=OMP_NUM_THREADS=4", "--unset-env=HTTP_PROXY", f"--set-env={NOUSER}=1",
        "/images/x.sqfs", "--", *CMD]
    notes = " | ".join(launch.notes)
    assert "read-only mounts are writable under ch-run" in notes and "entrypoint = true ignored" in notes
    assert render("charliecloud", Environment(image="/images/rootfs")).argv[1] == "--write"


def test_sqsh_data_mount_becomes_squashfuse_bind():
    env = Environment(image="/images/rootfs", mounts=[Mount("/d/data.sqsh", "/data", ("sqsh",))])
    launch = render("bubblewrap", env)
    assert launch.prepare == [["mkdir", "-p", "/s/mount0"], ["squashfuse", "/d/data.sqsh", "/s/mount0"]]
    assert launch.cleanup == [["fusermount", "-u", "/s/mount0"], ["rm", "-rf", "/s"]]
    assert ["--ro-bind", "/s/mount0", "/data"] == launch.argv[8:11]


def test_venv_and_startup_wrapper_quoted():
    env = Environment(image="/r", annotations={VENV: "/ven v/", STARTUP: "module load x\n\nexport A='b c'"})
    assert wrap_command(env, ["echo", "a b"]) == [
        "/bin/sh", "-c", "set -e\nmodule load x\nexport A='b c'\n. '/ven v/bin/activate'\nexec \"$@\"",
        "sh", "echo", "a b"]
    assert wrap_command(Environment(image="/r"), ["true"]) == ["true"]
    launch = render("podman", env)
    i = launch.argv.index("--rootfs")
    assert launch.argv[i:i + 4] == ["--rootfs", "/r", "/bin/sh", "-c"] and launch.argv[-len(CMD):] == CMD


def test_user_site_keeps_home_packages_visible():
    env = Environment(image="/r", annotations={USER_SITE: "true"})
    assert NOUSER not in render("bubblewrap", env).argv
    assert render("bubblewrap", Environment(image="/r", env={NOUSER: "0"})).argv.count(NOUSER) == 1


def test_image_kind_and_registry():
    assert [image_kind(i) for i in ("/a/b.sqsh", "./r.sqfs", "/a/rootfs", "./rootfs", "ubuntu:24.04",
                                    "nvcr.io#nvidia/pytorch:25.01-py3")] == \
        ["squashfs", "squashfs", "dir", "dir", "ref", "ref"]
    assert set(RUNTIMES) == {"bubblewrap", "charliecloud", "enroot", "podman", "pyxis"}
    assert all(set(order) <= set(RUNTIMES) for order in PREFERENCE.values())
    with pytest.raises(UsageError, match="unknown runtime 'docker'"):
        get("docker")


def test_auto_prefers_the_lightest_installed(monkeypatch):
    have = {"bubblewrap": False, "charliecloud": True, "podman": True, "enroot": False, "pyxis": True}
    for name, cls in RUNTIMES.items():
        monkeypatch.setattr(cls, "available", lambda self, n=name: have[n])
    assert auto("/images/rootfs").name == "charliecloud"
    assert auto("/images/x.sqsh").name == "charliecloud"
    assert auto("ubuntu:24.04", {"SLURM_JOB_ID": "1"}).name == "pyxis"
    assert auto("ubuntu:24.04", {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"}).name == "podman"
    assert auto("ubuntu:24.04", {}).name == "podman"
    have.update(podman=False, pyxis=False)
    with pytest.raises(UsageError, match="installed: charliecloud"):
        auto("ubuntu:24.04", {})


def test_edf_image_reference_to_oci():
    assert oci_reference("nvcr.io#nvidia/pytorch:25.01-py3") == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert oci_reference("me@nvcr.io#nvidia/pytorch:25.01-py3") == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert oci_reference("ubuntu:24.04") == "docker.io/ubuntu:24.04"
    assert oci_reference("library/ubuntu") == "docker.io/library/ubuntu"
    assert oci_reference("localhost/hpcml-test:1") == "localhost/hpcml-test:1"
    assert render("podman", Environment(image="nvcr.io#nvidia/pytorch:25.01-py3")).argv[-len(CMD) - 1] == \
        "nvcr.io/nvidia/pytorch:25.01-py3"
