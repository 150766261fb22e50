"""scripts/venv.sh, which ./scripts/example and ./scripts/test share: a venv is rebuilt when
its inputs change, and only then (a rebuild costs minutes and, with torch, hundreds of MB)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def _venv_sh(script: str, py: Path | str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". scripts/venv.sh; {script}"], cwd=ROOT, capture_output=True, text=True,
                          env={**(env or os.environ), "PY": str(py)}, timeout=300)


def test_an_active_venv_does_not_force_the_example_venv_to_be_rebuilt(tmp_path):
    """Was: the stamp held ``$PY``'s own path, so ``./scripts/example`` run with a venv active
    (python3 = that venv's python) rebuilt .venv-example from scratch. This test runs from
    the test venv: its python is such a ``$PY``."""
    assert Path(sys.prefix) != Path(sys.base_prefix), "the suite runs from a venv (scripts/test)"
    venv = tmp_path / "venv-example"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(BASE_PYTHON)
    built = _venv_sh("venv_stamp scripts/example", BASE_PYTHON)
    assert built.returncode == 0 and len(built.stdout.strip()) == 16, built.stderr
    (venv / ".hpcml-stamp").write_text(built.stdout)
    # a rebuild would say so and fail at once: the spec names nothing pip can install
    active = {**os.environ, "VIRTUAL_ENV": sys.prefix, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    again = _venv_sh(f"ensure_venv {venv} {tmp_path / 'no-such-project'} scripts/example", sys.executable, active)
    assert again.returncode == 0 and "building" not in again.stderr, again.stderr
    assert (venv / ".hpcml-stamp").read_text() == built.stdout


def test_the_example_venv_resolves_the_pinned_cpu_torch_alone_without_cuda_wheels(tmp_path):
    """Was: ``pip install -e .[torch]`` and then ``torch==2.13.0``: the first call took the
    newest torch, a CUDA build with 3.2 GB of nvidia-* wheels and triton, and the pin replaced
    torch alone (a 5.2 GB venv). One resolver call now: pip's own report of what it would
    install (a dry run, on a copy of the project: nothing is written into the checkout)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "src", proj / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    report = tmp_path / "install.json"
    out = _venv_sh(f"venv_install {sys.executable} '{proj}[torch]' --dry-run --ignore-installed --report {report}",
                   sys.executable)
    assert out.returncode == 0, out.stderr
    names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert names["torch"] == "2.13.0+cpu" and "hpcml" in names, names
    assert not [n for n in names if n == "triton" or (n.startswith("nvidia-") and n != "nvidia-ml-py")], names


STAND_IN = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["RUNS"], "a") as f:
    f.write(json.dumps(args) + "\\n")
