"""``hpcml service`` with blueprints and flags from someone else: no path leaves its root, one
``up`` per instance, ``down`` signals only the service, Ctrl-C stops what ``up`` started.

The services here are ``python -m http.server`` in a venv of nothing but pip (built once,
offline, cached like a real service's venv): real processes, real ports, seconds each.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from hpcml.errors import UsageError
from hpcml.files import load_toml
from hpcml.service import local
from hpcml.service.blueprint import loads
from hpcml.service.envs import ensure_env
from tests.service.mlflow_server import ROOT, hpcml, state

SERVER = """name: web
description: a static web server
python: {packages: [pip]}
command: [sh, -c, "sleep ${options.delay}; exec python -m http.server ${port.http} --bind ${host} --directory ${volumes.www}"]
options: {delay: "0"}
ports: [{name: http, port: 8000}]
volumes: [{name: www, mount: /www, size: 1 MiB}]
files: [{name: conf, mount: /conf, content: {"site.conf": "x"}}]
health: {port: http, http: /, timeout: 120 s}
"""


@pytest.fixture(scope="module")
def venv() -> Path:
    return ensure_env("web", ["pip"])        # what ``up`` builds; built here once, outside any timing


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HPCML_SERVICE_STATE": str(tmp_path / "state")}


def _blueprint(tmp_path: Path, text: str = SERVER) -> Path:
    path = tmp_path / "web.yaml"
    path.write_text(text)
    return path


def _servers(directory: Path) -> list[psutil.Process]:
    """The http.server processes serving this instance's volume (the marker in their command line)."""
    www = str(directory / "volumes" / "www")
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "http.server" in cmd and www in cmd:
            found.append(p)
    return found


def _one_line(out: subprocess.CompletedProcess, code: int = 2) -> str:
    assert out.returncode == code, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.mark.parametrize("key", ["../../x", "/tmp/x", "a/b", "..", ""])
def test_a_file_of_a_blueprint_is_a_file_name_never_a_path(tmp_path, key):
    bp = loads(SERVER.replace('"site.conf"', json.dumps(key)), "web.yaml")
    with pytest.raises(UsageError, match=r"key 'files\[0\]\.content'"):
        local.start(bp, tmp_path / "web")         # refused before its venv is looked at
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["web"]


def test_a_dependency_is_a_name_never_a_path():
    with pytest.raises(UsageError, match="key 'depends_on"):
        loads(SERVER.replace("health:", "depends_on: [../../evil]\nhealth:"), "web.yaml")


def test_no_blueprint_or_flag_writes_outside_the_state_directory(tmp_path):
    """``files[].content`` keys, ``--name``, a symlink in the state directory, a --state-dir
    that is a file: each one line, exit 2, nothing written outside (was: written anywhere).
    An instance in a shared state directory started on another node is neither started a
    second time nor signalled here (its pid means another process on this node)."""
    env, outside = _env(tmp_path), tmp_path / "outside"
    outside.mkdir()
    bad = _blueprint(tmp_path, SERVER.replace('"site.conf"', f'"../../../../{outside.name}/pwned"'))
    line = _one_line(hpcml(["service", "up", str(bad)], env))
    assert "files[0].content" in line and "not a path" in line
    good = _blueprint(tmp_path)
    line = _one_line(hpcml(["service", "up", str(good), "--name", "../../outside/escaped"], env))
    assert "--name" in line or "name" in line
    state_root = tmp_path / "state"
    (state_root / "web" / "files").mkdir(parents=True)
    (state_root / "web" / "files" / "conf").symlink_to(outside)      # a symlink left in the state directory
    line = _one_line(hpcml(["service", "up", str(good)], env))
    assert "files/conf leads outside" in line
    (state_root / "linked").symlink_to(outside)                       # an instance directory that is a symlink
    line = _one_line(hpcml(["service", "up", str(good), "--name", "linked"], env))
    assert "leads outside" in line
    elsewhere = {"schema": "hpcml.service.state/1", "name": "web", "blueprint": str(good), "mode": "local",
                 "backend": "process", "directory": str(state_root / "other"), "node": "another-node", "pid": 1}
    (state_root / "other").mkdir()
    (state_root / "other" / "service.json").write_text(json.dumps(elsewhere))   # shared state, another node
    line = _one_line(hpcml(["service", "up", str(good), "--name", "other"], env))
    assert "started on another-node" in line
    line = _one_line(hpcml(["service", "down", "other"], env))
    assert "runs on another-node" in line
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    line = _one_line(hpcml(["service", "up", str(good), "--state-dir", str(a_file)], env))
    assert "not a directory" in line
    assert list(outside.iterdir()) == [] and not (tmp_path / "escaped").exists()


def test_two_ups_at_once_leave_one_server_that_down_stops(tmp_path):
    """Two ``hpcml service up`` of one instance at the same time, while its venv is being
    built (the minutes a first ``up mlflow`` takes): one starts it, the other says who does
    (was: two servers on one volume, the untracked one surviving ``down``)."""
    env = {**_env(tmp_path), "PYTHONPATH": str(ROOT / "src"), "HPCML_SERVICE_ENVS": str(tmp_path / "envs")}
    argv = [sys.executable, "-m", "hpcml", "service", "up", str(_blueprint(tmp_path))]
    ups = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in ups]
    directory = tmp_path / "state" / "web"
    servers = _servers(directory)
    if len(servers) != 1:
        for p in servers:
            p.kill()
    assert len(servers) == 1
    assert sorted(r[0] for r in results) == [0, 2], results
    for loser in (r for r in results if r[0] == 2):
        assert "web" in loser[2] and re.search(r"pid \d+", loser[2]) and "Traceback" not in loser[2], loser
    url = state(directory)["urls"]["http"]
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
    logs = hpcml(["service", "logs", "web", "-n", "3", "--state-dir", str(tmp_path / "state")], dict(os.environ))
    assert logs.returncode == 0 and "Serving HTTP on 127.0.0.1" in logs.stdout, logs.stderr

    out = hpcml(["service", "down", "web"], env)
    assert out.returncode == 0 and "web: stopped" in out.stdout, out.stderr
    deadline = time.monotonic() + 60
    while _servers(directory) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _servers(directory) == []


