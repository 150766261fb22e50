"""hpcml scan requirements: each rule on real files, clean files staying clean, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.scan.requirements import RULES, check_requirements, load_squat_list

H1 = "sha256:" + "1" * 64
H2 = "sha256:" + "2" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NIGHTLY = "https://download.pytorch.org/whl/nightly/cpu"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def hits(report, rule: str | None = None) -> set:
    """(rule, package) pairs, or the packages for one rule."""
    if rule is None:
        return {(f.rule, f.package) for f in report.findings}
    return {f.package for f in report.findings if f.rule == rule}


def only(report, rule: str):
    [finding] = [f for f in report.findings if f.rule == rule]
    return finding


def scan(tmp_path: Path, text: str, name: str = "requirements.txt", **kw):
    return check_requirements(write(tmp_path, name, text), **kw)


# --------------------------------------------------------------------------- clean input

def test_clean_pinned_hashed_file_has_no_findings(tmp_path):
    report = scan(tmp_path, f"""\
# pinned, hashed, from PyPI only
--require-hashes
numpy==1.26.4 --hash={H1}
torch[cuda]==2.1.0 ; sys_platform == "linux" \\
    --hash={H1} \\
    --hash={H2}
pandas===2.2.0 --hash={H2}  # exact, arbitrary-equality pin
tool @ git+https://github.com/acme/tool@{COMMIT} --hash={H1}
wheel @ https://example.com/wheel-0.42.0-py3-none-any.whl#sha256={"3" * 64} --hash={H1}
-e ./local/checkout
""", internal_names=["acme-private"])
    assert report.kind == "requirements"
    assert report.packages == 6
    assert report.findings == []


# --------------------------------------------------------------------------- mixed-index

def test_torchtriton_behind_pytorch_nightly_extra_index(tmp_path):
    path = write(tmp_path, "requirements.txt", f"--extra-index-url {NIGHTLY}\ntorch\ntorchtriton\n")
    report = check_requirements(path)
    mixed = only(report, "mixed-index")
    assert (mixed.severity, mixed.line, mixed.file) == ("high", 1, str(path))
    assert NIGHTLY in mixed.message and "torchtriton" in mixed.message
    assert hits(report, "known-squat") == {"torchtriton"}
    # every index is searched for every name: both lines need pins and hashes
    assert hits(report, "unpinned") == {"torch", "torchtriton"}
    assert hits(report, "missing-hash") == {"torch", "torchtriton"}


def test_private_packages_under_mixed_index_are_high(tmp_path):
    report = scan(tmp_path, "--extra-index-url https://pypi.acme.example/simple\nacme-utils>=1\nnumpy>=1\n",
                  internal_names=["Acme_Utils"])
    severity = {(f.rule, f.package): f.severity for f in report.findings}
    assert severity[("unpinned", "acme-utils")] == "high"
    assert severity[("missing-hash", "acme-utils")] == "high"
    assert severity[("unknown-internal", "acme-utils")] == "high"
    assert severity[("unpinned", "numpy")] == "medium"


@pytest.mark.parametrize("options", [
    "--index-url https://pypi.acme.example/simple\n--extra-index-url https://pypi.org/simple/\n",
    "--find-links https://wheels.acme.example/\n",
    "--find-links ./wheelhouse\n",
])
def test_any_second_source_beside_pypi_is_mixed(tmp_path, options):
    report = scan(tmp_path, options + f"numpy==1.26.4 --hash={H1}\n")
    assert only(report, "mixed-index").line in (1, 2)


@pytest.mark.parametrize("options", [
    "",                                                          # PyPI alone
    "--index-url https://pypi.acme.example/simple\n",            # private index alone
    "--no-index\n--extra-index-url https://pypi.acme.example/simple\n--find-links ./wheelhouse\n",
    "-i https://pypi.org/simple\n--extra-index-url https://test.pypi.org/simple\n",  # both public
])
def test_single_kind_of_source_is_not_mixed(tmp_path, options):
    report = scan(tmp_path, options + f"numpy==1.26.4 --hash={H1}\n")
    assert report.findings == []


# --------------------------------------------------------------------------- insecure-index

def test_http_index_and_find_links_are_insecure(tmp_path):
    report = scan(tmp_path, """\
