"""The prolog fails closed, and only for the node's sake: whatever breaks while loading or
running drains the node with an ``hpcml:`` reason and one line; a bad collector token file is
a warning that leaves the verdict's exit code as it was; ``prolog-script`` refuses what the
prolog would refuse, instead of writing a script that drains every node at every job start."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hpcml.vet import prolog
from hpcml.vet.cli import app
from hpcml.vet.cli.prolog import run_prolog_cli
from tests.vet.test_prolog import hpcml, proto_file

PASS = "  - {name: ok, type: tests.vet.prolog_checks.Sleep, seconds: 0}\n"


@pytest.fixture
def scontrol(tmp_path) -> tuple[dict, Path]:
    """A fake scontrol on PATH that logs its calls and shows the node idle."""
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n"
                    "[ \"$1\" = show ] && echo \"NodeName=$4 State=IDLE\"\nexit 0\n")
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n1"}, log


# --- fail closed ----------------------------------------------------------------------------------

def test_a_protocol_the_loader_chokes_on_drains_the_node_naming_it(tmp_path, scontrol):
    env, log = scontrol
    proto = proto_file(tmp_path, "  - name: m\n    type: memory\n    1: 2\n")
    p = hpcml("vet", "--prolog", "--drain", proto, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("hpcml vet --prolog: error: ") and "evals[0][1]" in line
    (update,) = [c for c in log.read_text().splitlines() if c.startswith("update")]
    assert "nodename=n1 state=drain reason=hpcml: bad input: " in update and "evals[0][1]" in update


@pytest.fixture
def drains(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setattr(prolog, "drain_node", lambda node, bad, timeout=2.0: calls.append((node, bad)) or
                        (prolog.drain_reason(bad), None))
    return calls


def test_any_exception_while_loading_drains_with_a_reason_and_one_line(monkeypatch, drains, capsys):
    from hpcml.vet import protocol

    def broken(path):
        raise RuntimeError("the plugin's import failed")
    monkeypatch.setattr(protocol, "load", broken)
    with pytest.raises(typer.Exit) as info:
        run_prolog_cli(None, drain=True)
    assert info.value.exit_code != 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "RuntimeError: the plugin's import failed" in line
    ((node, (reason,)),) = drains
    assert node == "n1" and "RuntimeError: the plugin's import failed" in prolog.drain_reason([reason])


def test_any_exception_while_running_drains_with_a_reason_and_one_line(monkeypatch, drains, capsys):
    def broken(*args, **kwargs):
        raise OSError("fork failed")
    monkeypatch.setattr(prolog, "run_prolog", broken)
    with pytest.raises(typer.Exit) as info:
        run_prolog_cli(None, drain=True)
    assert info.value.exit_code == prolog.EXIT_BAD
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "hpcml vet --prolog: error: vetting failed: OSError: fork failed"
    assert drains == [("n1", ["vetting failed: OSError: fork failed"])]


# --- the collector never changes the verdict ------------------------------------------------------

@pytest.mark.parametrize("kind", ["binary", "fifo", "directory"])
def test_a_bad_token_file_is_a_warning_and_the_verdict_stands(tmp_path, kind):
    token = tmp_path / "token"
    if kind == "binary":
        token.write_bytes(b"\xff\xfe\x00\n")
    elif kind == "fifo":
        os.mkfifo(token)
    else:
        token.mkdir()
    start = time.monotonic()                # a budget a loaded test machine cannot overrun
    p = hpcml("vet", "--prolog", "--budget", "20 s", proto_file(tmp_path, PASS), "--report-to", "http://127.0.0.1:9",
              "--report-token-file", token, "--report-spool", tmp_path / "spool", env={"SLURMD_NODENAME": "n1"})
    assert time.monotonic() - start < 20 + 3            # a FIFO read would block past it
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    (warning,) = p.stderr.strip().splitlines()
    assert warning.startswith(f"hpcml vet --prolog: warning: report not sent to http://127.0.0.1:9: token file {token}: ")
    assert "kept in" in warning and len(list((tmp_path / "spool").iterdir())) == 1
    assert "n1 healthy" in p.stdout


# --- prolog-script ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--budget", "0"],
    ["--budget", "0 s"],
    ["{passwd}"],                                           # not a protocol at all
    ["{intkey}"],                                           # a protocol the loader chokes on
    ["{fifo}"],
    ["--report-to", "http://c:8080", "--report-token-file", "{binary}"],
    ["--report-to", "http://c:8080", "--report-token-file", "{fifo}"],
])
def test_prolog_script_refuses_what_the_prolog_would_refuse(tmp_path, args):
    files = {"passwd": tmp_path / "passwd", "intkey": proto_file(tmp_path, "  - name: m\n    type: memory\n    1: 2\n"),
             "fifo": tmp_path / "fifo", "binary": tmp_path / "binary"}
    files["passwd"].write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.mkfifo(files["fifo"])
    files["binary"].write_bytes(b"\xff\n")
    out = CliRunner().invoke(app, ["prolog-script", *[a.format(**files) for a in args]])
    assert out.exit_code == 2, out.output
    assert "#!/bin/sh" not in out.stdout and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output


def test_prolog_script_still_writes_a_script_for_good_input(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    out = CliRunner().invoke(app, ["prolog-script", str(proto_file(tmp_path, PASS)), "--budget", "3 s",
                                   "--report-to", "http://c:8080", "--report-token-file", str(token)])
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("#!/bin/sh\n") and "--report-token-file" in out.stdout
