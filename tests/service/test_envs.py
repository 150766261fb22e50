"""Where a Python service's venv is built (MLflow's first build: 280 s, 851 MB, in a home
that on a cluster has a small quota), how to move it, and that ``up`` says so before it
builds. The venvs built here are real (``python -m venv`` + ``pip install pip``: offline,
seconds); MLflow's own is never built by these tests."""

from __future__ import annotations

import os

import pytest

from hpcml.errors import UsageError
from hpcml.service import envs
from hpcml.service.envs import build_note, ensure_env, env_key, env_path, envs_location
from tests.service.mlflow_server import ROOT, hpcml

VARS = ("HPCML_SERVICE_ENVS", "HPCML_CACHE_DIR", "XDG_CACHE_HOME")


@pytest.fixture
def clean(monkeypatch, tmp_path):
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_the_cache_is_under_home_unless_a_variable_moves_it(clean, tmp_path):
    assert envs_location() == (tmp_path / "home" / ".cache" / "hpcml" / "service-envs", "default")
    clean.setenv("XDG_CACHE_HOME", "relative/cache")           # the XDG spec: a relative one is ignored
    assert envs_location()[1] == "default"
    clean.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert envs_location() == (tmp_path / "xdg" / "hpcml" / "service-envs", "XDG_CACHE_HOME")
    clean.setenv("HPCML_CACHE_DIR", str(tmp_path / "project" / "cache"))
    assert envs_location() == (tmp_path / "project" / "cache" / "service-envs", "HPCML_CACHE_DIR")
    clean.setenv("HPCML_SERVICE_ENVS", str(tmp_path / "envs"))
    assert envs_location() == (tmp_path / "envs", "HPCML_SERVICE_ENVS")
    assert env_path("mlflow", ["mlflow==3.17.2"]) == tmp_path / "envs" / f"mlflow-{env_key(['mlflow==3.17.2'])}"


def test_a_relative_or_tilde_cache_dir_becomes_absolute(clean, tmp_path):
    """A venv's scripts carry its absolute path, and ``up`` runs the service from its state
    directory: a relative root would name another place there."""
    clean.chdir(tmp_path)
    clean.setenv("HPCML_CACHE_DIR", "scratch/c")
    assert envs_location()[0] == tmp_path / "scratch" / "c" / "service-envs"
    clean.setenv("HPCML_CACHE_DIR", "~/c")
    assert envs_location()[0] == tmp_path / "home" / "c" / "service-envs"


def test_the_note_says_where_what_it_costs_and_how_to_move_it(clean, tmp_path):
    clean.setenv("HPCML_CACHE_DIR", str(tmp_path / "c"))
    note = build_note("mlflow", ["mlflow==3.17.2"])
    assert str(env_path("mlflow", ["mlflow==3.17.2"])) in note and "(from HPCML_CACHE_DIR)" in note
    assert "minutes" in note and "1 GB" in note and "280 s and 851 MB" in note and "mlflow==3.17.2" in note
    assert "set HPCML_CACHE_DIR" in note and "\n" not in note
    assert "free there" not in note
    clean.setattr(envs, "LOW_SPACE", 1 << 62)                   # a full filesystem, without filling one
    assert "GiB free there" in build_note("mlflow", ["mlflow==3.17.2"])


def test_ensure_env_says_where_before_it_builds_there_and_only_once(clean, tmp_path):
    clean.setenv("HPCML_CACHE_DIR", str(tmp_path / "c"))
    path = env_path("web", ["pip"])
    said: list[tuple[str, bool]] = []
    log = tmp_path / "service.log"
    got = ensure_env("web", ["pip"], log=log, say=lambda line: said.append((line, path.exists())))
    assert got == path and path.is_relative_to(tmp_path / "c" / "service-envs")
    assert (path / "bin" / "python").exists() and (path / ".hpcml-complete").is_file()
    assert len(said) == 1 and said[0] == (build_note("web", ["pip"]), False)     # said before anything was built
    assert log.read_text().startswith(f"== hpcml service: {said[0][0]}\n")
    ensure_env("web", ["pip"], say=lambda line: said.append((line, True)))
    assert len(said) == 1                                       # built: nothing to say