--index-url http://mirror.acme.example/simple
--find-links=http://user:secret@wheels.acme.example/
--extra-index-url https://pypi.acme.example/simple
--extra-index-url http://localhost:8080/simple
--extra-index-url http://127.0.0.1/simple
numpy==1.26.4
""")
    insecure = [f for f in report.findings if f.rule == "insecure-index"]
    assert [(f.line, f.severity) for f in insecure] == [(1, "high"), (2, "high")]
    assert "secret" not in insecure[1].message        # credentials never reach the report


# --------------------------------------------------------------------------- unpinned

@pytest.mark.parametrize("spec", ["", ">=1.24", "~=1.26.0", "==1.*", ">=1,<2", "!=1.25"])
def test_ranges_and_bare_names_are_unpinned(tmp_path, spec):
    report = scan(tmp_path, f"numpy{spec}\n")
    assert hits(report) == {("unpinned", "numpy")}
    assert only(report, "unpinned").severity == "medium"


@pytest.mark.parametrize("spec", ["==1.26.4", "===1.26.4", ">=1,==1.26.4", "[dev]==1.26.4 ; python_version>'3'"])
def test_exact_pins_are_pinned(tmp_path, spec):
    assert scan(tmp_path, f"numpy{spec}\n").findings == []


# --------------------------------------------------------------------------- missing-hash

def test_missing_hash_only_once_hash_checking_mode_is_on(tmp_path):
    assert scan(tmp_path, "numpy==1.26.4\nscipy==1.12.0\n").findings == []
    report = scan(tmp_path, f"numpy==1.26.4 --hash={H1}\nscipy==1.12.0\n")
    assert hits(report) == {("missing-hash", "scipy")}
    report = scan(tmp_path, "--require-hashes\nnumpy==1.26.4\n")
    assert hits(report) == {("missing-hash", "numpy")}


# --------------------------------------------------------------------------- known-squat

@pytest.mark.parametrize("name, canonical", [
    ("torchtriton", "torchtriton"), ("colourama", "colourama"), ("jeIlyfish", "jeilyfish"),
    ("python3_dateutil", "python3-dateutil"), ("urlib3", "urlib3"), ("Request", "request"),
])
def test_known_squats_are_reported_once(tmp_path, name, canonical):
    report = scan(tmp_path, f"{name}==1.0\n")
    assert hits(report) == {("known-squat", canonical)}
    assert only(report, "known-squat").severity == "high"


# --------------------------------------------------------------------------- confusable-name

@pytest.mark.parametrize("name, target", [
    ("nunpy", "numpy"), ("numpyy", "numpy"), ("reqeusts", "requests"), ("scikitlearn", "scikit-learn"),
    ("pi1low", "pillow"), ("t0rch", "torch"), ("tensorfIow", "tensorflow"), ("transforrners", "transformers"),
    ("torch-vision", "torchvision"),
])
def test_confusable_names(tmp_path, name, target):
    report = scan(tmp_path, f"{name}==1.0\n")
    finding = only(report, "confusable-name")
    assert finding.severity == "medium" and target in finding.message


@pytest.mark.parametrize("name", ["numpy", "torch", "scikit_learn", "torchx", "scapy", "flask", "jaxb", "xarray"])
def test_real_names_are_not_confusable(tmp_path, name):
    assert scan(tmp_path, f"{name}==1.0\n").findings == []


def test_internal_names_are_not_confusable(tmp_path):
    assert scan(tmp_path, "--index-url https://pypi.acme.example/simple\nnumpyy==1.0\n",
                internal_names=["numpyy"]).findings == []


# --------------------------------------------------------------------------- unknown-internal

def test_internal_name_from_pypi(tmp_path):
    text = "acme-core==1.0\nnumpy==1.26.4\n"
    report = scan(tmp_path, text, internal_names=["acme_core"])
    assert hits(report) == {("unknown-internal", "acme-core")}
    assert only(report, "unknown-internal").line == 1
    assert scan(tmp_path, text).findings == []             # no internal names given: rule skipped
    private_only = "--index-url https://pypi.acme.example/simple\n" + text
    assert scan(tmp_path, private_only, internal_names=["acme-core"]).findings == []


# --------------------------------------------------------------------------- direct-url

@pytest.mark.parametrize("line, package, severity", [
    ("pkg @ https://example.com/pkg-1.0.tar.gz", "pkg", "low"),
    ("https://example.com/wheels/pkg-1.0-py3-none-any.whl", "pkg", "low"),
    ("git+https://github.com/acme/pkg@main#egg=pkg", "pkg", "low"),
    ("-e git+https://github.com/acme/pkg.git@v1.0#egg=pkg", "pkg", "low"),
    ("pkg @ http://example.com/pkg-1.0.tar.gz", "pkg", "medium"),
])
def test_unpinned_direct_urls(tmp_path, line, package, severity):
    report = scan(tmp_path, line + "\n")
    assert hits(report) == {("direct-url", package)}
    assert only(report, "direct-url").severity == severity


@pytest.mark.parametrize("line", [
    f"pkg @ https://example.com/pkg-1.0.tar.gz#sha256={'a' * 64}",
    f"pkg @ https://example.com/pkg-1.0.tar.gz --hash={H1}",
    f"git+https://github.com/acme/pkg@{COMMIT}#egg=pkg",
    f"pkg @ git+ssh://git@github.com/acme/pkg.git@{COMMIT}",
    "./vendor/pkg", "-e .", "pkg @ file:///opt/wheels/pkg-1.0-py3-none-any.whl",
])
def test_pinned_or_local_locations_are_fine(tmp_path, line):
    assert scan(tmp_path, line + "\n").findings == []


# --------------------------------------------------------------------------- includes, continuations

def test_includes_and_constraints(tmp_path):
    write(tmp_path, "reqs/base.txt", "-c constraints.txt\nnumpy\npandas>=2\n-r common.txt\n")
    write(tmp_path, "reqs/constraints.txt", "numpy==1.26.4\n")
    common = write(tmp_path, "reqs/common.txt", f"--extra-index-url {NIGHTLY}\n")
    main = write(tmp_path, "requirements.txt", "-r reqs/base.txt\n--requirement=reqs/common.txt\ntorch==2.1.0\n")
    report = check_requirements(main)
    assert report.packages == 3                            # constraints install nothing
    unpinned = only(report, "unpinned")                    # numpy is pinned by the constraints file
    assert (unpinned.package, unpinned.line, unpinned.file) == ("pandas", 3, str(tmp_path / "reqs" / "base.txt"))
    mixed = only(report, "mixed-index")                    # common.txt is read once
    assert (mixed.file, mixed.line) == (str(common), 1)
    assert hits(report, "missing-hash") == {"numpy", "pandas", "torch"}


def test_line_continuations(tmp_path):
    report = scan(tmp_path, f"""\
