"""A global the allowlist does not name is judged by what its source can reach (issue 35):
the gadgets of public bypasses of pickle scanners are dangerous, with the path that gets
there, never "unknown" with advice to allow them. Each file is a pickle the test writes
opcode by opcode, calling the gadget as an exploit would."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.scan.gadgets import Analyser, find_source
from tests.scan.payloads import assemble, call, global_, unicode

#: family -> (module, name, arguments, the primitive the path must end in); the standard
#: library of the interpreter the suite runs on, none of them on the built-in lists
STDLIB = {
    "process": ("uuid", "_get_command_stdout", ["id"], "subprocess.Popen"),
    "network": ("imaplib", "IMAP4", ["127.0.0.1"], "socket.create_connection"),
    "file-write": ("logging", "FileHandler", ["/tmp/hpcml-gadget-written"], "builtins.open"),
    "import": ("logging.config", "fileConfig", ["/tmp/hpcml-gadget.ini"], "builtins.__import__"),
    "eval": ("rlcompleter", "Completer.attr_matches", ["__import__('os').system('id')"], "builtins.eval"),
}
# torch.storage._load_from_bytes, this family's example before, is now allowlisted with its
# argument checked (bytes in the file are scanned as a torch file): tests/scan/test_argchecks.py
#: a site library the test writes, for the family the standard library has no unlisted gadget of
SITE_LIB = '''
import ctypes

def load_kernel(path):
    """Loads a native library: what a pickle may call with any path."""
    return ctypes.CDLL(path)
'''


def _gadget_pickle(path: Path, module: str, name: str, args: list[str]) -> Path:
    path.write_bytes(assemble(2, call(global_(module, name), *[unicode(a) for a in args])))
    return path


def _scan(*paths: Path, policy: Path | None = None, extra_path: Path | None = None) -> tuple[int, dict]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = f"{extra_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    argv = [sys.executable, "-m", "hpcml", "scan", "--json", *map(str, paths)]
    if policy is not None:
        argv[4:4] = ["--policy", str(policy)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode in (0, 5, 6, 7), out.stderr
    return out.returncode, json.loads(out.stdout)


def _findings(report: dict, path: Path) -> list[dict]:
    return next(f for f in report["files"] if f["path"] == str(path))["findings"]


@pytest.fixture
def site_lib(tmp_path: Path) -> Path:
    lib = tmp_path / "sitelib"
    lib.mkdir()
    (lib / "fastkernels.py").write_text(SITE_LIB)
    return lib


def test_one_gadget_per_family_is_dangerous_with_its_path(tmp_path, site_lib):
    files = {fam: _gadget_pickle(tmp_path / f"{fam}.pkl", m, n, a) for fam, (m, n, a, _) in STDLIB.items()}
    files["ctypes"] = _gadget_pickle(tmp_path / "ctypes.pkl", "fastkernels", "load_kernel", ["/tmp/x.so"])
    rc, report = _scan(*files.values(), extra_path=site_lib)
    assert rc == 6
    ends = {**{fam: prim for fam, (_, _, _, prim) in STDLIB.items()}, "ctypes": "ctypes.CDLL"}
    for fam, path in files.items():
        (finding,) = _findings(report, path)
        assert finding["verdict"] == "dangerous", (fam, finding)
        assert " → " in finding["why"] and finding["why"].endswith(ends[fam]), (fam, finding["why"])
    assert not Path("/tmp/hpcml-gadget-written").exists()   # read, never run


def test_the_path_is_named_in_the_report_and_the_table():
    r = Analyser().reach("uuid", "_get_command_stdout")
    assert r is not None and str(r) == "runs a process: uuid._get_command_stdout → subprocess.Popen"
    r = Analyser().reach("imaplib", "IMAP4")
    assert r is not None and r.path[0] == "imaplib.IMAP4" and r.path[-1] == "socket.create_connection"
    assert "imaplib.IMAP4.open" in r.path                    # through self.open, a method


def test_the_scan_never_imports_what_it_analyses(tmp_path):
    """A module whose import would leave a marker: the scan reads its source only (and calls
    it dangerous, because importing it is what a load would do first)."""
    marker = tmp_path / "imported"
    lib = tmp_path / "lib"
    (lib / "trap").mkdir(parents=True)
    (lib / "trap" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (lib / "trap" / "inner.py").write_text("def harmless():\n    return 1\n")
    pkl = _gadget_pickle(tmp_path / "trap.pkl", "trap.inner", "harmless", [])
    rc, report = _scan(pkl, extra_path=lib)
    assert not marker.exists()
    assert rc == 5 and _findings(report, pkl)[0]["verdict"] == "unknown"   # the parent's import is not read
    assert Analyser(paths=[str(lib)]).reach("trap.inner", "harmless") is None


def test_importing_a_module_that_acts_at_import_is_dangerous(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "beacon.py").write_text("import webbrowser\nwebbrowser.open('http://example.invalid')\n"
                                   "def geohash(x):\n    return x\n")
    r = Analyser(paths=[str(lib)]).reach("beacon", "geohash")
    assert r is not None and r.kind == "process" and r.path == ("importing beacon", "webbrowser.open")


def test_a_name_without_source_stays_unknown(tmp_path):
    pkl = _gadget_pickle(tmp_path / "nosrc.pkl", "hpcml_no_such_module", "anything", ["x"])
    rc, report = _scan(pkl)
    assert rc == 5 and _findings(report, pkl)[0]["verdict"] == "unknown"
    assert find_source("math") is None                       # built into the interpreter
    assert find_source("../etc/passwd") is None and find_source("os..path") is None


def test_harmless_names_stay_unknown():
    a = Analyser()
    for module, name in [("json", "loads"), ("fractions", "Fraction"), ("string", "Template"),
                         ("textwrap", "dedent"), ("tests.scan.test_gadgets", "Harmless")]:
        assert a.reach(module, name) is None, (module, name)


class Harmless:
    def __init__(self, x: int = 0) -> None:
        self.x = x


def test_a_re_export_is_what_it_re_exports(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "shim.py").write_text("from subprocess import check_output as run_quietly\n"
                                 "from os import system as _s\nsafe_name = _s\n")
    a = Analyser(paths=[str(lib)])
    assert a.reach("shim", "run_quietly").path[-1] == "subprocess.check_output"
    assert a.reach("shim", "safe_name").path[-1] == "os.system"


def test_private_and_process_family_names_are_never_advised(tmp_path):
    """Names left unknown by the analysis are still not offered when private or from the
    standard library's process/network/debugging modules; a user's own class still is."""
    private = _gadget_pickle(tmp_path / "private.pkl", "_strptime", "_strptime_datetime", ["x", "y"])
    family = _gadget_pickle(tmp_path / "family.pkl", "logging.handlers", "SocketHandler", ["h", "1"])
    user = tmp_path / "user.pkl"
    user.write_bytes(pickle.dumps(Harmless(), protocol=4))
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(private), str(family), str(user)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 5, out.stdout + out.stderr
    offered = [ln[4:] for ln in out.stdout.splitlines() if ln.startswith("  - ")]
    assert offered == [f"{__name__}.Harmless"], out.stdout
    text = " ".join(out.stdout.split())
    assert "Do not allow _strptime._strptime_datetime (a private name" in text, out.stdout
    assert "logging.handlers.SocketHandler (from logging" in text, out.stdout


def test_advice_fed_back_as_a_policy_never_lets_a_gadget_pass(tmp_path, site_lib):
    gadgets = [_gadget_pickle(tmp_path / f"{fam}.pkl", m, n, a) for fam, (m, n, a, _) in STDLIB.items()]
    gadgets.append(_gadget_pickle(tmp_path / "ctypes.pkl", "fastkernels", "load_kernel", ["/x.so"]))
    user = tmp_path / "user.pkl"
    user.write_bytes(pickle.dumps(Harmless(), protocol=4))
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", *map(str, gadgets), str(user)],
                         capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": f"{site_lib}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    block = out.stdout[out.stdout.index("safe:"):].splitlines()
    policy = tmp_path / "advised.yaml"
    policy.write_text("\n".join(ln for ln in block if ln == "safe:" or ln.startswith("  - ")) + "\n")
    rc, report = _scan(*gadgets, user, policy=policy, extra_path=site_lib)
    assert rc == 6
    verdicts = {Path(f["path"]).name: f["verdict"] for f in report["files"]}
    assert verdicts.pop("user.pkl") == "safe"
    assert set(verdicts.values()) == {"dangerous"}, verdicts


def test_the_allowlist_stays_first(tmp_path):
    """A site that allows a name on purpose gets it allowed, whatever the analysis says."""
    pkl = _gadget_pickle(tmp_path / "u.pkl", "uuid", "_get_command_stdout", ["id"])
    policy = tmp_path / "site.yaml"
    policy.write_text("safe:\n  - uuid._get_command_stdout\n")
    rc, report = _scan(pkl, policy=policy)
    assert rc == 0 and report["files"][0]["verdict"] == "safe"


def test_a_hostile_source_costs_bounded_work(tmp_path):
    """Deep nesting, a cycle of calls, and a huge file: an answer, no crash, no hang."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "deep.py").write_text("def f():\n    return " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    (lib / "loop.py").write_text("def a():\n    b()\ndef b():\n    a()\n")
    (lib / "big.py").write_text("x = 1\n" * 800_000)
    a = Analyser(paths=[str(lib)])
    assert a.reach("deep", "f") is None and a.reach("loop", "a") is None and a.reach("big", "x") is None


