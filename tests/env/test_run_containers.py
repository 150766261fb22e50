"""End to end: Environments run through real bubblewrap and podman (charliecloud too when
installed) on a busybox root filesystem built by the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.env.model import STARTUP, VENV, Environment, Mount
from hpcml.env.run import run
from tests.env import rootfs


@pytest.fixture(params=["bubblewrap", "podman", "charliecloud"])
def runtime(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(runtime name, image) for each runtime under test."""
    monkeypatch.setenv("USER", os.environ.get("USER", "root"))     # ch-run refuses to start without it
    return request.param, request.getfixturevalue(f"{request.param}_image")


def sh(env: Environment, runtime: str, script: str) -> int:
    return run(env, ["/bin/sh", "-c", script], runtime)


def test_mounts_visible_and_read_only_mount_refuses_writes(runtime, tmp_path, capfd):
    name, image = runtime
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    (ro / "f").write_text("from host\n")
    env = Environment(image=image, mounts=[Mount(str(rw), "/data"), Mount(str(ro), "/mnt", ("ro",))])
    code = sh(env, name, "cat /mnt/f && touch /data/new && if touch /mnt/x; then echo WROTE; fi")
    out = capfd.readouterr().out
    assert code == 0
    assert "from host" in out
    assert (rw / "new").exists()
    if name == "charliecloud":          # ch-run has no read-only bind; render notes it
        return
    assert "WROTE" not in out and not (ro / "x").exists()


def test_workdir(runtime, capfd):
    name, image = runtime
    assert sh(Environment(image=image, workdir="/work"), name, "pwd") == 0
    assert capfd.readouterr().out.strip().splitlines()[-1] == "/work"


def test_env_set_unset_and_task_variables_reach_the_container(runtime, monkeypatch, capfd):
    name, image = runtime
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_HPCML_DROP", "host")
    env = Environment(image=image, env={"HPCML_SET": "edf value", "SLURM_HPCML_DROP": None})
    code = sh(env, name, 'echo "set=$HPCML_SET procid=$SLURM_PROCID drop=${SLURM_HPCML_DROP-absent} '
                         'nousersite=$PYTHONNOUSERSITE"')
    assert code == 0
    assert capfd.readouterr().out.strip().splitlines()[-1] == \
        "set=edf value procid=3 drop=absent nousersite=1"


def test_read_only_root_refuses_writes(runtime, capfd):
    name, image = runtime
    env = Environment(image=image, writable=False)
    assert sh(env, name, "touch /hpcml-probe") != 0
    assert not Path(image, "hpcml-probe").exists() if name != "podman" else True


def test_exit_code_propagated(runtime):
    name, image = runtime
    assert sh(Environment(image=image), name, "exit 7") == 7


def test_startup_and_venv_wrapper(runtime, tmp_path, capfd):
    name, image = runtime
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text('export VIRTUAL_ENV=/mnt/venv\n')
    env = Environment(image=image, mounts=[Mount(str(tmp_path), "/mnt", ("ro",))],
                      annotations={STARTUP: "export FROM_STARTUP=yes\ncd /tmp", VENV: "/mnt/venv"})
    assert run(env, ["/bin/sh", "-c", 'echo "$FROM_STARTUP $VIRTUAL_ENV $(pwd)"'], name) == 0
    assert capfd.readouterr().out.strip().splitlines()[-1] == "yes /mnt/venv /tmp"


def test_podman_edf_env_overrides_image(podman_image, capfd):
    script = ["/bin/sh", "-c", "echo $IMAGE_VAR"]
    assert run(Environment(image=podman_image), script, "podman") == 0
    assert run(Environment(image=podman_image, env={"IMAGE_VAR": "from-edf"}), script, "podman") == 0
    assert run(Environment(image=podman_image, env={"IMAGE_VAR": None}), ["/bin/sh", "-c", "echo ${IMAGE_VAR-unset}"],
               "podman") == 0
    assert capfd.readouterr().out.split() == ["from-image", "from-edf", "unset"]


def test_podman_writable_root(podman_image):
    assert run(Environment(image=podman_image, writable=True), ["/bin/sh", "-c", "touch /x"], "podman") == 0