numpy==1.26.4 \\
    --hash={H1} \\
    --hash={H2}
scipy>=1.12 \\
  # a comment line ends the continuation
pandas==2.2.0 \\
""")
    assert {(f.rule, f.package, f.line) for f in report.findings} == {
        ("unpinned", "scipy", 4), ("missing-hash", "scipy", 4), ("missing-hash", "pandas", 6)}


# --------------------------------------------------------------------------- lock files

UV_LOCK = f"""\
version = 1
requires-python = ">=3.11"

[[package]]
name = "demo"
version = "0.1.0"
source = {{ editable = "." }}
dependencies = [
    {{ name = "numpy" }},
    {{ name = "torch" }},
]

[[package]]
name = "numpy"
version = "1.26.4"
source = {{ registry = "https://pypi.org/simple" }}
sdist = {{ url = "https://files.pythonhosted.org/packages/numpy-1.26.4.tar.gz", hash = "{H1}", size = 1 }}
wheels = [
    {{ url = "https://files.pythonhosted.org/packages/numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl", hash = "{H2}", size = 1 }},
]

[[package]]
name = "torch"
version = "2.1.0+cpu"
source = {{ registry = "https://download.pytorch.org/whl/cpu" }}
wheels = [
    {{ url = "https://download.pytorch.org/whl/cpu/torch-2.1.0%2Bcpu-cp311-cp311-linux_x86_64.whl", hash = "{H1}" }},
]

[[package]]
name = "torchtriton"
version = "3.0.0"
source = {{ registry = "https://pypi.org/simple" }}
sdist = {{ url = "https://files.pythonhosted.org/packages/torchtriton-3.0.0.tar.gz", hash = "{H2}" }}

[[package]]
name = "acme-utils"
version = "9.9.9"
source = {{ registry = "https://pypi.org/simple" }}