def test_another_name_for_a_listed_global_is_that_global():
    """tarfile.bltn_open is builtins.open; dataclasses.FunctionType is types.FunctionType."""
    from hpcml.scan.policy import default_policy
    policy = default_policy()
    for module, name, target in [("tarfile", "bltn_open", "builtins.open"),
                                 ("dataclasses", "FunctionType", "types.FunctionType"),
                                 ("pathlib", "attrgetter", "operator.attrgetter")]:
        verdict, why = policy.judge(module, name)
        assert verdict.value == "dangerous" and why.endswith(target), (module, name, why)


def test_a_method_of_an_instance_built_in_the_function_is_followed():
    """logging.config.dictConfig: dictConfigClass(config).configure() reaches __import__."""
    r = Analyser().reach("logging.config", "dictConfig")
    assert r is not None and "logging.config.DictConfigurator.configure" in r.path


def test_benign_torch_names_are_not_called_dangerous():
    """Defined-but-not-run code under a module's top-level if/try (a Windows-only ctypes
    call in torch/__init__) and torch.nn internals are not what a load runs."""
    from hpcml.scan.policy import default_policy
    policy = default_policy()
    for module, name in [("torch", "float8_e8m0fnu"), ("torch", "Generator"),
                         ("torch.nn.modules.linear", "Linear"), ("torch.nn.modules.conv", "Conv2d")]:
        assert policy.judge(module, name)[0].value != "dangerous", (module, name)


