"""``hpcml env check``: the common mistakes of an environment, found before the job starts.

Each finding has a level: ``error`` (the job will fail or silently run degraded),
``warn`` (probably wrong) or ``info`` (could not be checked here; does not change the
exit code). The image's CUDA major comes from ``CUDA_VERSION`` in the EDF's env, the tag of
``nvcr.io#nvidia/cuda``, or the NGC release of a framework image (``YY.MM``): releases
23.01-25.07 ship CUDA 12 and 25.08 onwards CUDA 13 (25.12 ships 13.1, per NVIDIA's
PyTorch release notes; the 25.08 boundary is from the same notes' support matrix).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcml.env.hooks import apply_hooks, chosen_variant, enabled_hooks
from hpcml.env.model import Environment
from hpcml.env.site import Site

NCCL_HOOK = "com.hooks.aws_ofi_nccl"
MPS_HOOK = "com.hooks.nvidia_cuda_mps"
IMAGE_FILE_SUFFIXES = (".sqsh", ".sqfs", ".squashfs", ".sif", ".tar", ".tar.gz")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class Finding:
    level: str          # "error", "warn" or "info"
    key: str            # "image", "mount SRC:DST", "env.X", "annotations.com.hooks...", "workdir"
    message: str

    def to_json(self) -> dict:
        return asdict(self)


def is_image_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith(IMAGE_FILE_SUFFIXES)


def registry_ref(image: str) -> str:
    """An EDF ref ``[USER@][REGISTRY#]IMAGE[:TAG]`` in the form podman and docker use."""
    ref = image.split("@", 1)[1] if "@" in image.split("#", 1)[0] else image
    return ref.replace("#", "/", 1)


def image_cuda_major(env: Environment) -> tuple[int | None, str]:
    """The image's CUDA major and how it was found, or (None, why it is unknowable)."""
    version = env.env.get("CUDA_VERSION")
    digits = re.match(r"\d+", version) if version else None
    if digits:
        return int(digits.group()), f"CUDA_VERSION={version} in the EDF's env"
    ref = registry_ref(env.image)
    m = re.match(r"nvcr\.io/nvidia/([\w./-]+):(\S+)$", ref)
    if m and m.group(1) == "cuda" and re.match(r"\d+\.", m.group(2)):
        return int(m.group(2).split(".")[0]), f"the CUDA image tag {m.group(2)}"
    t = re.match(r"(\d{2})\.(\d{2})", m.group(2)) if m else None
    if t:
        yymm = (int(t.group(1)), int(t.group(2)))
        major = 13 if yymm >= (25, 8) else 12 if yymm >= (23, 1) else 11 if yymm >= (20, 6) else None
        if major:
            return major, f"NGC release {t.group(0)}"
    return None, "not an NGC image and no CUDA_VERSION in the EDF's env"


def host_has_gpu(dev: str = "/dev", cdi_dirs: tuple[str, ...] = CDI_DIRS) -> bool:
    """An NVIDIA device node, or a CDI spec naming nvidia.com/gpu, on this host."""
    if glob.glob(os.path.join(dev, "nvidia[0-9]*")) or os.path.exists(os.path.join(dev, "nvidiactl")):
        return True
    for d in cdi_dirs:
        for spec in glob.glob(os.path.join(d, "*.yaml")) + glob.glob(os.path.join(d, "*.json")):
            try:
                if "nvidia.com/gpu" in Path(spec).read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def podman_image_exists(ref: str) -> bool | None:
    """True/False from ``podman image exists``; None when podman is not installed."""
    if shutil.which("podman") is None:
        return None
    try:
        return subprocess.run(["podman", "image", "exists", ref], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None


def _check_image(env: Environment, runtime: str | None) -> list[Finding]:
    if not env.image:
        return [Finding("warn", "image", "no image: the command runs on the host, not in a container")]
    if is_image_path(env.image):
        if not os.path.exists(os.path.expanduser(env.image)):
            return [Finding("error", "image", f"{env.image} does not exist")]
        return []
    if runtime not in (None, "podman"):
        return [Finding("info", "image", f"{env.image}: not checked; {runtime} pulls it when the job starts")]
    ref = registry_ref(env.image)
    exists = podman_image_exists(ref)
    if exists is None:
        return [Finding("info", "image", f"{env.image}: cannot check a registry image here (podman is not installed)")]
    if not exists:
        return [Finding("warn", "image", f"{ref} is not in podman's local store: it is pulled at start "
                                         "(slow for big images; fails without network)")]
    return []


def _check_mounts(env: Environment) -> list[Finding]:
    out = []
    for i, m in enumerate(env.mounts):
        origin = env.origin.get(f"mounts[{i}]", "")
        src = Path(m.source)
        if src.exists() and not (m.squashfs and not src.is_file()):
            continue
        problem = "is not a SquashFS file" if src.exists() else "does not exist on this host"
        key = f"mount {m.source}:{m.target}"     # by what it is: hooks add mounts `env show` does not list
        if origin.startswith("site hook"):
            out.append(Finding("warn", key, f"{m.source} (from {origin}) {problem}: "
                                            "the site file does not describe this host"))
        else:
            out.append(Finding("error", key, f"source {m.source} {problem}" + (f" (from {origin})" if origin else "")))
    return out


def _gpu_requests(env: Environment, site: Site) -> list[str]:
    why = []
    nvd = env.env.get("NVIDIA_VISIBLE_DEVICES")
    if nvd and nvd != "void":
        why.append(f"NVIDIA_VISIBLE_DEVICES={nvd}")
    if env.env.get("CUDA_VISIBLE_DEVICES"):
        why.append(f"CUDA_VISIBLE_DEVICES={env.env['CUDA_VISIBLE_DEVICES']}")
    why += [f"device {d}" for d in env.devices if d.startswith("nvidia.com/gpu")]
    hooks = enabled_hooks(env.annotations)
    if MPS_HOOK in hooks:
        why.append("the CUDA MPS hook")
    if NCCL_HOOK in hooks and NCCL_HOOK in site.hooks:
        variant, _, _ = chosen_variant(env, NCCL_HOOK, site.hooks[NCCL_HOOK])
        if variant and variant.startswith("cuda"):
            why.append(f"NCCL plugin variant {variant}")
    return why


def _check_gpu(env: Environment, site: Site, runtime: str | None, gpu_visible: bool) -> list[Finding]:
    why = _gpu_requests(env, site)
    if not why:
        return []
    out = []
    nvd = env.env.get("NVIDIA_VISIBLE_DEVICES")
    injected_env = bool(nvd) and nvd != "void"
    gpu_device = any(d.startswith("nvidia.com/gpu") for d in env.devices)
    if not injected_env and not gpu_device:
        out.append(Finding("warn", "env.NVIDIA_VISIBLE_DEVICES",
                           f"a GPU is wanted ({', '.join(why)}) but nothing injects the driver: set "
                           "NVIDIA_VISIBLE_DEVICES=all (pyxis, enroot) or devices=['nvidia.com/gpu=all'] (podman)"))
    elif runtime == "podman" and not gpu_device:
        out.append(Finding("warn", "devices", "podman ignores NVIDIA_VISIBLE_DEVICES: add "
                                              "devices = ['nvidia.com/gpu=all'] (CDI)"))
    if not gpu_visible:
        out.append(Finding("warn", "devices", f"a GPU is wanted ({', '.join(why)}) but this host has no "
                                              "/dev/nvidia* and no CDI nvidia.com/gpu spec: the container "
                                              "sees no GPU here (fine on a login node)"))
    return out


def _check_nccl(env: Environment, site: Site) -> list[Finding]:
    if NCCL_HOOK not in enabled_hooks(env.annotations) or NCCL_HOOK not in site.hooks:
        return []
    name, variant, _ = chosen_variant(env, NCCL_HOOK, site.hooks[NCCL_HOOK])
    if variant is None or (variant.cuda is None and variant.rocm is None):
        return []
    key = f"annotations.{NCCL_HOOK}.variant"
    major, how = image_cuda_major(env)
    if major is None:
        return [Finding("info", key, f"variant {name}: the image's CUDA cannot be known ({how})")]
    if variant.rocm is not None:
        return [Finding("error", key, f"variant {name} is the ROCm plugin but the image has CUDA {major} ({how})")]
    if variant.cuda != major:
        return [Finding("error", key, f"variant {name} is built for CUDA {variant.cuda} but the image has "
                                      f"CUDA {major} ({how}): the plugin fails to load and NCCL falls back to TCP")]
    return []


def _under(path: str, target: str) -> bool:
    return path == target or path.startswith(target.rstrip("/") + "/")


def _check_workdir(env: Environment) -> list[Finding]:
    if not env.workdir:
        return []
    if any(_under(env.workdir, m.target) for m in env.mounts):
        return []
    image = os.path.expanduser(env.image) if env.image else ""
    if not image or not os.path.isdir(image):
        return [Finding("info", "workdir", f"{env.workdir}: not under a mount; cannot look inside this image")]
    if (Path(image) / env.workdir.lstrip("/")).is_dir():
        return []
    return [Finding("warn", "workdir", f"{env.workdir} is neither in the image nor under a mount target")]


def _check_user_site(env: Environment, runtime: str | None, home: str | None) -> list[Finding]:
    out = []
    if env.venv:
        if not any(_under(env.venv, m.target) and m.source == m.target for m in env.mounts):
            out.append(Finding("warn", "annotations.com.hpcml.venv",
                               f"{env.venv} is not mounted at the same path: add '{env.venv}:{env.venv}' to mounts"))
        elif not (Path(env.venv) / "pyvenv.cfg").is_file():
            out.append(Finding("warn", "annotations.com.hpcml.venv",
                               f"{env.venv} is not a venv (no pyvenv.cfg); create it with 'hpcml env venv'"))
    if env.venv and not env.user_site:
        return out                    # hpcml's venv extension sets PYTHONNOUSERSITE
    home = home or env.env.get("HOME") or os.environ.get("HOME")
    mounted = runtime == "apptainer" or (home and any(_under(home, m.target) for m in env.mounts))
    if mounted and "PYTHONNOUSERSITE" not in env.env and not env.user_site:
        out.append(Finding("warn", "env.PYTHONNOUSERSITE",
                           f"{home} is mounted, so packages in ~/.local shadow the image's when another "
                           "launcher (srun --environment) runs this EDF; set PYTHONNOUSERSITE=1 in [env] "
                           "or use com.hpcml.venv (hpcml env run hides ~/.local itself)"))
    return out


def check(env: Environment, site: Site, *, runtime: str | None = None, gpu_visible: bool | None = None,
          home: str | None = None) -> list[Finding]:
    """Findings for ``env`` with the site's hooks applied; ``gpu_visible`` defaults to the host's."""
    hooked, warnings = apply_hooks(env, site)
    findings = []
    for w in warnings:
        key, _, message = w.partition(": ")
        findings.append(Finding("warn", key, message))
    findings += _check_image(hooked, runtime)
    findings += _check_mounts(hooked)
    findings += _check_gpu(hooked, site, runtime, host_has_gpu() if gpu_visible is None else gpu_visible)
    findings += _check_nccl(hooked, site)
    findings += _check_workdir(hooked)
    findings += _check_user_site(hooked, runtime, home)
    return findings


def exit_code(findings: list[Finding]) -> int:
    """0 clean (info only), 5 warnings only, 6 errors found."""
    levels = {f.level for f in findings}
    return 6 if "error" in levels else 5 if "warn" in levels else 0
