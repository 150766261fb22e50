"""Ground truth for ``hpcml scan``: every malicious corpus file really fires when loaded.

Each case is built in ``tmp_path`` by this process, then its victim loader runs in a
fresh interpreter (``cwd=tmp_path``). Malicious files must create the marker file;
benign files must load and leave no marker; malformed files must make the loader fail,
also without a marker. Nothing here imports hpcml.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs
from tests.scan import payloads

HERE = Path(__file__).resolve().parent

# The victim: a clean interpreter that has imported the loaders' libraries (torch, numpy,
# joblib, safetensors: 1-2 s each time) once, and forks a child per case. Each case runs in
# a fresh fork of that clean parent, never of a process a payload ran in, with its output in
# files and its exit code (an uncaught exception prints its traceback and exits 1, as a new
# interpreter would). One interpreter per case cost 30 s of the suite for the same verdicts.
VICTIM = r"""
import importlib, json, os, pathlib, sys, traceback
sys.path.insert(0, sys.argv[1])
import payloads
for lib in ("numpy", "torch", "joblib", "safetensors", "safetensors.numpy", "safetensors.torch"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
print("ready", flush=True)
for line in sys.stdin:
    name, path, cwd, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(cwd)
        fo, fe = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600), os.open(err, os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(fo, 1)
        os.dup2(fe, 2)
        code = 0
        try:
            result = payloads.ALL_CASES[name].load(pathlib.Path(path))
            print("loaded", type(result).__name__)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""


class Victim:
    """The fork server above, one per test module."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        self.proc = subprocess.Popen([sys.executable, "-c", VICTIM, str(HERE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def load(self, case: payloads.Case, path: Path, cwd: Path) -> subprocess.CompletedProcess:
        import json
        out, err = cwd / "victim.out", cwd / "victim.err"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([case.name, str(path), str(cwd), str(out), str(err)]) + "\n")
        self.proc.stdin.flush()
        import select
        if not select.select([self.proc.stdout], [], [], 60)[0]:     # a loader that never returns
            self.proc.kill()
            raise AssertionError(f"{case.name}: the victim did not return within 60 s")
        rc = int(self.proc.stdout.readline())
        return subprocess.CompletedProcess([case.name], rc, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def victim():
    v = Victim()
    try:
        yield v
    finally:
        v.close()


def _params(cases: list[payloads.Case]) -> list:
    return [
        pytest.param(case, id=case.name, marks=[pytest.mark.torch] if "torch" in case.needs else [])
        for case in cases
    ]


def _require(case: payloads.Case) -> None:
    for module in case.needs:
        needs.module(module)


def _build(case: payloads.Case, tmp_path: Path) -> tuple[Path, Path]:
    out_dir = tmp_path / "corpus"
    out_dir.mkdir()
    marker = tmp_path / "PWNED marker"  # a space: payloads must quote it properly
    path = case.build(out_dir, marker)
    assert path.is_file() and path.parent == out_dir
    assert not marker.exists(), "building the file must not trigger it"
    return path, marker


@pytest.mark.parametrize("case", _params(payloads.MALICIOUS))
def test_malicious_case_fires(case: payloads.Case, tmp_path: Path, victim: Victim) -> None:
    _require(case)
    path, marker = _build(case, tmp_path)
    proc = victim.load(case, path, tmp_path)
    detail = f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert marker.exists(), f"{case.name}: loading did not create the marker\n{detail}"
    assert marker.stat().st_size == 0
    if case.load_ok:
        assert proc.returncode == 0, f"{case.name}: victim should load without error\n{detail}"
    else:
        assert proc.returncode != 0, (
            f"{case.name}: victim was expected to fail after the payload\n{detail}"
        )


@pytest.mark.parametrize("case", _params(payloads.BENIGN))
def test_benign_case_loads(case: payloads.Case, tmp_path: Path, victim: Victim) -> None:
    _require(case)
    path, marker = _build(case, tmp_path)
    proc = victim.load(case, path, tmp_path)
    assert proc.returncode == 0, f"{case.name}: {proc.stderr}"
    assert proc.stdout.startswith("loaded ")
    assert not marker.exists()


@pytest.mark.parametrize("case", _params(payloads.MALFORMED))
def test_malformed_case_fails_to_load(case: payloads.Case, tmp_path: Path, victim: Victim) -> None:
    _require(case)
    path, marker = _build(case, tmp_path)
    proc = victim.load(case, path, tmp_path)
    assert proc.returncode != 0, f"{case.name}: loader accepted a malformed file: {proc.stdout}"
    assert "Traceback" in proc.stderr
    assert not marker.exists()


def test_case_names_are_unique_and_disjoint() -> None:
    names = [c.name for c in (*payloads.MALICIOUS, *payloads.BENIGN, *payloads.MALFORMED)]
    assert len(names) == len(set(names)) == len(payloads.ALL_CASES)


def test_truncate_helper(tmp_path: Path) -> None:
    src = tmp_path / "x.bin"
    src.write_bytes(bytes(range(100)))
    sizes = [p.stat().st_size for p in payloads.truncate(src, tmp_path, [1, 0.5, -1, 500])]
    assert sizes == [1, 50, 99, 99]


def test_memo_desync_resolves_to_os_system(tmp_path: Path) -> None:
    """Statically (pickletools), the STACK_GLOBAL args are 'os' and 'system'; a naive
    MEMOIZE counter would see 'collections' and 'OrderedDict' at those indexes."""
    import pickletools

    data = (
        payloads.ALL_CASES["memo_desync_stack_global"].build(tmp_path, tmp_path / "m").read_bytes()
    )
    real: dict[int, object] = {}
    naive: dict[int, object] = {}
    memoize_count = 0
    last = None
    gets = []
    for op, arg, _pos in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE"):
            last = arg
        elif op.name in ("BINPUT", "LONG_BINPUT"):
            real[arg] = naive[arg] = last
        elif op.name == "MEMOIZE":
            real[len(real)] = last
            naive[memoize_count] = last
            memoize_count += 1
        elif op.name in ("BINGET", "LONG_BINGET"):
            gets.append(arg)
    assert [real[i] for i in gets] == ["os", "system"]
    assert [naive[i] for i in gets] == ["collections", "OrderedDict"]


@pytest.mark.parametrize(
    "case", [c for c in payloads.MALICIOUS if c.load_ok and not c.needs], ids=lambda c: c.name
)
def test_assembled_pickles_pass_pickletools(case: payloads.Case, tmp_path: Path) -> None:
    """pickletools.dis checks every opcode argument, the stack and the marks."""
    import pickletools

    data = case.build(tmp_path, tmp_path / "m").read_bytes()
    pickletools.dis(data, out=io.StringIO())