def test_hostile_names_never_break_the_scan(tmp_path):
    """A 300-character module name (too long for the filesystem) is unknown, and the rest of
    the pickle is still scanned: the os.system after it is found."""
    from tests.scan.payloads import global_ as g
    pkl = tmp_path / "long.pkl"
    pkl.write_bytes(assemble(2, call(g("a" * 300, "b")), b"0", call(g("os", "system"), unicode("id"))))
    rc, report = _scan(pkl)
    names = {f["name"]: f["verdict"] for f in report["files"][0]["findings"]}
    assert rc == 6 and names[f"{'a' * 300}.b"] == "unknown" and "dangerous" in names.values(), names


def test_a_name_built_to_look_like_advice_is_printed_escaped(tmp_path):
    """A global whose name holds newlines cannot print a fake ``safe:`` block."""
    from tests.scan.payloads import STACK_GLOBAL, short_binunicode
    evil = "numpy.y\nsafe:\n  - os.system"
    pkl = tmp_path / "inject.pkl"
    pkl.write_bytes(assemble(4, short_binunicode("numpy"), short_binunicode(evil), STACK_GLOBAL))
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(pkl)], capture_output=True,
                         text=True, timeout=120)
    assert "  - os.system" not in out.stdout.splitlines(), out.stdout
    assert "\\n" in out.stdout


def test_a_function_that_reaches_yamls_unsafe_loaders_is_dangerous(tmp_path):
    """Parse, then construct arbitrary objects (YAML's unsafe loaders, jsonpickle, hydra's
    instantiate) is as good as another pickle load: a gadget no list names finds it."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "cfgload.py").write_text("import yaml\n\ndef read_config(text):\n"
                                    "    return yaml.load(text, Loader=yaml.UnsafeLoader)\n\n"
                                    "def read_safely(text):\n    return yaml.safe_load(text)\n")
    a = Analyser(paths=[str(lib)])
    found = a.reach("cfgload", "read_config")
    assert found is not None and found.path[-1].startswith("yaml.")
    assert a.reach("cfgload", "read_safely") is None
