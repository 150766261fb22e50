"""Exact launches rendered from hand-built Environments, for every runtime (no runtime
needs to be installed)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from hpcml.env.model import STARTUP, USER_SITE, VENV, Environment, Mount
from hpcml.env.runtimes import PREFERENCE, RUNTIMES, auto, get
from hpcml.env.runtimes.base import enroot_reference, image_kind, oci_reference, wrap_command
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


# ---------------------------------------------------------------- [env] resolved in the container, image syntax

def _wrapper(argv: list[str]) -> list[str]:
    i = argv.index("/bin/sh")
    return argv[i:]


def _run_in(argv: list[str], container_env: dict[str, str]) -> subprocess.CompletedProcess:
    """The in-container wrapper run by a real sh, with ``container_env`` standing for the
    environment the runtime gives the container."""
    printenv = shutil.which("env") or "/usr/bin/env"
    return subprocess.run(_wrapper(argv)[:4] + [printenv], env=container_env, capture_output=True, text=True)


def templated() -> Environment:
    return Environment(image="/images/rootfs", env={"PATH": "/login/bin:/custom/bin", "LIT": "$5", "GONE": None,
                                                    "MY_NODE": "${VAR_FROM_HOST}"},
                       env_template={"PATH": "${PATH}:/custom/bin", "MY_NODE": "${VAR_FROM_HOST}"})


def test_env_template_uses_the_image_path_not_the_login_nodes():
    launch = render("bubblewrap", templated(), command=["env"])
    assert "--setenv" not in launch.argv and "--unsetenv" not in launch.argv   # all set in the container
    done = _run_in(launch.argv, {"PATH": "/image/bin", "VAR_FROM_HOST": "nid1", "GONE": "x"})
    got = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert done.returncode == 0, done.stderr
    assert got["PATH"] == "/image/bin:/custom/bin" and got["MY_NODE"] == "nid1" and got["LIT"] == "$5"
    assert "GONE" not in got and got[NOUSER] == "1" and not any(k.startswith("_hpcml") for k in got)


def test_env_template_undefined_everywhere_fails_the_start():
    launch = render("enroot", Environment(image="/i.sqsh", env={"A": "${NOPE}"}, env_template={"A": "${NOPE}"}))
    done = _run_in(launch.argv, {"PATH": "/bin:/usr/bin"})
    assert done.returncode != 0 and "NOPE: undefined on the host and in the image" in done.stderr


def test_env_template_podman_falls_back_to_the_host_value():
    """podman passes no host variables: the host's value stands in where the image has none."""
    launch = render("podman", templated(), command=["env"], environ={"VAR_FROM_HOST": "nid7", "PATH": "/login/bin"})
    assert not any(a.startswith(("PATH=", "MY_NODE=")) for a in launch.argv)
    got = dict(line.split("=", 1) for line in _run_in(launch.argv, {"PATH": "/image/bin"}).stdout.splitlines())
    assert got["PATH"] == "/image/bin:/custom/bin" and got["MY_NODE"] == "nid7"
    assert "VAR_FROM_HOST" not in got                    # the fallback does not leak into the command


def test_env_template_runs_before_startup_lines():
    env = templated()
    env.annotations[STARTUP] = 'echo "$PATH"'
    script = _wrapper(render("bubblewrap", env).argv)[2]
    assert script.index("export PATH") < script.index('echo "$PATH"')