[[package]]
name = "acme-core"
version = "1.0.0"
source = {{ registry = "https://pypi.acme.example/simple" }}
wheels = [
    {{ url = "https://pypi.acme.example/packages/acme_core-1.0.0-py3-none-any.whl", hash = "{H1}" }},
]

[[package]]
name = "tool-a"
version = "0.3.0"
source = {{ git = "https://github.com/acme/tool-a?rev=main#{COMMIT}" }}

[[package]]
name = "tool-b"
version = "0.1.0"
source = {{ git = "https://github.com/acme/tool-b?branch=main" }}
"""


def test_uv_lock(tmp_path):
    report = check_requirements(write(tmp_path, "uv.lock", UV_LOCK), internal_names=["acme-utils", "acme-core"])
    assert (report.kind, report.packages) == ("uv.lock", 8)
    assert hits(report) == {
        ("mixed-index", None), ("known-squat", "torchtriton"), ("missing-hash", "acme-utils"),
        ("unknown-internal", "acme-utils"), ("direct-url", "tool-b")}
    mixed = only(report, "mixed-index")
    assert mixed.line == 23 and "https://download.pytorch.org/whl/cpu (1: torch)" in mixed.message
    assert only(report, "missing-hash").severity == "high"     # an internal name, indexes mixed
    assert only(report, "known-squat").line == 31


POETRY_LOCK = f"""\
# This file is automatically @generated by Poetry 1.8.2 and should not be changed by hand.

[[package]]
name = "numpy"
version = "1.26.4"
description = "Fundamental package for array computing in Python"
optional = false
python-versions = ">=3.9"
files = [
    {{file = "numpy-1.26.4.tar.gz", hash = "{H1}"}},
]

[[package]]
name = "pandsa"
version = "2.0.0"
description = ""
optional = false
python-versions = "*"
files = []

[[package]]
name = "torch"
version = "2.1.0+cpu"
description = "Tensors and Dynamic neural networks in Python"
optional = false
python-versions = ">=3.8.0"
files = [
    {{file = "torch-2.1.0+cpu-cp311-cp311-linux_x86_64.whl", hash = "{H2}"}},
]

[package.source]
type = "legacy"
url = "https://download.pytorch.org/whl/cpu"
reference = "pytorch"

[[package]]
name = "tool"
version = "0.1.0"
description = ""
optional = false
python-versions = "*"
files = []
develop = false

[package.source]
type = "git"
url = "https://github.com/acme/tool.git"
reference = "main"
resolved_reference = "{COMMIT}"

[metadata]
lock-version = "2.0"
python-versions = "^3.11"
content-hash = "{"c" * 64}"
"""


def test_poetry_lock(tmp_path):
    report = check_requirements(write(tmp_path, "poetry.lock", POETRY_LOCK))
    assert (report.kind, report.packages) == ("poetry.lock", 4)
    assert hits(report) == {("mixed-index", None), ("confusable-name", "pandsa"), ("missing-hash", "pandsa")}
    assert only(report, "confusable-name").line == 14
    assert only(report, "missing-hash").severity == "medium"   # from PyPI, not the private index


def test_poetry_1_lock_keeps_hashes_in_metadata_files(tmp_path):
    lock = f"""\
[[package]]
name = "numpy"
version = "1.26.4"
category = "main"

[[package]]
name = "scipy"
version = "1.12.0"
category = "main"

[metadata]
lock-version = "1.1"
content-hash = "x"