#: a process of ours that is not the service: it says which signals reach it, and answers each
#: line it reads; a signal sent before a line is written is handled before that line's answer
VICTIM = ("import signal, sys\n"
          "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):\n"
          "    signal.signal(s, lambda n, f: print('signal', n, flush=True))\n"
          "print('ready', flush=True)\n"
          "for line in sys.stdin:\n"
          "    print('read', line.strip(), flush=True)\n")


def test_down_never_signals_a_process_that_is_not_the_service(tmp_path, venv):
    """``service.json`` pointing at another process of ours (a reused pid, an edited file),
    even with that process's start time copied in: ``down`` leaves it alone. Whether it was
    signalled is asked of the victim after ``down`` has ended (a line it must answer before
    anything else), not guessed from a delay."""
    env = _env(tmp_path)
    out = hpcml(["service", "up", str(_blueprint(tmp_path))], env)
    assert out.returncode == 0, out.stderr
    directory = tmp_path / "state" / "web"
    path = directory / "service.json"
    real = json.loads(path.read_text())
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, "hpcml-test-victim-7f3a"], start_new_session=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert victim.stdin is not None and victim.stdout is not None and victim.stdout.readline() == "ready\n"
    try:
        for started in (real["pid_started"], psutil.Process(victim.pid).create_time()):
            path.write_text(json.dumps({**real, "pid": victim.pid, "pgid": victim.pid, "pid_started": started}))
            out = hpcml(["service", "down", "web"], env)
            assert out.returncode == 0 and "nothing signalled" in out.stderr, (out.stdout, out.stderr)
            victim.stdin.write(f"after down {started}\n")
            victim.stdin.flush()
            assert victim.stdout.readline() == f"read after down {started}\n", \
                "down signalled a process that is not the service (or killed it)"
        path.write_text(json.dumps(real))
        out = hpcml(["service", "down", "web"], env)
        assert out.returncode == 0 and "web: stopped" in out.stdout, out.stderr
        deadline = time.monotonic() + 60
        while _servers(directory) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _servers(directory) == [] and victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
        for p in _servers(directory):
            p.kill()


def test_ctrl_c_during_up_stops_what_it_started(tmp_path, venv):
    """SIGINT while the service is not healthy yet (its start script has exec'd the server,
    whose health page is still missing): ``up`` stops it and says so, exit 130 (was:
    "interrupted" and the service left running in its own session)."""
    env = {**_env(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    bp = _blueprint(tmp_path, SERVER.replace("http: /,", "http: /not-yet,"))
    up = subprocess.Popen([sys.executable, "-m", "hpcml", "service", "up", str(bp)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    directory = tmp_path / "state" / "web"
    deadline = time.monotonic() + 120
    while not _servers(directory) and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = json.loads((directory / "service.json").read_text())["pid"]
    up.send_signal(signal.SIGINT)
    _, err = up.communicate(timeout=120)
    assert up.returncode == 130, err
    assert re.search(r"interrupted while starting web \(pid \d+\): stopped web", err), err
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _servers(directory) == []


def test_a_wrong_set_names_the_flag_and_logs_of_a_pending_job_say_so(tmp_path):
    env = _env(tmp_path)
    line = _one_line(hpcml(["service", "up", "tensorboard", "--set", "backend=x"], env))
    assert "--set" in line and "tensorboard.yaml" not in line and "logdir" in line
    directory = tmp_path / "elsewhere" / "mlflow"
    directory.mkdir(parents=True)
    (directory / "service.json").write_text(json.dumps({
        "schema": "hpcml.service.state/1", "name": "mlflow", "blueprint": "mlflow.yaml", "mode": "slurm",
        "backend": "auto", "directory": str(directory), "job_id": "999999"}))
    line = _one_line(hpcml(["service", "logs", "mlflow", "--state-dir", str(directory.parent)], env), code=1)
    assert "no log yet" in line and "Slurm job 999999" in line


def test_every_install_hint_names_an_extra_that_installs_something():
    """``pip install 'hpcml[X]'`` hints (errors, help) name a non-empty extra, and --help shows
    it (Rich markup ate ``[service]``: the help said ``pip install 'hpcml'``)."""
    extras = load_toml((ROOT / "pyproject.toml").read_text(), "pyproject.toml")["project"]["optional-dependencies"]
    for path in (ROOT / "src" / "hpcml").rglob("*.py"):
        for extra in re.findall(r"pip install (?:-e )?'(?:hpcml|\.)\\*\[(\w+)\]'", path.read_text()):
            assert extras.get(extra), f"{path}: pip install hint names the extra '{extra}', which installs nothing"
    out = hpcml(["service", "render", "--help"], {**os.environ, "COLUMNS": "300"})
    assert "pip install 'hpcml[service]'" in " ".join(out.stdout.split()), out.stdout
