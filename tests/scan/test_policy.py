"""The built-in policy file is read without PyYAML (start-up): what that reader takes
must be exactly what YAML says the file holds, and it refuses any other shape."""

from __future__ import annotations

import importlib.resources

import pytest
import yaml

from hpcml.scan.policy import builtin_lists, default_policy, not_advised


def test_the_builtin_reader_agrees_with_yaml_on_the_shipped_file():
    text = importlib.resources.files("hpcml.scan.policy").joinpath("default.yaml").read_text()
    assert builtin_lists(text) == yaml.safe_load(text)
    assert "os.*" in builtin_lists(text)["dangerous"] and default_policy().block_unknown is True


@pytest.mark.parametrize("text", ["safe:\n  - a.b\nnested:\n  inner: 1\n", "block_unknown: maybe\n",
                                  "safe: [a.b]\n", "  - orphan.item\n"])
def test_the_builtin_reader_refuses_what_it_does_not_know(text):
    with pytest.raises(ValueError):
        builtin_lists(text)


def test_not_advised_names():
    assert not_advised("mypkg.models.Net") is None and not_advised("__main__.Net") is None
    assert "private" in not_advised("mypkg._impl.helper")
    assert "private" in not_advised("_pyrepl.pager.pipe_pager")
    assert "standard-library" in not_advised("imaplib.IMAP4")
    assert "private" in not_advised("mypkg.Net.__reduce__")


def test_every_safe_entry_says_what_it_receives_and_why_that_is_safe():
    """The allowlist is a list of capabilities: each line carries its argument (a comment)."""
    from hpcml.scan.policy import BUILTIN_FILES
    entries = []
    for name in BUILTIN_FILES:
        text = importlib.resources.files("hpcml.scan.policy").joinpath(name).read_text()
        assert builtin_lists(text) == yaml.safe_load(text), name
        safe = text.split("\nsafe:\n", 1)[1].split("\ndangerous:\n", 1)[0]
        entries += [ln for ln in safe.splitlines() if ln.startswith("  - ")]
    assert len(entries) > 500
    bare = [ln for ln in entries if " # " not in ln or len(ln.split(" # ", 1)[1].strip()) < 5]
    assert not bare, bare
    checked = {ln.split()[1] for ln in entries if "# checked" in ln}
    from hpcml.scan.argchecks import CALLERS, CHECKS
    from hpcml.scan.formats.joblib import FILE_WRAPPER  # the file it opens: formats/joblib.py
    known = set(CHECKS) | set(CALLERS) | {FILE_WRAPPER}
    assert checked and checked <= known, checked - known
    assert set(CHECKS) <= {ln.split()[1] for ln in entries}


def test_a_pattern_never_admits_a_private_name(tmp_path):
    from hpcml.scan.policy import load_policy
    site = tmp_path / "site.yaml"
    site.write_text("safe:\n  - mylab.models.*\n  - numpy.dtypes.*\n")
    policy = load_policy(site)
    assert policy.classify("mylab.models.net", "Net")[0].value == "safe"
    for module, name in [("mylab.models.net", "_helper"), ("mylab.models._impl", "Net"),
                         ("numpy.dtypes", "_add_dtype_helper")]:
        assert policy.classify(module, name)[0].value != "safe", (module, name)
    assert default_policy().classify("numpy.dtypes", "Float64DType")[0].value == "safe"


@pytest.mark.parametrize("module, name", [
    ("torch", "compile.dangerous"), ("builtins", "eval.__call__"), ("__future__", "_ssl.RAND_bytes"),
    ("yaml", "unsafe_load"), ("yaml", "UnsafeLoader"), ("yaml.constructor", "UnsafeConstructor"),
    ("ruamel.yaml", "YAML"), ("jsonpickle", "decode"), ("hydra.utils", "instantiate"),
    ("_interpreters", "create"), ("_xxsubinterpreters", "run_string"), ("torch._dynamo", "anything"),
    ("torch._inductor.codecache", "compile_file"), ("torch.utils.bottleneck.__main__", "run_cprofile"),
    ("linecache", "getline"), ("numpy.lib.format", "read_array"),
])
def test_names_that_run_code_or_reach_it_are_dangerous(module, name):
    assert default_policy().judge(module, name)[0].value == "dangerous", (module, name)


@pytest.mark.parametrize("module, name", [
    ("builtins", "len"), ("__future__", "annotations"), ("__future__", "division"),
    ("numpy.random.bit_generator", "SeedSequence"), ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("numpy.ma", "MaskedArray"), ("torch", "sparse_csc"), ("torch", "quint4x2"),
])
def test_what_users_pickle_every_day_is_allowed(module, name):
    assert default_policy().classify(module, name)[0].value == "safe", (module, name)