def test_cli_run_and_render(bubblewrap_image, tmp_path, capfd):
    from typer.testing import CliRunner

    from hpcml.env.cli import app
    edf = tmp_path / "env.toml"
    edf.write_text(f'image = "{bubblewrap_image}"\nworkdir = "/work"\n[env]\nHPCML_CLI = "yes"\n')
    result = CliRunner().invoke(app, ["run", "--runtime", "bubblewrap", str(edf), "--", "sh", "-c", "exit 5"])
    assert result.exit_code == 5, result.output
    result = CliRunner().invoke(app, ["render", "--runtime", "bubblewrap", str(edf), "--", "pwd"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert f"bwrap --bind {bubblewrap_image} / --proc /proc --dev /dev --chdir /work --setenv HPCML_CLI yes " \
           "--setenv PYTHONNOUSERSITE 1 --die-with-parent --unshare-pid pwd" in lines
    assert any(line.startswith("# note: writable root filesystem directory") for line in lines)
    result = CliRunner().invoke(app, ["run", "--runtime", "nosuch", str(edf), "--", "true"])
    assert result.exit_code == 2
    assert "unknown runtime 'nosuch'" in result.output


@pytest.fixture(scope="session")
def squashfs_image(bubblewrap_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    for tool, package in (("mksquashfs", "squashfs-tools"), ("squashfuse", "squashfuse"),
                          ("fuse-overlayfs", "fuse-overlayfs")):
        rootfs.ensure(tool, package)
    image = tmp_path_factory.mktemp("sqsh") / "root.sqsh"
    subprocess.run(["mksquashfs", bubblewrap_image, str(image), "-quiet", "-noappend"], check=True,
                   capture_output=True)
    return str(image)


@pytest.mark.parametrize("writable", [False, True])
def test_bubblewrap_squashfs_image_mounted_and_cleaned_up(squashfs_image, writable, tmp_path, capfd):
    scratch = tmp_path / "scratch"
    env = Environment(image=squashfs_image, writable=writable, workdir="/work")
    from hpcml.env.runtimes.bubblewrap import Bubblewrap
    launch = Bubblewrap().render(env, ["/bin/sh", "-c", "touch /written && pwd"], scratch=str(scratch))
    code = subprocess.run(["sh", "-c", " && ".join(launch.lines()[:-len(launch.cleanup)])]).returncode
    for step in launch.cleanup:
        subprocess.run(step, check=True)
    assert code == (0 if writable else 1)
    assert not scratch.exists()
    # and through run(), which prepares and cleans up itself
    assert run(env, ["/bin/sh", "-c", "pwd"], "bubblewrap") == 0
    assert capfd.readouterr().out.strip().splitlines()[-1] == "/work"


@pytest.mark.slurm
@pytest.mark.parametrize("name", ["bubblewrap", "podman"])
def test_srun_one_container_per_task_with_its_slurm_variables(name, slurm_env, request, tmp_path):
    image = request.getfixturevalue(f"{name}_image")
    edf = tmp_path / "env.toml"
    edf.write_text(f'image = "{image}"\n')
    task = "echo task=$SLURM_PROCID of=$SLURM_NTASKS node=$SLURMD_NODENAME; exit $SLURM_PROCID"
    env = dict(slurm_env, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", ""))
    proc = subprocess.run(["srun", "-N2", "-n2", "--kill-on-bad-exit=0", sys.executable, "-m", "hpcml", "env", "run",
                           "--runtime", name, str(edf), "--", "/bin/sh", "-c", task],
                          env=env, capture_output=True, text=True, timeout=120)
    lines = sorted(proc.stdout.split("\n"))[-2:]
    assert lines == ["task=0 of=2 node=n1", "task=1 of=2 node=n2"], proc.stderr
    assert proc.returncode == 1           # task 1's container exited 1; srun reports it


# -- issue 19: the recorder and the container, in either order --------------------------------------

APP = ("from hpcml import observe\n"
       "for s in range(20):\n"
       "    with observe.section('step', step=s):\n"
       "        pass\n"
       "    observe.log(step=s, loss=1.0 / (s + 1))\n")


@pytest.mark.parametrize("order", ["record-outside", "record-inside"])
def test_application_metrics_are_recorded_whichever_wrapper_is_outside(order, tmp_path):
    """`hpcml observe record -- hpcml env run EDF -- python train.py` recorded 0 application
    rows: the recorder's pipe does not reach into a container. The image here is the host's
    own root filesystem under bubblewrap (read-only), so the container has this Python and
    hpcml; its /tmp is the container's own, so the job directory must be carried in."""
    rootfs.ensure("bwrap", "bubblewrap")
    d = tmp_path / "obs"
    edf = rootfs.host_root_edf(tmp_path / "host.toml", *([d] if order == "record-inside" else []))
    d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_OBSERVE"))}
    hp = [sys.executable, "-m", "hpcml"]
    app = [sys.executable, "-c", APP]
    record = [*hp, "observe", "record", "--dir", str(d), "--interval", "0.2", "--"]
    container = [*hp, "env", "run", "--runtime", "bubblewrap", str(edf), "--"]
    argv = record + container + app if order == "record-outside" else container + record + app
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    from hpcml.observe.store import read_job
    t = read_job(d).table
    kinds = t["kind"].to_pylist()
    assert kinds.count("section") == 20 and kinds.count("metric") == 20, sorted(set(kinds))


def test_hpcml_run_env_runs_the_ranks_in_the_container_and_tags_env_json(tmp_path):
    """``hpcml run --env EDF``: the rank runs in the container (this host's /tmp is not its
    /tmp) and the job directory's env.json leads with its schema tag (issue 29: it had none);
    a requeue noted in the container reaches the job directory on the host."""
    rootfs.ensure("bwrap", "bubblewrap")
    edf = rootfs.host_root_edf(tmp_path / "host.toml")
    (tmp_path / "only-on-the-host").touch()
    probe = (f"import os; print('host file seen:', os.path.exists('{tmp_path}/only-on-the-host'));"
             "from hpcml.cluster import requeue; requeue.note(5, 'SIGUSR1', '/ckpt')")   # what a Checkpointer's requeue does
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_"))}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--dir", str(tmp_path / "job"), "--env", str(edf),
                        "--", sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "job" / "logs" / "rank-00000.out").read_text().strip() == "host file seen: False"
    doc = json.loads((tmp_path / "job" / "env.json").read_text())
    assert next(iter(doc)) == "schema" and doc["schema"] == "hpcml.run.env/1"
    assert doc["resolved"]["schema"] == "hpcml.env.edf/1" and doc["resolved"]["file"] == str(edf)
    note = json.loads((tmp_path / "job" / "requeued.json").read_text())   # on the host, not in the container's /tmp
    assert (note["step"], note["signal"]) == (5, "SIGUSR1")


def test_podman_failing_to_start_the_container_is_exit_1_not_125(tmp_path):
    """Issue 19: an image podman cannot pull exited 125, which the README's table does not know."""
    rootfs.ensure("podman", "podman")
    edf = tmp_path / "missing.toml"
    edf.write_text('image = "localhost/hpcml-does-not-exist:0"\n')
    p = subprocess.run([sys.executable, "-m", "hpcml", "env", "run", "--runtime", "podman", str(edf), "--", "/bin/true"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "CONTAINERS_REGISTRIES_CONF": "/dev/null"})
    assert p.returncode == 1, (p.returncode, p.stderr[-500:])
    assert "podman could not start the container" in p.stderr


def test_podman_env_template_resolves_against_the_image_then_the_host(podman_image, monkeypatch, capfd):
    """CSCS: ``${VAR}`` in [env] is the container's value (the image's over the host's)."""
    monkeypatch.setenv("IMAGE_VAR", "from-host")
    monkeypatch.setenv("HPCML_HOST_ONLY", "host-only")
    env = Environment(image=podman_image, env={"A": "", "B": ""},
                      env_template={"A": "${IMAGE_VAR}:x", "B": "${HPCML_HOST_ONLY}:y"})
    assert run(env, ["/bin/sh", "-c", 'echo "A=$A B=$B leak=${HPCML_HOST_ONLY-none}"'], "podman") == 0
    assert capfd.readouterr().out.strip().splitlines()[-1] == "A=from-image:x B=host-only:y leak=none"
