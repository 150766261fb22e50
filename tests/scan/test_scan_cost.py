"""What a scan costs is bounded by the file (issue 47): the source analysis of unknown
globals parses each module once per process, keeps an index rather than the syntax tree,
answers each name once, and a file's names share a budget of module parses past which the
names left stay unknown, saying so. No timings are asserted: parses are counted."""

from __future__ import annotations

import ast
import pickle
import sys
from collections import Counter
from pathlib import Path

import pytest

from hpcml.scan import gadgets
from hpcml.scan.gadgets import Analyser, Spent
from hpcml.scan.model import Verdict
from hpcml.scan.policy import default_policy
from hpcml.scan.scanner import scan_file
from tests.scan.payloads import POP, assemble, global_


@pytest.fixture
def parsed(monkeypatch) -> Counter:
    """How many times each file was parsed whole (a function read again alone is not)."""
    seen: Counter = Counter()
    real = ast.parse

    def counting(source, filename="<unknown>", *args, **kwargs):
        if filename != "<unknown>":
            seen[filename] += 1
        return real(source, filename, *args, **kwargs)

    monkeypatch.setattr(gadgets.ast, "parse", counting)
    return seen


def _library(root: Path, modules: int, functions: int) -> Path:
    """``modules`` modules of ``functions`` functions each, calling one another, one of them
    reaching ``os.system`` through two others."""
    lib = root / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "pkg" / "__init__.py").write_text("")
    for m in range(modules):
        body = [f"from pkg import m{(m + 1) % modules} as nxt", "import os"]
        for f in range(functions):
            body.append(f"def f{f}(x):\n    return nxt.f{(f + 1) % functions}(x) + helper(x)")
        body.append("def helper(x):\n    return len(x)")
        body.append("def shell(x):\n    return run(x)\ndef run(x):\n    return os.system(x)")
        (lib / "pkg" / f"m{m}.py").write_text("\n".join(body) + "\n")
    return lib


def test_each_module_is_parsed_once_and_each_name_answered_once(tmp_path, parsed):
    lib = _library(tmp_path, modules=12, functions=20)
    a = Analyser(paths=[str(lib)])
    names = [(f"pkg.m{m}", f"f{f}") for m in range(12) for f in range(20)]
    names += [(f"pkg.m{m}", f"name_{i}") for m in range(12) for i in range(50)]   # made up
    for module, name in names * 2:
        assert a.reach(module, name) is None
    assert a.reach("pkg.m3", "shell").path == ("pkg.m3.shell", "pkg.m3.run", "os.system")
    assert a.parses == 12 and set(parsed.values()) == {1} and len(parsed) == 12, parsed


