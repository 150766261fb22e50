"""The `hpcml vet` command as a user runs it: a real process, its exit code and output."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpcml as hpcml_pkg
from tests.farm.farmtools import wait_for

ROOT = Path(__file__).parents[2]
#: the hpcml this process imported: the subprocesses run the same code
SRC = Path(hpcml_pkg.__file__).parents[1]
CPU = ROOT / "examples" / "vet" / "cpu.yaml"


def hpcml(*args, cwd=None, env=None):
    import os
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e["PYTHONPATH"] = f"{SRC}{os.pathsep}{ROOT}"  # this checkout's hpcml; the tests' plugin checks
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=e, timeout=120)


def test_local_run_continues_and_writes_outputs(tmp_path):
    p = hpcml("vet", CPU, "--out", tmp_path / "o", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["verdict"]["decision"] == "continue" and report["verdict"]["bad"] == ""
    node = next(iter(report["nodes"].values()))
    assert {r["check"] for r in node["results"]} == {"memory", "load", "tmp-disk", "mounts", "env",
                                                       "clock", "gemm"}
    assert all({"outcome", "value", "threshold", "duration", "message"} <= set(r) for r in node["results"])
    assert (tmp_path / "o" / "bad-nodes").read_text() == "\n"
    assert (tmp_path / "o" / "good-nodes").read_text().strip() == next(iter(report["nodes"]))
    assert json.loads((tmp_path / "o" / "report.json").read_text())["schema"] == "hpcml.vet/1"


def test_table_output_and_abort_exit_code(tmp_path):
    proto = tmp_path / "p.yaml"
    proto.write_text("name: t\nevals:\n  - {name: mem, type: memory, min_available: 1 PB}\n")
    p = hpcml("vet", proto, "--out", tmp_path / "o")
    assert p.returncode == 4, p.stdout + p.stderr
    assert "verdict: abort" in p.stdout and "mem: available" in p.stdout
    assert (tmp_path / "o" / "bad-nodes").read_text().strip() != ""


def test_hanging_check_ends_as_error_by_its_timeout(tmp_path):
    proto = tmp_path / "p.yaml"
    proto.write_text("name: t\nevals:\n  - {name: hang, type: tests.plugins.testchecks.Hang, timeout: 1 s}\n"
                     "  - {name: mem, type: memory}\n")
    p = hpcml("vet", proto, "--out", tmp_path / "o", "--json")
    assert p.returncode == 4
    res = {r["check"]: r for r in next(iter(json.loads(p.stdout)["nodes"].values()))["results"]}
    assert res["hang"]["outcome"] == "error" and "timed out after 1 s" in res["hang"]["message"]
    assert res["mem"]["outcome"] == "pass"


@pytest.mark.parametrize("content,needle", [
    (None, "file not found"),
    ("name: t\nevals:\n  - {name: a, type: nosuch}\n", "key 'evals[0].type': unknown check type"),
    ("name: t\nevals:\n  - name: d\n    type: disk\n    min_free: lots\n", ":5: key 'evals[0].min_free'"),
    ("name: t\nevals: [\n", "not valid YAML"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, needle):
    proto = tmp_path / "p.yaml"
    if content is not None:
        proto.write_text(content)
    p = hpcml("vet", proto, "--out", tmp_path / "o")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and str(proto) in lines[0], p.stderr
    assert not (tmp_path / "o").exists()  # nothing ran


def test_bad_deadline_option(tmp_path):
    p = hpcml("vet", CPU, "--deadline", "soon", "--out", tmp_path / "o")
    assert p.returncode == 2 and "--deadline" in p.stderr and "Traceback" not in p.stderr


def test_validate_and_checks_list():
    p = hpcml("vet", "validate", ROOT / "tests" / "fixtures" / "vetnode" / "alps-like.yaml")
    assert p.returncode == 0 and "valid vetnode protocol" in p.stdout
    p = hpcml("vet", "checks")
    assert p.returncode == 0 and "collective" in p.stdout and "min_bandwidth" in p.stdout


def test_setup_builds_a_cached_venv_once(tmp_path):
    """Requirements come from a local package, so no index is needed."""
    pkg = tmp_path / "pkg"
    (pkg / "hpcml_vet_testdep").mkdir(parents=True)
    (pkg / "hpcml_vet_testdep" / "__init__.py").write_text("__version__ = '0.1'\n")
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "hpcml-vet-testdep"\nversion = "0.1"\n')
    proto = tmp_path / "p.yaml"
    proto.write_text(f"name: t\nevals:\n  - name: dep\n    type: imports\n    modules: [hpcml_vet_testdep]\n"
                     f"    requirements: ['{pkg}']\n")
    before = hpcml("vet", proto, "--out", tmp_path / "o0", "--venv-root", tmp_path / "venvs")
    assert before.returncode == 4 and "requirements not set up" in before.stderr
    p = hpcml("vet", "setup", proto, "--venv-root", tmp_path / "venvs")
    assert p.returncode == 0 and "ready:" in p.stdout, p.stderr
    assert "Successfully installed hpcml-vet-testdep" in p.stderr        # pip's progress, as it comes
    again = hpcml("vet", "setup", proto, "--venv-root", tmp_path / "venvs")
    assert "already set up" in again.stdout
    run = hpcml("vet", proto, "--out", tmp_path / "o", "--venv-root", tmp_path / "venvs")
    assert run.returncode == 0, run.stdout + run.stderr
    # hpcml and its dependencies come from where the suite installed them (its own venv),
    # not from a copy in the requirements venv
    (venv,) = (tmp_path / "venvs").glob("vet-*")
    where = subprocess.run([venv / "bin" / "python", "-c",
                            "import hpcml, typer, hpcml_vet_testdep as d; print(hpcml.__file__); "
                            "print(d.__file__)"], capture_output=True, text=True, env={"PATH": ""})
    assert where.returncode == 0, where.stderr
    hpcml_file, dep_file = where.stdout.split()
    assert Path(hpcml_file).resolve() == (ROOT / "src" / "hpcml" / "__init__.py").resolve()
    assert Path(dep_file).is_relative_to(venv) and not list(venv.glob("lib/*/site-packages/hpcml-[0-9]*"))


def test_ctrl_c_stops_every_check_writes_the_report_and_says_so(tmp_path):
    """Issue 19: Ctrl-C left the forked check running at full CPU, with no report and no word.
    The checks run in their own process groups, so the terminal's SIGINT reaches only hpcml.
    The SIGINT is sent once the hanging check says it runs (its pid in a file), never after a
    guessed delay: a check not started yet would pass this test without being stopped."""
    import signal

    import psutil
    root = Path(__file__).resolve().parents[2]
    started = tmp_path / "started"
    (tmp_path / "p.yaml").write_text(
        "name: slow\nevals:\n  - {name: quick, type: memory, min_available_fraction: 1%}\n"
        f"  - {{name: stuck, type: tests.plugins.handshake.HangOnceStarted, started: '{started}', seconds: 60,"
        " timeout: 120 s}\n")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = str(root)
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "vet", "run", "p.yaml", "--local", "--out", str(out)],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: started.exists() or p.poll() is not None, 120, "the hanging check to start")
        assert started.exists(), p.communicate(timeout=60)
        check = int(started.read_text())
        assert check in [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, (stdout, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr
    # killed before hpcml exited: gone once the kernel has finished with it (reaped, or a zombie)
    wait_for(lambda: not _running(check), 30, f"the check (pid {check}) to end")
    rep = json.loads((out / "report.json").read_text())
    results = {r["check"]: r for r in rep["nodes"][next(iter(rep["nodes"]))]["results"]}
    assert results["stuck"]["outcome"] == "error" and "interrupted" in results["stuck"]["message"]
    assert results["quick"]["outcome"] == "pass"
    assert any("interrupted" in n for n in rep["notes"])


def _running(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _vet_local(tmp_path, protocol: str, *extra):
    (tmp_path / "p.yaml").write_text(protocol)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([sys.executable, "-m", "hpcml", "vet", "run", "p.yaml", "--local", "--out", "o", *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_batch_log_gets_lines_not_a_wrapped_table(tmp_path):
    """Issue 19: in a batch log (no terminal) the 80-column table wrapped every cell."""
    p = _vet_local(tmp_path, "name: log\nevals:\n  - {name: tmp-disk, type: disk, path: /tmp, min_free: 1 kB}\n"
                             "  - {name: env, type: env, expected: {HPCML_SURELY_UNSET_VAR: x}}\n"
                             "  - {name: mounts, type: mounts, paths: [/tmp]}\n")
    assert p.returncode == 4, p.stderr
    lines = p.stdout.splitlines()
    node = next(line for line in lines if line.startswith("  ") and ": bad: " in line)
    assert "1 fail" in node and "2 pass" in node
    assert any(line.strip().startswith("env: fail 1 bad vars: HPCML_SURELY_UNSET_VAR") for line in lines)
    assert "┃" not in p.stdout and "tmp-d…" not in p.stdout
    assert all(len(line) < 200 for line in lines)


def test_a_node_where_every_check_was_skipped_is_said_loudly(tmp_path):
    """Issue 19: a GPU protocol on a node without GPUs reported the node good, silently."""
    from tests.nodriver import skip_if_nvidia_driver
    skip_if_nvidia_driver()
    p = _vet_local(tmp_path, "name: gpu-only\nevals:\n  - {name: gpu, type: gpu}\n")
    assert p.returncode == 0, p.stderr
    assert "warning:" in p.stdout and "NOTHING WAS CHECKED" in p.stdout
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert any("NOTHING WAS CHECKED" in n for n in rep["notes"])


def test_one_node_says_what_it_could_not_compare(tmp_path):
    """Alone, a node's clock skew is not measured (it would be 0 s against itself) and its
    GEMM rate is not compared with other nodes: skipped and said, not a pass."""
    p = hpcml("vet", CPU, "--out", tmp_path / "o", "--json")
    assert p.returncode == 0, p.stderr
    results = {r["check"]: r for r in next(iter(json.loads(p.stdout)["nodes"].values()))["results"]}
    clock = results["clock"]
    assert (clock["outcome"], clock["value"]) == ("skipped", None)
    assert clock["message"] == "not measured: no other node's clock to compare with"
    assert results["gemm"]["outcome"] == "pass"
    assert results["gemm"]["message"].endswith("; not compared with the other nodes (no other node's value)")
    p = hpcml("vet", CPU, "--out", tmp_path / "o2")          # not a terminal: the batch log's lines
    assert "    clock: skipped: not measured: no other node's clock to compare with" in p.stdout.splitlines()
    node = next(line for line in p.stdout.splitlines() if ": good: " in line)      # load may warn on a busy machine
    assert p.returncode == 0 and "1 skipped" in node, p.stdout