parts = {{"machine": "alone", "slurm and not machine": "slurm", "not slurm and not machine": "workers"}}
part = next((parts[a] for a in args if a in parts), "whole")
sys.exit(int(os.environ.get("RC_" + part.upper(), "0")))
"""


def _parts(tmp_path: Path, *args: str, **env: str) -> tuple[int, list[list[str]]]:
    """``scripts/test-parts`` with a stand-in interpreter that records each pytest run's
    arguments and exits as ``RC_ALONE``, ``RC_SLURM``, ``RC_WORKERS`` or ``RC_WHOLE`` say.
    The runs come back in the parts' order (the last two run side by side)."""
    py = tmp_path / "python"
    py.write_text(STAND_IN.format(python=sys.executable))
    py.chmod(0o755)
    runs = tmp_path / "runs.jsonl"
    runs.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "HPCML_TEST_WORKERS"}
    p = subprocess.run([str(ROOT / "scripts" / "test-parts"), str(py), *args], cwd=ROOT, capture_output=True,
                       text=True, env={**base, "RUNS": str(runs), **env}, timeout=60)
    got = [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []
    order = ["machine", "slurm and not machine", "not slurm and not machine"]
    return p.returncode, sorted(got, key=lambda r: next((order.index(a) for a in r if a in order), -1))


def test_the_suite_runs_the_machine_s_tests_alone_then_slurm_s_beside_the_rest_on_workers(tmp_path):
    rc, runs = _parts(tmp_path, "-x", "tests/run")
    assert rc == 0 and len(runs) == 3, runs
    assert runs[0][:5] == ["-m", "pytest", "-q", "-m", "machine"] and runs[0][-2:] == ["-n", "0"]
    assert runs[1][:5] == ["-m", "pytest", "-q", "-m", "slurm and not machine"] and runs[1][-2:] == ["-n", "0"]
    assert all("-x" in r and "tests/run" in r for r in runs)
    w = runs[2]
    assert w[w.index("-n") + 1] == "3" and w[w.index("--dist") + 1] == "loadscope"
    assert w[w.index("-m", 3) + 1] == "not slurm and not machine" and w[-2:] == ["-x", "tests/run"]
    _rc, runs = _parts(tmp_path, HPCML_TEST_WORKERS="2")
    assert runs[2][runs[2].index("-n") + 1] == "2"


@pytest.mark.parametrize("rc_alone, rc_slurm, rc_workers, rc, runs", [
    ("0", "0", "0", 0, 3), ("1", "0", "0", 1, 3), ("0", "1", "0", 1, 3), ("0", "0", "1", 1, 3),
    ("1", "0", "3", 1, 3),
    ("5", "0", "0", 0, 3), ("0", "5", "5", 0, 3),     # a part that selects no test is no failure ...
    ("5", "5", "5", 5, 3),                            # ... unless none selected one
    ("2", "0", "0", 2, 1),                            # bad usage: the others would say the same
    ("130", "0", "0", 130, 1),                        # interrupted: the user asked to stop
])
def test_the_suite_fails_where_any_part_failed_and_selects_nothing_only_where_none_did(
        tmp_path, rc_alone, rc_slurm, rc_workers, rc, runs):
    got, ran = _parts(tmp_path, RC_ALONE=rc_alone, RC_SLURM=rc_slurm, RC_WORKERS=rc_workers)
    assert (got, len(ran)) == (rc, runs), ran


@pytest.mark.parametrize("args, env", [(["-m", "torch"], {}), (["-mtorch"], {}), (["-xm", "torch"], {}),
                                       (["-x"], {"HPCML_TEST_WORKERS": "0"})])
def test_a_marker_selection_of_the_caller_s_own_or_no_workers_runs_once_one_test_at_a_time(tmp_path, args, env):
    rc, runs = _parts(tmp_path, *args, RC_WHOLE="1", **env)
    assert rc == 1 and runs == [["-m", "pytest", "-q", *args]]


@pytest.mark.parametrize("given, alone, slurm", [
    (["--junitxml=out/r.xml"], ["--junitxml=out/r.alone.xml"], ["--junitxml=out/r.slurm.xml"]),
    (["--junitxml", "r.xml"], ["--junitxml", "r.alone.xml"], ["--junitxml", "r.slurm.xml"]),
    (["--junit-xml=r"], ["--junit-xml=r.alone.xml"], ["--junit-xml=r.slurm.xml"])])
def test_each_part_writes_its_own_junit_report(tmp_path, given, alone, slurm):
    """Was: part 2's report overwrote part 1's at the caller's path."""
    _rc, runs = _parts(tmp_path, *given)
    cache = ["-o", "cache_dir=.pytest_cache/slurm-part"]
    assert runs[0][5:-2] == alone and runs[1][5:-2] == slurm + cache and runs[2][-len(given):] == given


@pytest.mark.parametrize("given, slurm", [(["--basetemp=/t/bt"], ["--basetemp=/t/bt.slurm"]),
                                          (["--basetemp", "/t/bt/"], ["--basetemp", "/t/bt.slurm"])])
def test_the_parts_side_by_side_share_no_basetemp_and_no_cache(tmp_path, given, slurm):
    """Review finding: pytest empties its basetemp when it starts using it, so the Slurm
    part deleted the workers' temporary directories; and the last to end wrote the cache."""
    _rc, runs = _parts(tmp_path, *given)
    assert runs[0][5:-2] == given and runs[2][-len(given):] == given
    assert runs[1][5:-2] == slurm + ["-o", "cache_dir=.pytest_cache/slurm-part"]
    _rc, runs = _parts(tmp_path, "-p", "no:cacheprovider")
    assert runs[1][5:-2] == ["-p", "no:cacheprovider"]


SIDE = """#!{python}
import os, signal, sys, time
args = sys.argv
part = args[args.index("-m", 3) + 1]
if part == "slurm and not machine":
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(1))
    open(os.environ["STARTED"] + ".slurm", "w").close()
    end = time.time() + 20
    while time.time() < end and not got:
        time.sleep(0.05)
    time.sleep(0.5)                                    # its teardown (the local cluster's stop)
    print(f"slurm part: told {{len(got)}} time(s)", flush=True)
    sys.exit(2 if got else 0)
if part == "not slurm and not machine":
    open(os.environ["STARTED"], "w").close()
    time.sleep(1.5)
sys.exit(0)
"""


@pytest.mark.parametrize("how, rc", [("term", 143), ("ctrl-c", 130)])
def test_a_signal_stops_the_slurm_part_once_and_its_output_is_shown(tmp_path, how, rc):
    """Review finding: Ctrl-C reached the Slurm part from the terminal and again from the
    script, cutting its cluster's teardown short, and what it had said was thrown away; a
    TERM to the script alone left it running."""
    py = tmp_path / "python"
    py.write_text(SIDE.format(python=sys.executable))
    py.chmod(0o755)
    started = tmp_path / "started"
    p = subprocess.Popen([str(ROOT / "scripts" / "test-parts"), str(py)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env={**os.environ, "STARTED": str(started)})
    deadline = time.monotonic() + 30
    while not (started.exists() and Path(f"{started}.slurm").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if how == "term":
        p.send_signal(signal.SIGTERM)                   # the script alone
    else:
        os.killpg(p.pid, signal.SIGINT)                 # the terminal's: its whole process group
    out, _ = p.communicate(timeout=60)
    assert p.returncode == rc, out
    assert "slurm part: told 1 time(s)" in out, out


def test_the_slurm_parts_output_is_printed_whole_after_the_workers(tmp_path):
    py = tmp_path / "python"
    py.write_text(f"#!{sys.executable}\nimport sys\na = sys.argv; print('PART', a[a.index('-m', 3) + 1])\n")
    py.chmod(0o755)
    p = subprocess.run([str(ROOT / "scripts" / "test-parts"), str(py)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    lines = [line for line in p.stdout.splitlines() if line.startswith("PART")]
    assert lines == ["PART machine", "PART not slurm and not machine", "PART slurm and not machine"], p.stdout