def test_a_cache_dir_that_cannot_hold_it_is_one_line_naming_the_variable(clean, tmp_path):
    (tmp_path / "file").write_text("")
    clean.setenv("HPCML_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(UsageError) as exc:
        ensure_env("web", ["pip"], say=None)
    assert str(exc.value).startswith(f"HPCML_CACHE_DIR={tmp_path / 'file'}: cannot create ")
    assert "\n" not in str(exc.value)


WEB = """name: web
description: a static web server
python: {packages: [pip]}
command: [python, -m, http.server, "${port.http}", --bind, "${host}"]
ports: [{name: http, port: 8000}]
health: {port: http, http: /, timeout: 120 s}
"""


def test_up_prints_where_it_builds_before_building(tmp_path):
    """The CLI end to end: ``up`` under HPCML_CACHE_DIR builds there, after saying so on
    stderr (stdout stays the service's address); the second ``up`` says nothing of it."""
    bp = tmp_path / "web.yaml"
    bp.write_text(WEB)
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env |= {"HPCML_CACHE_DIR": str(tmp_path / "cache"), "HPCML_SERVICE_STATE": str(tmp_path / "state"),
            "PYTHONPATH": str(ROOT / "src")}
    try:
        out = hpcml(["service", "up", str(bp)], env)
        assert out.returncode == 0, out.stderr
        note = [line for line in out.stderr.splitlines() if line.startswith("hpcml service: building web's")]
        assert len(note) == 1 and f"{tmp_path / 'cache' / 'service-envs'}/web-" in note[0], out.stderr
        assert "minutes" in note[0] and "HPCML_CACHE_DIR" in note[0]
        assert out.stdout.startswith("web: http http://127.0.0.1:")
        built = [p for p in (tmp_path / "cache" / "service-envs").iterdir() if not p.name.startswith(".")]   # .NAME.lock
        assert len(built) == 1 and (built[0] / ".hpcml-complete").is_file()
        log = (tmp_path / "state" / "web" / "service.log").read_text()
        assert log.startswith("== hpcml service: building web's"), log[:300]
        out = hpcml(["service", "down", "web"], env)
        assert out.returncode == 0, out.stderr
        out = hpcml(["service", "up", str(bp)], env)
        assert out.returncode == 0 and "building" not in out.stderr, out.stderr
    finally:
        hpcml(["service", "down", "web"], env)


def test_the_docs_say_where_how_big_how_long_and_how_to_move_it():
    text = (ROOT / "docs" / "service.md").read_text()
    for words in ("HPCML_CACHE_DIR", "~/.cache/hpcml/service-envs", "851 MB", "280 s", "XDG_CACHE_HOME"):
        assert words in text, words
    assert "HPCML_CACHE_DIR" in (ROOT / "docs" / "environment.md").read_text()



def test_up_slurm_says_the_job_builds_it_first(clean, tmp_path, capsys):
    """``up --slurm`` of a service whose venv is not built yet says, before it submits, that
    the job builds it first and may outlast ``--wait``. sbatch is replaced by a stub that
    stops the submission (a real Slurm job would build the real venv on its node)."""
    from hpcml.service import slurm as service_slurm
    from hpcml.service.blueprint import loads

    class Submitted(Exception):
        pass

    def sbatch(argv, **kw):
        raise Submitted(argv[0])

    clean.setenv("HPCML_CACHE_DIR", str(tmp_path / "c"))
    clean.setattr(service_slurm.slurm, "run", sbatch)
    bp = loads(WEB, "web.yaml")
    with pytest.raises(Submitted):
        service_slurm.submit(bp, "web.yaml", "web", tmp_path / "state", options={}, wait=300)
    err = capsys.readouterr().err
    assert err.startswith("hpcml service: the service job first builds web's Python environment"), err
    assert str(env_path("web", ["pip"])) in err and "up waits 300 s" in err and "hpcml service status web" in err
    ensure_env("web", ["pip"], say=None)                       # built: nothing said
    with pytest.raises(Submitted):
        service_slurm.submit(bp, "web.yaml", "web", tmp_path / "state", options={}, wait=300)
    assert capsys.readouterr().err == ""


def test_two_ups_that_find_it_missing_at_once_build_it_once_and_both_get_it(clean, tmp_path):
    """Two real processes ask for the same missing environment at the same moment (two
    ``service up``; two test workers): one builds it, the other waits and finds it built.
    Unguarded, each said it was building and ran ``venv --clear`` on the other's half."""
    import subprocess
    import sys
    clean.setenv("HPCML_CACHE_DIR", str(tmp_path / "c"))
    go = tmp_path / "go"
    code = ("import os, sys, time\n"
            "from hpcml.service.envs import ensure_env\n"
            f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
            "said = []\n"
            "path = ensure_env('web', ['pip'], say=said.append)\n"
            "print(len(said), path, flush=True)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(2)]
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    said = sorted(int(out.split()[0]) for out, _ in outs)
    assert said == [0, 1], outs                                  # one built it, one found it built
    path = env_path("web", ["pip"])
    assert {out.split()[1] for out, _ in outs} == {str(path)} and envs.is_built("web", ["pip"])
    assert subprocess.run([str(path / "bin" / "python"), "-m", "pip", "--version"], capture_output=True,
                          timeout=120).returncode == 0
