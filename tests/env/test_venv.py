"""``hpcml env venv``: a venv created inside the image's Python, then activated by
``com.hpcml.venv``. The image is a root filesystem directory with the host's /usr, /lib,
/lib64, /bin and /etc bound read-only (so Debian's python3 runs inside), run by bubblewrap."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcml.env.cli import app as env_app
from hpcml.env.model import VENV, Environment, Mount
from hpcml.env.venv import VenvError, create_venv, execute
from tests import needs
from tests.env.rootfs import ensure

SYSTEM = ("usr", "lib", "lib64", "bin", "etc")
PROBE = ("import json, site, sys\n"
         "try:\n    import hpcml_only_in_venv as m; value = m.VALUE\n"
         "except ImportError:\n    value = None\n"
         "print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix, 'value': value,"
         " 'user_site': site.ENABLE_USER_SITE}))")


@pytest.fixture(scope="module")
def host_python() -> None:
    ensure("bwrap", "bubblewrap")
    if subprocess.run(["/usr/bin/python3", "-m", "venv", "--help"], capture_output=True).returncode != 0 \
            or subprocess.run(["/usr/bin/python3", "-c", "import ensurepip"], capture_output=True).returncode != 0:
        needs.missing("python3-venv", "Debian's python3 has no venv/ensurepip (scripts/test installs python3-venv)")


@pytest.fixture
def image_env(tmp_path: Path, host_python) -> Environment:
    root = tmp_path / "rootfs"
    for d in (*SYSTEM, "tmp", "proc", "dev"):
        (root / d).mkdir(parents=True)
    return Environment(image=str(root), mounts=[Mount(f"/{d}", f"/{d}", ("ro",)) for d in SYSTEM],
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": None, "PYTHONHOME": None})


def _probe(env: Environment, python: str = "python") -> dict:
    proc = execute(env, [python, "-c", PROBE], runtime="bubblewrap", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_venv_layered_on_image_python(image_env, tmp_path):
    path = tmp_path / "shared" / "venvs" / "proj"
    result = create_venv(image_env, path, runtime="bubblewrap")
    assert result.path == str(path) and result.runtime == "bubblewrap" and not result.mounted
    assert result.edf_lines()[-2:] == ["[annotations]", f'com.hpcml.venv = "{path}"']
    cfg = (path / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in cfg
    site_packages = list(path.glob("lib/python3*/site-packages"))
    assert len(site_packages) == 1
    (site_packages[0] / "hpcml_only_in_venv.py").write_text("VALUE = 42\n")

    plain = dataclasses.replace(image_env, mounts=[*image_env.mounts, Mount(str(path), str(path))])
    before = _probe(plain, "python3")                        # the image's Python, no venv
    assert before["prefix"] == "/usr" and before["value"] is None

    active = dataclasses.replace(plain, annotations={VENV: str(path)})
    inside = _probe(active)
    assert inside["prefix"] == str(path)
    assert inside["base"] == "/usr"                          # layered on the image's interpreter
    assert inside["value"] == 42
    assert inside["user_site"] is False                      # PYTHONNOUSERSITE
    kept = _probe(dataclasses.replace(active, annotations={VENV: str(path), "com.hpcml.user_site": "true"}))
    assert kept["prefix"] == str(path) and kept["user_site"] is True


def test_venv_fails_without_python_in_image(tmp_path, host_python):
    root = tmp_path / "rootfs"
    for d in ("bin", "lib", "lib64", "usr", "tmp", "proc", "dev"):
        (root / d).mkdir(parents=True)
    # a shell but no python3: only /bin -> usr/bin is missing, so bind just the loader and libc dirs
    env = Environment(image=str(root), mounts=[Mount("/lib", "/lib", ("ro",)), Mount("/lib64", "/lib64", ("ro",))],
                      env={"PATH": "/usr/bin:/bin"})
    with pytest.raises(VenvError, match="python3 -m venv failed"):
        create_venv(env, tmp_path / "v", runtime="bubblewrap")
    assert not (tmp_path / "v" / "pyvenv.cfg").exists()


def test_cli_prints_edf_lines(image_env, tmp_path):
    mounts = ", ".join(f'"{m.spec()}"' for m in image_env.mounts)
    edf = tmp_path / "img.toml"
    edf.write_text(f'image = "{image_env.image}"\nmounts = [{mounts}]\n[env]\nPATH = "/usr/bin:/bin"\n')
    app = env_app
    path = tmp_path / "v"
    r = CliRunner().invoke(app, ["venv", str(edf), str(path), "--runtime", "bubblewrap"])
    assert r.exit_code == 0, r.output
    assert f'com.hpcml.venv = "{path}"' in r.output and f'"{path}:{path}"' in r.output
    assert (path / "pyvenv.cfg").is_file()
    r = CliRunner().invoke(app, ["venv", str(edf), str(path), "--runtime", "docker"])
    assert r.exit_code == 2