[metadata.files]
numpy = [
    {{file = "numpy-1.26.4.tar.gz", hash = "{H1}"}},
]
"""
    report = check_requirements(write(tmp_path, "poetry.lock", lock))
    assert hits(report) == {("missing-hash", "scipy")}


PIPFILE_LOCK = {
    "_meta": {
        "hash": {"sha256": "c" * 64},
        "pipfile-spec": 6,
        "requires": {"python_version": "3.11"},
        "sources": [
            {"name": "pypi", "url": "https://pypi.org/simple", "verify_ssl": True},
            {"name": "acme", "url": "https://pypi.acme.example/simple", "verify_ssl": False},
        ],
    },
    "default": {
        "requests": {"hashes": [H1], "index": "pypi", "version": "==2.31.0"},
        "acme-core": {"index": "acme", "version": "==1.0.0"},
        "tool": {"git": "https://github.com/acme/tool.git", "ref": "main"},
        "tool2": {"git": "https://github.com/acme/tool2.git", "ref": COMMIT},
        "localpkg": {"editable": True, "path": "."},
    },
    "develop": {
        "pytest": {"hashes": [H2], "markers": "python_version >= '3.8'", "version": "==8.0.0"},
    },
}


def test_pipfile_lock(tmp_path):
    path = write(tmp_path, "Pipfile.lock", json.dumps(PIPFILE_LOCK, indent=4))
    report = check_requirements(path, internal_names=["acme-core"])
    assert (report.kind, report.packages) == ("Pipfile.lock", 6)
    assert hits(report) == {("insecure-index", None), ("mixed-index", None),
                            ("missing-hash", "acme-core"), ("direct-url", "tool")}
    assert "verify_ssl" in only(report, "insecure-index").message
    assert only(report, "missing-hash").severity == "high"     # from the private index, indexes mixed


PYLOCK = f"""\
lock-version = "1.0"
created-by = "hand"

[[packages]]
name = "numpy"
version = "1.26.4"
index = "https://pypi.org/simple"

[[packages.wheels]]
name = "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl"
url = "https://files.pythonhosted.org/packages/numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl"
hashes = {{sha256 = "{"1" * 64}"}}

[[packages]]
name = "urlib3"
version = "1.0"

[[packages.wheels]]
url = "https://files.pythonhosted.org/packages/urlib3-1.0-py3-none-any.whl"

[[packages]]
name = "tool"

[packages.vcs]
type = "git"
url = "https://github.com/acme/tool.git"
commit-id = "{COMMIT}"

[[packages]]
name = "blob"
version = "0.1"

