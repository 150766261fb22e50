"""Hostile EDFs, written as a user writes them (a TOML file): what the launch does with
them is what the file says, in every shell a container may have as /bin/sh, or the EDF is
refused in one line naming the file and key (exit 2) before anything runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hpcml
from hpcml.env.edf import load
from hpcml.env.expand import expand
from hpcml.env.model import Environment, Mount
from hpcml.env.runtimes import RUNTIMES, get
from hpcml.errors import UsageError
from tests import needs

#: the shells a container's /bin/sh may be; ``bash --posix`` is bash as /bin/sh
SHELLS = {"sh": ["/bin/sh"], "dash": ["dash"], "bash": ["bash"], "bash --posix": ["bash", "--posix"],
          "busybox sh": ["busybox", "sh"]}
NEEDS = {"dash": "dash", "bash": "bash", "busybox": "busybox-static"}


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's."""
    return json.dumps(value)


def write_edf(path: Path, image: str, env: dict[str, str] | None = None, **top: object) -> Path:
    lines = [f"image = {toml_string(image)}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    if env:
        lines += ["[env]"] + [f"{k} = {toml_string(v)}" for k, v in env.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def container_script(launch_argv: list[str]) -> list[str]:
    """``/bin/sh -c SCRIPT sh`` of a launch: what the container's shell runs."""
    i = launch_argv.index("/bin/sh")
    return launch_argv[i + 1:i + 4]


# ---------------------------------------------------------------- [env] defaults in every shell

#: characters and words that mean something to some shell somewhere in a word
PIECES = ["'", '"', "\\", "$", "`", "}", "\n", "${C}", "a  b", "'\"", "\\'", "$$", "*", "~", "#",
          "`touch MARK`", "'; touch MARK; '", '"; touch MARK; "', "${C:-'}"]


def hostile_values(mark: Path) -> dict[str, str]:
    """[env] values that reference variables, with the pieces in defaults and around them
    (B is unset in the container, E empty, C set to something hostile itself)."""
    forms = ["${{B:-{h}}}", "${{B-{h}}}", "${{E:-{h}}}", "${{E-{h}}}", "${{C:-{h}}}", "x{h}${{C}}{h}$-",
             "${{B:-{h}${{B-{h}}}}}", "{h}${{B:-}}{h}"]
    pieces = [p.replace("MARK", str(mark)) for p in PIECES]
    return {f"V{i}": form.format(h=h) for i, (form, h) in enumerate((f, h) for f in forms for h in pieces)}


def shell(name: str) -> list[str]:
    argv = SHELLS[name]
    needs.tool(argv[0], NEEDS.get(argv[0]))
    return argv


@pytest.mark.parametrize("name", list(SHELLS))
def test_env_defaults_mean_the_same_in_every_shell(tmp_path, name):
    """The review's repro (``A = "${B:-'}"``, then a literal that is shell code if a quote
    is left open: bash ran it, dash did not) and every piece in every form: each value set
    in the container is ``expand``'s, byte for byte, and nothing else runs."""
    argv = shell(name)
    mark = tmp_path / "pwned"
    templates = hostile_values(mark)
    literals = {"Z": f'}}"; touch {mark}; #', "Y": f"'; touch {mark}; '", "X": f'"; touch {mark}; "'}
    edf = write_edf(tmp_path / "h.toml", "/images/rootfs", {"A": "${B:-'}"} | templates | literals)
    env = load(str(edf), environ={"HOME": str(tmp_path)}, cwd=str(tmp_path)).env
    assert "A" in env.env_template and len(env.env_template) > 100       # the rest are literals after $$
    container = {"C": "c'\"$`\\ }\n*", "E": "", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    launch = get("bubblewrap").render(env, [shutil.which("env") or "/usr/bin/env", "-0"], environ={}, scratch="/s")
    done = subprocess.run([*argv, *container_script(launch.argv), *launch.argv[-2:]], env=container,
                          capture_output=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert not mark.exists()
    got = dict(item.split("=", 1) for item in done.stdout.decode().split("\0")[:-1])
    want = {k: expand(v, container) for k, v in ({"A": "${B:-'}"} | templates).items()} | literals
    assert {k: got.get(k) for k in want} == want
    assert got["A"] == "'" and not any(k.startswith("_hpcml") for k in got)


@pytest.mark.parametrize("name", list(SHELLS))
def test_an_undefined_variable_fails_the_start_only_where_it_is_used(tmp_path, name):
    """A default is evaluated only when used, as ``expand`` does: ``${C:-${NOPE}}`` with C
    set starts, ``${B:-${NOPE}}`` with B unset does not, in every shell."""
    argv = shell(name)
    container = {"C": "c", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for raw, ok in (("${C:-${NOPE}}", True), ("${B:-${NOPE}}", False), ("${B:-x}${NOPE}", False)):
        env = load(str(write_edf(tmp_path / "u.toml", "/images/rootfs", {"A": raw})), environ={},
                   cwd=str(tmp_path)).env
        launch = get("bubblewrap").render(env, ["true"], environ={}, scratch="/s")
        done = subprocess.run([*argv, *container_script(launch.argv), shutil.which("true") or "/bin/true"],
                              env=container, capture_output=True, text=True, timeout=60)
        assert (done.returncode == 0) == ok, (raw, done.stderr)
        if not ok:
            assert "NOPE" in done.stderr and "undefined on the host and in the image" in done.stderr


# ---------------------------------------------------------------- refused in one line

@pytest.fixture
def env_cli(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hpcml.env.cli import app as env_app
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EDF_PATH", raising=False)
    return lambda *args: CliRunner().invoke(env_app, list(args), env={"COLUMNS": "400"})


def refused(result, where: str, words: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr naming ``where`` (file and key)."""
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and where in result.stderr and words in result.stderr, result.stderr
    assert "Traceback" not in result.output


def test_enroot_refuses_a_newline_in_an_env_value(tmp_path, env_cli):
    """enroot joins ``-e`` values with newlines and reads them back line by line: the
    second line would set LD_PRELOAD in the container."""
    write_edf(tmp_path / "nl.toml", "/img/x.sqsh", {"OK": "1", "A": "x\nLD_PRELOAD=/tmp/evil.so"})
    r = env_cli("render", "-r", "enroot", "./nl.toml", "--", "true")
    refused(r, f"{tmp_path / 'nl.toml'}: key 'env.A'", "a newline in the value")
    assert "LD_PRELOAD" not in r.stdout
    for runtime in ("bubblewrap", "pyxis"):           # their values are not split on lines
        assert env_cli("render", "-r", runtime, "./nl.toml", "--", "true").exit_code == 0
    env = Environment(image="/img/x.sqsh", mounts=[Mount("/a\n/b", "/m")])
    with pytest.raises(UsageError, match=r"key 'mounts\[0\]': a newline"):
        get("enroot").render(env, ["true"], environ={}, scratch="/s")


def test_enroot_sets_a_multi_line_template_value_in_the_container(tmp_path):
    """A value that references variables is set by the container's shell, not with ``-e``:
    its newline is data there."""
    edf = write_edf(tmp_path / "t.toml", "/img/x.sqsh", {"A": "${C}\nLD_PRELOAD=x"})
    env = load(str(edf), environ={}, cwd=str(tmp_path)).env
    launch = get("enroot").render(env, ["true"], environ={}, scratch="/s")
    assert not any(a.startswith("A=") or a.startswith("LD_PRELOAD") for a in launch.argv)
    done = subprocess.run(["/bin/sh", *container_script(launch.argv), shutil.which("env") or "/usr/bin/env", "-0"],
                          env={"C": "c"}, capture_output=True, text=True, timeout=60)
    got = dict(item.split("=", 1) for item in done.stdout.split("\0")[:-1])
    assert got["A"] == "c\nLD_PRELOAD=x" and "LD_PRELOAD" not in got


@pytest.mark.parametrize("image", ["--rc=/tmp/evil.sqsh", "-x", "${IMG}"])
def test_an_image_starting_with_a_dash_is_refused(tmp_path, env_cli, monkeypatch, image):
    """``enroot start --rc=/tmp/evil.sqsh`` would run that file as enroot's rc script."""
    monkeypatch.setenv("IMG", "--rc=/tmp/evil.sqsh")
    write_edf(tmp_path / "i.toml", image)
    refused(env_cli("validate", "./i.toml"), f"{tmp_path / 'i.toml'}:1: key 'image'", "starts with '-'")
    for runtime in RUNTIMES:
        r = env_cli("render", "-r", runtime, "./i.toml", "--", "true")
        refused(r, f"{tmp_path / 'i.toml'}:1: key 'image'", "starts with '-'")


def test_an_image_file_named_with_a_dash_is_written_dot_slash(tmp_path, env_cli):
    """The way out the message gives: ``./-NAME`` is a path, made absolute."""
    write_edf(tmp_path / "i.toml", "./--rc=evil.sqsh")
    r = env_cli("render", "-r", "enroot", "--json", "./i.toml", "--", "true")
    assert r.exit_code == 0, r.output
    argv = json.loads(r.stdout)["argv"]
    assert str(tmp_path / "--rc=evil.sqsh") in argv and not any(a.startswith("--rc") for a in argv)


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_a_hand_built_environment_with_a_dash_image_is_refused_at_render(runtime):
    with pytest.raises(UsageError, match="key 'image': '-x.sqsh' starts with '-'"):
        get(runtime).render(Environment(image="-x.sqsh"), ["true"], environ={}, scratch="/s")


def test_pyxis_refuses_a_comma_in_a_mount(tmp_path, env_cli):
    """pyxis splits ``--container-mounts`` at ','; ``/scratch/data,/etc:/secrets`` would
    also mount the host's /etc at /secrets."""
    write_edf(tmp_path / "c.toml", "ubuntu:24.04", mounts=["/scratch/out:/out", "/scratch/data,/etc:/secrets:ro"])
    assert env_cli("validate", "./c.toml").exit_code == 0        # fine for the other runtimes
    r = env_cli("render", "-r", "pyxis", "./c.toml", "--", "true")
    refused(r, f"{tmp_path / 'c.toml'}: key 'mounts[1]'", "pyxis splits --container-mounts at ','")
    assert env_cli("render", "-r", "podman", "./c.toml", "--", "true").exit_code == 0


@pytest.mark.parametrize("key, body", [
    ("env.A", '[env]\nA = "x\\u0000y"\n'),
    ("mounts[0]", 'mounts = ["/tmp/a\\u0000b:/x"]\n'),
    ("workdir", 'workdir = "/w\\u0000"\n'),
    ("image", 'image = "/img/x\\u0000.sqsh"\n'),
    ("devices[0]", 'devices = ["/dev/x\\u0000"]\n'),
    ("annotations.com.hpcml.startup", '[annotations]\n"com.hpcml.startup" = "echo \\u0000"\n'),
])
def test_a_nul_is_refused_at_validation(tmp_path, env_cli, key, body):
    top = "" if key == "image" else 'image = "/img/x.sqsh"\n'
    (tmp_path / "n.toml").write_text(top + body)
    for args in (["validate", "./n.toml"], ["render", "-r", "bubblewrap", "./n.toml", "--", "true"]):
        refused(env_cli(*args), f"key '{key}'", "NUL character")


def test_env_run_of_a_nul_is_one_line_not_a_traceback(tmp_path):
    """``hpcml env run`` (its fast path, the review's repro): exit 2 before anything runs."""
    (tmp_path / "n.toml").write_text(f'image = {toml_string(str(tmp_path))}\n[env]\nA = "x\\u0000y"\n')
    src = str(Path(hpcml.__file__).resolve().parents[1])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "hpcml", "env", "run", "-r", "bubblewrap", "./n.toml", "--", "true"],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "n.toml:3: key 'env.A': contains a NUL character" in done.stderr


@pytest.mark.parametrize("workdir", ["-x", "-"])
def test_a_relative_workdir_that_looks_like_an_option_is_a_directory(tmp_path, workdir):
    """The wrapper's ``cd`` took a workdir ``-x`` as its option and ``-`` as the previous
    directory: run through the real /bin/sh, the command starts in the directory named."""
    from hpcml.env.runtimes.base import wrap_command
    (tmp_path / workdir).mkdir()
    argv = wrap_command(Environment(image="/img.sqsh"), ["pwd"], workdir=workdir)
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / workdir), (out.stdout, out.stderr)