@pytest.mark.parametrize("image, enroot_ref, oci", [
    ("nvcr.io/nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io/nvidia/pytorch:25.01-py3"),
    ("host:5000/ns/img:tag", "host:5000#ns/img:tag", "host:5000/ns/img:tag"),
    ("localhost/img", "localhost#img", "localhost/img"),
    ("alice@quay.io/org/img", "alice@quay.io#org/img", "alice@quay.io/org/img"),
    ("nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io/nvidia/pytorch:25.01-py3"),
    ("library/ubuntu:24.04", "library/ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
    ("ubuntu:18.04", "ubuntu:18.04", "docker.io/ubuntu:18.04"),
])
def test_image_reference_in_each_runtimes_syntax(image, enroot_ref, oci):
    assert enroot_reference(image) == enroot_ref and oci_reference(image) == oci
    env = Environment(image=image)
    assert render("enroot", env).prepare[0][-1] == "docker://" + enroot_ref
    assert render("pyxis", env).argv[1] == "--container-image=" + enroot_ref
    assert oci in render("podman", env).argv


def test_pyxis_passes_mount_flags_as_written():
    env = Environment(image="ubuntu:18.04", mounts=[Mount("/tmp", "/mnt", ("unbindable", "ro"))])
    assert render("pyxis", env).argv[2] == "--container-mounts=/tmp:/mnt:unbindable+ro"
    podman = render("podman", env).argv
    assert podman[podman.index("-v") + 1] == "/tmp:/mnt:unbindable,ro"


# ---------------------------------------------------------------- hostile [env] names and values

PRINTER = """#!/bin/sh
# stands in for srun: records its argv and environment, runs nothing
for a in "$@"; do printf '%s\\0' "$a"; done > "$HPCML_TEST_OUT.argv"
env -0 > "$HPCML_TEST_OUT.env"
"""


def hostile(mark) -> list[str]:
    """Values (and names) that run ``touch MARK`` wherever a shell meets them unquoted, in a
    word of their own or before ``=...`` (as a name in ``export NAME=...``)."""
    m = str(mark)
    return [f"C;touch {m};D", f"C$(touch {m})D", f"C`touch {m}`D", f"C\ntouch {m}\nD", f"C'; touch {m}; 'D",
            f'C"; touch {m}; "D', f"C && touch {m};D"]


def paste(lines: list[str], tmp_path) -> tuple[list[str], dict[str, str]]:
    """Run the printed launch as a person pasting it would, with ``srun`` a printer on PATH:
    what srun was given (argv, environment). ``bash -n`` must accept the lines first."""
    script = "\n".join(lines) + "\n"
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text(PRINTER)
    (fake / "srun").chmod(0o755)
    out = tmp_path / "srun"
    subprocess.run(["bash"], input=script, text=True, capture_output=True, cwd=tmp_path, timeout=30,
                   env={"PATH": f"{fake}:/usr/bin:/bin", "HPCML_TEST_OUT": str(out)})
    argv = (tmp_path / "srun.argv").read_bytes().decode().split("\0")[:-1]
    env = dict(item.split("=", 1) for item in (tmp_path / "srun.env").read_bytes().decode().split("\0")[:-1])
    return argv, env


def test_pyxis_launch_quotes_hostile_names_and_values(tmp_path):
    """Names the EDF would refuse, built by hand: the printed lines still run nothing hidden."""
    mark = tmp_path / "marker"
    values = {f"V{i}": v for i, v in enumerate(hostile(mark))}
    names = {name: "v" for name in hostile(mark)} | {f"U;touch {mark};W": None}
    launch = render("pyxis", Environment(image="ubuntu:24.04", env=values | names), command=["echo", "$(x)"])
    argv, got = paste(launch.lines(), tmp_path)
    assert not mark.exists()
    assert argv == launch.argv[1:]
    assert {k: got[k] for k in values} == values


def test_container_script_quotes_hostile_names(tmp_path):
    """``hpcml env run``'s script in the container: a hand-built name is never shell code."""
    mark = tmp_path / "marker"
    names = {name: "${HOME}" for name in hostile(mark)}
    env = Environment(image="ubuntu:24.04", env=dict(names) | {f"GONE;touch {mark};W": None},
                      env_template=names)
    script = _wrapper(render("pyxis", env).argv)[2]
    assert subprocess.run(["bash", "-n", "-c", script], capture_output=True).returncode == 0
    subprocess.run(["/bin/sh", "-c", script, "sh", "true"], env={"HOME": "/h", "PATH": "/usr/bin:/bin"},
                   capture_output=True, cwd=tmp_path, timeout=30)
    assert not mark.exists()


def test_container_script_sets_hostile_values_exactly(tmp_path):
    mark = tmp_path / "marker"
    raw = {f"V{i}": v + "${HOME}" for i, v in enumerate(hostile(mark)) if "$(" not in v}   # $(...) is refused
    launch = render("pyxis", Environment(image="ubuntu:24.04", env=dict(raw), env_template=raw), command=["true"])
    done = subprocess.run([*_wrapper(launch.argv)[:4], shutil.which("env") or "/usr/bin/env", "-0"],
                          env={"HOME": "/h", "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=30)
    assert done.returncode == 0 and not mark.exists()
    got = dict(item.split("=", 1) for item in done.stdout.decode().split("\0")[:-1])
    assert {k: got[k] for k in raw} == {k: v.replace("${HOME}", "/h") for k, v in raw.items()}


@pytest.fixture
def env_cli(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hpcml.env.cli import app as env_app
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EDF_PATH", raising=False)
    return lambda *args: CliRunner().invoke(env_app, list(args), env={"COLUMNS": "400"})


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's."""
    import json
    return json.dumps(value)


def test_cli_render_of_hostile_values_pastes_safely(tmp_path, env_cli):
    mark = tmp_path / "marker"
    values = {f"V{i}": v for i, v in enumerate(hostile(mark)) if "$(" not in v}
    body = "".join(f"{k} = {toml_string(v)}\n" for k, v in values.items())
    (tmp_path / "h.toml").write_text(f'image = "ubuntu:24.04"\n[env]\n{body}')
    r = env_cli("render", "-r", "pyxis", "./h.toml", "--", "echo", "`touch x`")
    assert r.exit_code == 0, r.output
    argv, got = paste(r.stdout.splitlines(), tmp_path)
    assert not mark.exists() and not (tmp_path / "x").exists()
    assert {k: got[k] for k in values} == values and argv[-2:] == ["echo", "`touch x`"]


@pytest.mark.parametrize("i", range(7))
def test_cli_refuses_a_hostile_env_name_in_one_line(tmp_path, env_cli, i):
    mark = tmp_path / "marker"
    name = hostile(mark)[i]
    (tmp_path / "h.toml").write_text(f'image = "ubuntu:24.04"\n[env]\nOK = "1"\n{toml_string(name)} = "v"\n')
    for command in ("render", "validate"):
        r = env_cli(command, *(["-r", "pyxis"] if command == "render" else []), "./h.toml",
                    *(["--", "true"] if command == "render" else []))
        assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.output
        shown = repr(name)[1:-1]
        line = ":4" if "\n" not in name and '"' not in name else ""       # an escaped key: no line found
        assert f"h.toml{line}: key 'env.{shown}': not a variable name" in r.stderr
    assert not mark.exists()


def test_cli_refuses_command_substitution_in_a_value(tmp_path, env_cli):
    mark = tmp_path / "marker"
    (tmp_path / "h.toml").write_text(f'image = "ubuntu:24.04"\n[env]\nA = "$(touch {mark})"\n')
    r = env_cli("render", "-r", "pyxis", "./h.toml", "--", "true")
    assert r.exit_code == 2 and r.stdout == "" and "key 'env.A'" in r.stderr and not mark.exists()


def _getmntent(line: str, tmp_path) -> tuple[str, str, str, str]:
    """One fstab line read as enroot-mount reads it on glibc: ``setmntent`` + ``getmntent``
    (enroot's bin/compat.h maps its ``compat_getmntent_r`` to glibc's)."""
    import ctypes
    import ctypes.util

    class Mntent(ctypes.Structure):
        _fields_ = [("fsname", ctypes.c_char_p), ("dir", ctypes.c_char_p), ("type", ctypes.c_char_p),
                    ("opts", ctypes.c_char_p), ("freq", ctypes.c_int), ("passno", ctypes.c_int)]
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.setmntent.restype = ctypes.c_void_p
    libc.setmntent.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.getmntent.restype = ctypes.POINTER(Mntent)
    libc.getmntent.argtypes = [ctypes.c_void_p]
    libc.endmntent.argtypes = [ctypes.c_void_p]
    fstab = tmp_path / "fstab"
    fstab.write_text(line + "\n")
    f = libc.setmntent(str(fstab).encode(), b"r")
    try:
        m = libc.getmntent(f).contents
        return m.fsname.decode(), m.dir.decode(), m.type.decode(), m.opts.decode()
    finally:
        libc.endmntent(f)


@pytest.mark.parametrize("source, target", [
    ("/scratch/my data", "/data"), ("/a\tb", "/in side"), ("/back\\slash\\040x", "/t"), ("/plain", "/plain")])
def test_enroot_mount_paths_reach_enroot_mount_as_written(source, target, tmp_path):
    """A --mount value becomes an fstab line by enroot's ``tr ':' ' '`` (src/runtime.sh) and is
    read by getmntent: a blank in a path split it into other fields (a source ``/scratch/my``
    mounted at ``data``); now each path is one field, decoded back to itself."""
    launch = render("enroot", Environment(image="/i.sqsh", mounts=[Mount(source, target, ("ro",))]))
    value = launch.argv[launch.argv.index("--mount") + 1]
    assert _getmntent(value.replace(":", " "), tmp_path) == (source, target, "none", "x-create=auto,rbind,ro")


def test_a_relative_mount_under_a_directory_with_a_colon_is_refused():
    from hpcml.env.mounts import MountError, parse_mount
    with pytest.raises(MountError, match="':' every runtime's mount syntax reads as a separator"):
        parse_mount("./data:/data", cwd="/home/u/run:1")
    with pytest.raises(MountError, match="resolves against"):
        parse_mount("./data", cwd="/home/u/run:1")
    assert parse_mount("./data:/data", cwd="/home/u/run 1").source == "/home/u/run 1/data"


@pytest.mark.parametrize("source", ["/scratch/a$HOME", "/scratch/b`id>/tmp/x`", '/scratch/q"x"y'])
def test_pyxis_refuses_a_mount_path_its_rc_script_would_expand(source):
    """pyxis writes each mount as ``echo "SRC DST FLAGS"`` into the rc script enroot sources
    (pyxis_slurmstepd.c): ``$HOME`` was expanded, a backquote ran a command (the review's
    replay in bash). Refused in one line naming the mount; enroot itself takes them as written."""
    env = Environment(image="/i.sqsh", mounts=[Mount(source, "/data")])
    with pytest.raises(UsageError, match="pyxis writes each mount into a shell script") as err:
        render("pyxis", env)
    assert err.value.key == "mounts[0]"
    argv = render("enroot", env).argv
    assert _getmntent_fields(argv[argv.index("--mount") + 1])[0] == source


def _getmntent_fields(value: str) -> tuple[str, ...]:
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        return _getmntent(value.replace(":", " "), Path(d))


@pytest.mark.parametrize("runtime", ["enroot", "pyxis"])
@pytest.mark.parametrize("char", ["\r", "\f", "\v", "\u3000"])
def test_whitespace_enroot_refuses_is_refused_when_rendered(runtime, char):
    """enroot's runtime refuses an fstab field with whitespace other than the escaped space
    and tab (``[^[:space:]]``): said at render, naming the mount, not at launch."""
    env = Environment(image="/i.sqsh", mounts=[Mount(f"/scratch/a{char}b", "/data")])
    with pytest.raises(UsageError, match="whitespace other than a space or a tab"):
        render(runtime, env)