[packages.archive]
url = "https://example.com/blob-0.1.tar.gz"
"""


def test_pylock(tmp_path):
    report = check_requirements(write(tmp_path, "pylock.toml", PYLOCK))
    assert (report.kind, report.packages) == ("pylock", 4)
    assert hits(report) == {("known-squat", "urlib3"), ("missing-hash", "urlib3"), ("direct-url", "blob")}
    assert only(report, "known-squat").line == 15


@pytest.mark.parametrize("name, text, kind", [
    ("deps.lock", UV_LOCK, "uv.lock"),
    ("locked.toml", POETRY_LOCK, "poetry.lock"),
    ("pylock.cluster.toml", PYLOCK, "pylock"),
    ("env.json", json.dumps(PIPFILE_LOCK), "Pipfile.lock"),
    ("deps.in", "numpy==1.26.4\n", "requirements"),
])
def test_kind_by_name_or_content(tmp_path, name, text, kind):
    assert check_requirements(write(tmp_path, name, text)).kind == kind


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("files, target, where, problem", [
    ({}, "absent.txt", "absent.txt", "cannot read file: No such file"),
    ({"dir/x": ""}, "dir", "dir", "cannot read file: a directory, not a regular file"),
    ({"r.txt": "numpy==1.26.4\nnumpy==\n"}, "r.txt", "r.txt:2", "invalid requirement 'numpy=='"),
    ({"r.txt": "--frobnicate\n"}, "r.txt", "r.txt:1", "unknown pip option '--frobnicate'"),
    ({"r.txt": "numpy==1.0 --index-url https://x\n"}, "r.txt", "r.txt:1: key '--index-url'", "cannot follow"),
    ({"r.txt": "\n--index-url\n"}, "r.txt", "r.txt:2: key '--index-url'", "needs a value"),
    ({"r.txt": "numpy==1.0 --hash=md5:abc\n"}, "r.txt", "r.txt:1: key '--hash'", "is not sha256"),
    ({"r.txt": "--hash=" + H1 + "\n"}, "r.txt", "r.txt:1: key '--hash'", "must follow a requirement"),
    ({"r.txt": "numpy\n-r missing.txt\n"}, "r.txt", "r.txt:2: key '--requirement'",
     "cannot read included file missing.txt: No such file"),
    ({"r.txt": "-r https://example.com/r.txt\n"}, "r.txt", "r.txt:1: key '--requirement'", "offline"),
    ({"a.txt": "-r b.txt\n", "b.txt": "\nnumpy==1.0\n-r a.txt\n"}, "a.txt", "b.txt:3: key '--requirement'",
     "include cycle: a.txt -> b.txt -> a.txt"),
    ({"r.txt": b"numpy==1.0 # caf\xe9\n"}, "r.txt", "r.txt", "not UTF-8"),
    ({"r.txt": "numpy==1.0\n--extra-index-url http://[oops/simple\n"}, "r.txt", "r.txt:2", "malformed URL"),
    ({"uv.lock": 'version = 1\n\n[[package]\nname = "x"\n'}, "uv.lock", "uv.lock:3", "not valid TOML"),
    ({"Pipfile.lock": '{\n  "default": {\n    "x": \n}'}, "Pipfile.lock", "Pipfile.lock:4", "not valid JSON"),
    ({"uv.lock": '[[package]]\nversion = "1"\n'}, "uv.lock", "uv.lock: key 'package[0].name'", "non-empty string"),
    ({"poetry.lock": "package = 3\n"}, "poetry.lock", "poetry.lock: key 'package'", "array of tables"),
    ({"Pipfile.lock": json.dumps({"default": {"x": {"version": "==1", "index": "acme"}}})}, "Pipfile.lock",
     "Pipfile.lock: key 'default.x.index'", "not in _meta.sources"),
])
def test_bad_input_is_one_line_usage_error(tmp_path, monkeypatch, files, target, where, problem):
    monkeypatch.chdir(tmp_path)                    # relative names, as a user types them
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UsageError) as exc:
        check_requirements(target)
    message = str(exc.value)
    assert message.startswith(where + ": ") and problem in message, message
    assert "\n" not in message and exc.value.exit_code == 2


# --------------------------------------------------------------------------- the bundled list

def test_bundled_squat_list_is_valid():
    squats = load_squat_list()
    assert squats.squats["torchtriton"].kind == "confusion"
    assert "PyTorch" in squats.squats["torchtriton"].why
    assert {"torch", "numpy", "triton", "requests", "urllib3", "transformers"} <= squats.protected
    assert not squats.allowed & squats.protected
    assert set(RULES) == {"mixed-index", "insecure-index", "unpinned", "missing-hash", "known-squat",
                          "confusable-name", "unknown-internal", "direct-url"}


@pytest.mark.parametrize("text, key", [
    ("squats: []\n", "protected"),
    ("squats: []\nprotected: [torch]\nextra: 1\n", None),
    ("squats:\n  - {name: x, kind: evil, why: y}\nprotected: []\n", "squats[0].kind"),
    ("squats:\n  - {name: x, kind: malicious}\nprotected: []\n", "squats[0]"),
    ("squats:\n  - {name: x, kind: malicious, why: ''}\nprotected: []\n", "squats[0].why"),
    ("squats:\n  - {name: torch, kind: malicious, why: y}\nprotected: [torch]\n", "squats[0].name"),
    ("squats: [\n", None),
])
def test_squat_list_schema_is_enforced(text, key):
    with pytest.raises(UsageError) as exc:
        load_squat_list(text, source="site.yaml")
    assert str(exc.value).startswith("site.yaml")
    assert exc.value.key == key


def test_table_names_the_included_file_a_finding_is_in(tmp_path):
    """Issue 19: a finding in an -r include was shown as "line 1" of the top file."""
    import subprocess
    import sys
    (tmp_path / "requirements.txt").write_text("numpy==1.26.4\n-r more.txt\n")
    (tmp_path / "more.txt").write_text("reqeusts==2.0\n")
    p = subprocess.run([sys.executable, "-m", "hpcml", "scan", "requirements", "requirements.txt"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 5, p.stderr
    row = next(line for line in p.stdout.splitlines() if "reqeusts" in line)
    assert "more.txt:1" in row


def test_a_requirements_file_s_words_are_printed_as_text(tmp_path):
    """The file is untrusted by design: Rich markup in an index URL the finding quotes ended
    the command with a traceback (a ``[/x]``) instead of the verdict."""
    import os
    import subprocess
    import sys
    (tmp_path / "requirements.txt").write_text("--index-url http://pkgs.example.com/simple/[/x]\nnumpy==1.26.4\n")
    p = subprocess.run([sys.executable, "-m", "hpcml", "scan", "requirements", "requirements.txt"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "300", "FORCE_COLOR": "1"})
    assert p.returncode == 6 and "Traceback" not in p.stderr, p.stderr     # 6: a high finding (--index-url)
    assert "simple/[/x]" in p.stdout, p.stdout
