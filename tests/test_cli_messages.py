"""What the terminal line says about the command line itself: the version, and errors that
name a flag as a flag and an argument as an argument (never as a file's 'key')."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata


def _hpcml(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_version_flag_prints_the_installed_version():
    want = f"hpcml {metadata.version('hpcml')}\n"
    for args in (["--version"], ["-V"], ["version"]):
        out = _hpcml(*args)
        assert out.returncode == 0 and out.stdout == want, (args, out.stdout, out.stderr)
    assert "--version" in _hpcml("--help").stdout


def test_errors_about_the_command_line_name_flags_and_arguments(tmp_path):
    flag = _hpcml("data", "doctor", str(tmp_path), "--ram", "12xx")
    assert flag.returncode == 2 and flag.stderr.startswith("hpcml data doctor: error: flag '--ram': "), flag.stderr
    arg = _hpcml("run", cwd=tmp_path)
    assert arg.returncode == 2 and arg.stderr.startswith("hpcml run: error: argument CMD: no command"), arg.stderr
    for out in (flag, arg):
        assert "key '" not in out.stderr and out.stderr.count("\n") == 1


def test_counted_nouns_agree(tmp_path):
    (tmp_path / "p.yaml").write_text("name: one\nevals:\n  - {name: mem, type: memory, min_available_fraction: 1%}\n")
    out = _hpcml("vet", "p.yaml", cwd=tmp_path)
    assert out.stdout.startswith("hpcml vet: one: 1 node, 1 check\n"), out.stdout + out.stderr


def test_usage_errors_of_the_command_line_itself_are_one_line_exit_2():
    """Typer's usage lines and error box become the house's one line (hpcml.cli_support)."""
    for args, words in ((["vet", "serve", "--port", "99999"], "hpcml vet serve: error: Invalid value for '--port'"),
                        (["--bogus"], "error: No such option: --bogus"),
                        (["vet", "fleet-report", "--db"], "error: Option '--db' requires an argument"),
                        (["centre", "serve", "--port", "99999"], "hpcml centre serve: error: Invalid value for '--port'"),
                        (["centre", "report", "--db"], "error: Option '--db' requires an argument"),
                        (["report"], "hpcml report: error: Missing argument")):
        out = _hpcml(*args)
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, (args, out.stderr)