def test_a_function_body_is_read_again_when_reached(tmp_path):
    """Only the index is kept: a body is re-read from its file at its place, which must hold
    for methods, decorators, text at column 0 inside a string and a declared encoding."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "legacy.py").write_bytes(
        b"# -*- coding: latin-1 -*-\n\"\"\"caf\xe9\"\"\"\nimport subprocess\nimport functools\n\n"
        b"class Runner:\n    x = 1\n\n    @functools.lru_cache(maxsize=None)\n"
        b"    def __init__(self, cmd):\n        doc = \"\"\"\nat column 0, caf\xe9\n\"\"\"\n"
        b"        subprocess.call(cmd)\n\n"
        b"def make(registry):\n    return registry.register(\n'x')\n"
        b"@staticmethod\ndef plain():\n    return 1\n")
    a = Analyser(paths=[str(lib)])
    r = a.reach("legacy", "Runner")
    assert r is not None and r.path == ("legacy.Runner", "legacy.Runner.__init__", "subprocess.call")
    assert a.reach("legacy", "plain") is None and a.reach("legacy", "make") is None
    assert a.parses == 1 and a.bodies >= 2


def test_indexes_are_dropped_past_their_budget_and_read_again(tmp_path, monkeypatch, parsed):
    lib = _library(tmp_path, modules=6, functions=3)
    monkeypatch.setattr(gadgets, "KEPT_SOURCE", 1)          # keep one module at a time
    a = Analyser(paths=[str(lib)])
    for m in range(6):
        assert a.reach(f"pkg.m{m}", "shell").kind == "process"
    assert len(a._modules) == 1 and a.reach("pkg.m0", "run") is not None
    assert parsed[str(lib / "pkg" / "m0.py")] == 2            # dropped, then parsed again


def _many_globals(path: Path, names: list[tuple[str, str]]) -> Path:
    path.write_bytes(assemble(2, *(global_(m, n) + POP for m, n in names), b"N"))
    return path


def test_a_many_globals_pickle_costs_a_bounded_number_of_parses(tmp_path, monkeypatch, parsed):
    """An attacker's file naming thousands of distinct globals across real and made-up
    modules: the file's names share FILE_PARSES; past it they stay unknown, saying so, and
    a gadget named before the budget was spent is still found."""
    monkeypatch.setattr(gadgets, "FILE_PARSES", 40)
    stdlib = sorted(p.stem for p in Path(ast.__file__).parent.glob("*.py")
                    if p.stem.isidentifier() and not p.stem.startswith("_"))[:200]
    names = [("uuid", "_get_command_stdout")]
    names += [(m, f"name_{i}") for i, m in enumerate(stdlib)]
    names += [(m, "main") for m in stdlib]
    names += [(f"madeup{i % 50}.sub{i}", f"name_{i}") for i in range(2000)]
    pkl = _many_globals(tmp_path / "many.pkl", names)
    policy = default_policy()
    res = scan_file(pkl, policy)
    by_name = {f.name: f for f in res.findings}
    assert len(by_name) == len(set(names))
    assert by_name["uuid._get_command_stdout"].verdict is Verdict.DANGEROUS
    analyser = gadgets.analyser(policy.is_dangerous, create=False)
    assert analyser is not None and analyser.parses <= 40 and set(parsed.values()) == {1}
    spent = [f for f in res.findings if "not analysed" in f.why]
    assert spent and all(f.verdict is Verdict.UNKNOWN for f in spent)
    note = policy.analysis_note()
    assert note is not None and f"{len(spent)} unknown global names were not analysed" in note
    # the next file starts a budget of its own, and is told nothing about this one
    policy.start_file()
    assert policy.analysis_note() is None
    assert policy.judge(*names[-1])[1] == "not on the allowlist"


def test_a_budget_spent_leaves_the_answer_unremembered(tmp_path, monkeypatch):
    lib = _library(tmp_path, modules=4, functions=2)
    monkeypatch.setattr(gadgets, "FILE_PARSES", 1)
    a = Analyser(paths=[str(lib)])
    assert a.reach("pkg.m0", "shell") is not None               # pkg.m0: the one parse
    with pytest.raises(Spent):
        a.reach("pkg.m1", "shell")
    a.start_file()
    assert a.reach("pkg.m1", "shell") is not None


def test_a_name_named_a_million_times_is_judged_once(tmp_path, monkeypatch):
    policy = default_policy()
    calls: Counter = Counter()
    real = type(policy).classify

    def counting(self, module, name):
        calls[(module, name)] += 1
        return real(self, module, name)

    monkeypatch.setattr(type(policy), "classify", counting)
    pkl = tmp_path / "repeat.pkl"
    pkl.write_bytes(assemble(2, *[global_("collections", "OrderedDict") + POP] * 100_000,
                             global_("hpcml_no_such", "thing") + POP, b"N"))
    res = scan_file(pkl, policy)
    assert [(f.name, f.count) for f in res.findings if f.name == "collections.OrderedDict"] == \
        [("collections.OrderedDict", 100_000)]
    assert calls[("collections", "OrderedDict")] == 1


def test_the_policy_travels_to_workers_without_its_answers():
    policy = default_policy()
    policy.judge("hpcml_no_such", "thing")
    assert policy._judged
    copy = pickle.loads(pickle.dumps(policy))
    assert copy._judged == {} and copy.safe_exact == policy.safe_exact
    assert copy.judge("collections", "OrderedDict")[0] is Verdict.SAFE


def test_new_lists_drop_the_answers():
    from hpcml.files import ConfigLoader
    from hpcml.scan.policy import PolicyFile
    policy = default_policy()
    assert policy.judge("hpcml_site", "thing")[0] is Verdict.UNKNOWN
    policy.extend(PolicyFile.parse({"safe": ["hpcml_site.thing"]}, ConfigLoader("site.yaml", {})), "site")
    assert policy.judge("hpcml_site", "thing")[0] is Verdict.SAFE


def test_sources_are_found_from_directory_listings(tmp_path):
    """One listing per directory, however many names are looked up in it."""
    lib = tmp_path / "lib"
    (lib / "pkg" / "ns").mkdir(parents=True)
    (lib / "pkg" / "__init__.py").write_text("")
    (lib / "pkg" / "mod.py").write_text("")
    (lib / "pkg" / "fast.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    listings: dict = {}
    find = gadgets.find_source
    assert find("pkg.mod", [str(lib)], listings) == lib / "pkg" / "mod.py"
    assert find("pkg", [str(lib)], listings) == lib / "pkg" / "__init__.py"
    assert find("pkg.ns", [str(lib)], listings) is None                  # a namespace package
    assert find("pkg.fast", [str(lib)], listings) is None                # an extension
    for i in range(1000):
        assert find(f"pkg.made_up_{i}", [str(lib)], listings) is None
    assert len(listings) <= 3
    assert find("os", None) is not None and find("os", [str(lib)]) is None and sys.path
