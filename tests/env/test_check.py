"""``hpcml env check``: the common mistakes (hpcml.env.check) and its CLI (hpcml.env.cli.check)."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcml.env import check as check_mod
from hpcml.env.check import Finding, check, exit_code, host_has_gpu, image_cuda_major, registry_ref
from hpcml.env.cli import app as env_app
from hpcml.env.model import Environment, Mount
from hpcml.env.site import parse_site
from tests import needs

SITE = """\
hooks:
  com.hooks.cxi:
    mounts: [/nonexistent/hpcml-site/fabric:/opt/fab:ro]
  com.hooks.aws_ofi_nccl:
    variants:
      cuda12: {cuda: 12}
      cuda13: {cuda: 13}
      cuda-dl: {}
      rocm6: {rocm: 6}
  com.hooks.nvidia_cuda_mps: {}
"""


@pytest.fixture
def site():
    return parse_site(SITE, "site.yaml")


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    for d in ("bin", "work", "tmp"):
        (root / d).mkdir(parents=True)
    return root


def keys(findings: list[Finding], level: str | None = None) -> list[str]:
    return [f.key for f in findings if level is None or f.level == level]


def run(env: Environment, site, **kw) -> list[Finding]:
    kw.setdefault("gpu_visible", False)
    kw.setdefault("home", "/nonexistent-home")
    return check(env, site, **kw)


def test_clean_environment_has_no_findings(rootfs, site):
    assert run(Environment(image=str(rootfs), workdir="/work"), site) == []


def test_missing_image_path_is_an_error(tmp_path, site):
    findings = run(Environment(image=str(tmp_path / "nope.sqsh")), site)
    assert [(f.level, f.key) for f in findings] == [("error", "image")]
    assert exit_code(findings) == 6


def test_registry_ref_without_podman_cannot_be_checked(site, monkeypatch):
    monkeypatch.setattr(check_mod.shutil, "which", lambda name: None)
    findings = run(Environment(image="nvcr.io#nvidia/pytorch:25.11-py3"), site)
    assert [(f.level, f.key) for f in findings] == [("info", "image")]
    assert "cannot check" in findings[0].message and exit_code(findings) == 0


def test_registry_ref_not_checked_for_pyxis(site):
    findings = run(Environment(image="ubuntu:24.04"), site, runtime="pyxis")
    assert findings[0].level == "info" and "pyxis pulls it" in findings[0].message


def test_registry_ref_conversion():
    assert registry_ref("nvcr.io#nvidia/pytorch:25.11-py3") == "nvcr.io/nvidia/pytorch:25.11-py3"
    assert registry_ref("alice@nvcr.io#nvidia/pytorch:25.11-py3") == "nvcr.io/nvidia/pytorch:25.11-py3"
    assert registry_ref("ubuntu:24.04") == "ubuntu:24.04"


def test_registry_ref_against_podman_store(tmp_path, site):
    needs.tool("podman")
    ref = f"localhost/hpcml-check-test:{os.getpid()}"
    archive = tmp_path / "img.tar"
    (tmp_path / "f").write_text("x")
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "f", arcname="f")
    absent = run(Environment(image=ref), site, runtime="podman")
    assert [(f.level, f.key) for f in absent] == [("warn", "image")] and "not in podman's local store" in absent[0].message
    subprocess.run(["podman", "import", "-q", str(archive), ref], check=True, capture_output=True, timeout=120)
    try:
        assert run(Environment(image=ref), site, runtime="podman") == []
    finally:
        subprocess.run(["podman", "rmi", "-f", ref], capture_output=True, timeout=120)


def test_missing_mount_source_error_and_hook_mount_warn(rootfs, tmp_path, site):
    env = Environment(image=str(rootfs), mounts=[Mount(str(tmp_path), "/data"), Mount("/nonexistent/x", "/x")],
                      annotations={"com.hooks.cxi.enabled": "true"})
    findings = run(env, site)
    assert [f.level for f in findings] == ["error", "warn"]
    assert findings[0].key == "mount /nonexistent/x:/x"                 # by what it is, not an index
    assert findings[1].key.startswith("mount ") and "[" not in findings[1].key
    assert "/nonexistent/x" in findings[0].message and "site hook com.hooks.cxi" in findings[1].message


def test_sqsh_mount_must_be_a_file(rootfs, tmp_path, site):
    findings = run(Environment(image=str(rootfs), mounts=[Mount(str(tmp_path), "/d", ("sqsh",))]), site)
    assert keys(findings, "error") == [f"mount {tmp_path}:/d"] and "SquashFS" in findings[0].message


def test_hook_warnings_become_findings(rootfs):
    bare = parse_site("hooks: {}", "bare.yaml")
    findings = run(Environment(image=str(rootfs), annotations={"com.hooks.cxi.enabled": "true",
                                                              "com.hooks.bogus": "1"}), bare)
    assert keys(findings) == ["annotations.com.hooks.bogus", "annotations.com.hooks.cxi.enabled"]
    assert "fall back to TCP" in findings[1].message and exit_code(findings) == 5


def test_gpu_requested_but_host_has_none(rootfs, site):
    env = Environment(image=str(rootfs), env={"NVIDIA_VISIBLE_DEVICES": "all"})
    findings = run(env, site, gpu_visible=False)
    assert [(f.level, f.key) for f in findings] == [("warn", "devices")]
    assert "no /dev/nvidia*" in findings[0].message
    assert run(env, site, gpu_visible=True) == []
    assert run(Environment(image=str(rootfs), env={"NVIDIA_VISIBLE_DEVICES": "void"}), site) == []


def test_gpu_wanted_but_nothing_injects_the_driver(rootfs, site):
    for env in (Environment(image=str(rootfs), env={"CUDA_VISIBLE_DEVICES": "0"}),
                Environment(image=str(rootfs), annotations={"com.hooks.nvidia_cuda_mps.enabled": "true"}),
                Environment(image=str(rootfs), annotations={"com.hooks.aws_ofi_nccl.enabled": "true",
                                                            "com.hooks.aws_ofi_nccl.variant": "cuda-dl"})):
        findings = run(env, site, gpu_visible=True)
        assert keys(findings) == ["env.NVIDIA_VISIBLE_DEVICES"], env
    ok = Environment(image=str(rootfs), devices=["nvidia.com/gpu=all"], env={"CUDA_VISIBLE_DEVICES": "0"})
    assert run(ok, site, gpu_visible=True) == []


def test_podman_needs_a_cdi_device(rootfs, site):
    env = Environment(image=str(rootfs), env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert keys(run(env, site, runtime="podman", gpu_visible=True)) == ["devices"]
    assert keys(run(env, site, runtime="pyxis", gpu_visible=True)) == []


def test_host_has_gpu(tmp_path):
    dev, cdi = tmp_path / "dev", tmp_path / "cdi"
    dev.mkdir()
    cdi.mkdir()
    assert host_has_gpu(str(dev), (str(cdi),)) is False
    (cdi / "other.yaml").write_text("kind: hpe.com/cxi\n")
    assert host_has_gpu(str(dev), (str(cdi),)) is False
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    assert host_has_gpu(str(dev), (str(cdi),)) is True
    (dev / "nvidia0").touch()
    assert host_has_gpu(str(dev), ()) is True


@pytest.mark.parametrize("image, env, major", [
    ("nvcr.io#nvidia/pytorch:25.11-py3", {}, 13),
    ("nvcr.io#nvidia/pytorch:25.08-py3", {}, 13),
    ("nvcr.io#nvidia/pytorch:25.06-py3", {}, 12),
    ("nvcr.io#nvidia/jax:24.04-py3", {}, 12),
    ("nvcr.io#nvidia/pytorch:22.12-py3", {}, 11),
    ("nvcr.io#nvidia/cuda:12.4.1-devel-ubuntu22.04", {}, 12),
    ("docker.io/library/python:3.12", {"CUDA_VERSION": "13.0.1"}, 13),
    ("docker.io/library/python:3.12", {}, None),
    ("nvcr.io#nvidia/pytorch:latest", {}, None),
])
def test_image_cuda_major(image, env, major):
    assert image_cuda_major(Environment(image=image, env=env))[0] == major


@pytest.mark.parametrize("image, variant, level", [
    ("nvcr.io#nvidia/pytorch:25.11-py3", "cuda12", "error"),
    ("nvcr.io#nvidia/pytorch:25.11-py3", "cuda13", None),
    ("nvcr.io#nvidia/pytorch:24.10-py3", "cuda12", None),
    ("nvcr.io#nvidia/pytorch:24.10-py3", "rocm6", "error"),
    ("docker.io/me/train:1", "cuda12", "info"),
    ("nvcr.io#nvidia/pytorch:25.11-py3", "cuda-dl", None),
])
def test_nccl_variant_against_image_cuda(site, monkeypatch, image, variant, level):
    monkeypatch.setattr(check_mod, "podman_image_exists", lambda ref: True)
    env = Environment(image=image, env={"NVIDIA_VISIBLE_DEVICES": "all"},
                      annotations={"com.hooks.aws_ofi_nccl.enabled": "true",
                                   "com.hooks.aws_ofi_nccl.variant": variant})
    findings = [f for f in run(env, site, gpu_visible=True) if f.key.endswith(".variant")]
    assert [f.level for f in findings] == ([level] if level else [])


def test_workdir(rootfs, tmp_path, site):
    assert run(Environment(image=str(rootfs), workdir="/work"), site) == []
    missing = run(Environment(image=str(rootfs), workdir="/scratch/run"), site)
    assert [(f.level, f.key) for f in missing] == [("warn", "workdir")]
    mounted = Environment(image=str(rootfs), workdir="/scratch/run", mounts=[Mount(str(tmp_path), "/scratch")])
    assert run(mounted, site) == []
    sqsh = tmp_path / "img.sqsh"
    sqsh.touch()
    assert [(f.level, f.key) for f in run(Environment(image=str(sqsh), workdir="/x"), site)] == [("info", "workdir")]


def test_home_mounted_leaks_user_site(rootfs, tmp_path, site):
    home = tmp_path / "home" / "me"
    home.mkdir(parents=True)
    env = Environment(image=str(rootfs), mounts=[Mount(str(tmp_path / "home"), str(tmp_path / "home"))])
    findings = run(env, site, home=str(home))
    assert [(f.level, f.key) for f in findings] == [("warn", "env.PYTHONNOUSERSITE")]
    env.env["PYTHONNOUSERSITE"] = "1"
    assert run(env, site, home=str(home)) == []
    # apptainer mounts $HOME by default
    assert keys(run(Environment(image=str(rootfs)), site, runtime="apptainer")) == ["env.PYTHONNOUSERSITE"]


def test_venv_extension_hides_user_site_but_must_be_mounted(rootfs, tmp_path, site):
    venv = tmp_path / "v"
    venv.mkdir()
    base = dict(image=str(rootfs), annotations={"com.hpcml.venv": str(venv)})
    home_mount = Mount(str(tmp_path), str(tmp_path))
    findings = run(Environment(**base), site)
    assert keys(findings) == ["annotations.com.hpcml.venv"] and "not mounted" in findings[0].message
    findings = run(Environment(**base, mounts=[home_mount]), site, home=str(tmp_path))
    assert keys(findings) == ["annotations.com.hpcml.venv"] and "pyvenv.cfg" in findings[0].message
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert run(Environment(**base, mounts=[home_mount]), site, home=str(tmp_path)) == []


# ------------------------------------------------------------------ CLI

def _app():
    return env_app


def _edf(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "e.toml"
    path.write_text(body)
    return path


def test_cli_exit_codes(rootfs, tmp_path, monkeypatch):
    monkeypatch.setattr(check_mod, "host_has_gpu", lambda: False)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    runner = CliRunner()
    clean = _edf(tmp_path, f'image = "{rootfs}"\n')
    r = runner.invoke(_app(), ["check", str(clean), "--site", str(site)])
    assert r.exit_code == 0, r.output
    warn = _edf(tmp_path, f'image = "{rootfs}"\n[env]\nNVIDIA_VISIBLE_DEVICES = "all"\n')
    r = runner.invoke(_app(), ["check", str(warn), "--site", str(site), "--json"])
    assert r.exit_code == 5, r.output
    data = json.loads(r.output)
    assert data["exit_code"] == 5 and data["findings"][0]["key"] == "devices"
    err = _edf(tmp_path, f'image = "{tmp_path}/missing.sqsh"\n')
    assert runner.invoke(_app(), ["check", str(err), "--site", str(site)]).exit_code == 6
    bad_site = tmp_path / "bad.yaml"
    bad_site.write_text("hooks: {cxi: {}}")
    r = runner.invoke(_app(), ["check", str(clean), "--site", str(bad_site)])
    assert r.exit_code == 2 and "com.hooks.NAME" in r.output
    r = runner.invoke(_app(), ["check", str(clean), "--runtime", "docker"])
    assert r.exit_code == 2 and "--runtime" in r.output
