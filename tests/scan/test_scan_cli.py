"""``hpcml scan`` as a user runs it: exit codes, JSON, SARIF, site policy, bad input."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs
from tests.scan import payloads


def _hpcml(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def _case(name: str, tmp_path: Path) -> Path:
    case = payloads.ALL_CASES[name]
    out = tmp_path / name
    out.mkdir()
    return case.build(out, tmp_path / "marker")


class Net:  # a user's class: pickled as tests.scan.test_scan_cli.Net, not on the allowlist
    def __init__(self) -> None:
        self.width = 3


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "sub").mkdir(parents=True)
    (root / "ok.pkl").write_bytes(pickle.dumps({"a": [1, 2]}, protocol=4))
    (root / "sub" / "evil.pkl").write_bytes(_case("os_system_proto4_stack_global", tmp_path).read_bytes())
    (root / "sub" / "user.pkl").write_bytes(pickle.dumps(Net(), protocol=4))
    (root / "README.md").write_text("# not a model\n")
    return root


def test_directory_scan_json_and_exit_code(tree):
    out = _hpcml("scan", "--json", str(tree))
    assert out.returncode == 6, out.stderr
    data = json.loads(out.stdout)
    by_name = {Path(f["path"]).name: f for f in data["files"]}
    assert by_name["evil.pkl"]["verdict"] == "dangerous"
    assert by_name["evil.pkl"]["findings"][0]["name"] == "os.system"
    assert by_name["evil.pkl"]["findings"][0]["offset"] is not None
    assert by_name["user.pkl"]["verdict"] == "unknown"
    assert by_name["ok.pkl"]["verdict"] == "safe"
    assert by_name["README.md"]["scanned"] is False
    assert data["exit_code"] == 6 and data["summary"]["dangerous"] == 1


def test_unknown_blocks_with_exit_5_and_site_policy_allows_it(tree, tmp_path):
    user = tree / "sub" / "user.pkl"
    assert _hpcml("scan", str(user)).returncode == 5
    policy = tmp_path / "site.yaml"
    policy.write_text("safe:\n  - tests.scan.test_scan_cli.*\n")
    out = _hpcml("scan", "--policy", str(policy), "--json", str(user))
    assert out.returncode == 0, out.stdout
    assert json.loads(out.stdout)["policy"] == ["built-in", str(policy)]


def test_site_policy_cannot_make_a_dangerous_global_safe(tree, tmp_path):
    policy = tmp_path / "site.yaml"
    policy.write_text("safe:\n  - os.system\n")
    assert _hpcml("scan", "--policy", str(policy), str(tree / "sub" / "evil.pkl")).returncode == 6


@pytest.mark.parametrize("text, key", [
    ("safe: [os]\n", "safe"),
    ("unsafe: []\n", "unsafe"),
    ("safe: [\n", None),
    ("block_unknown: maybe\n", "block_unknown"),
])
def test_bad_policy_file_is_one_line_exit_2(tmp_path, tree, text, key):
    policy = tmp_path / "bad.yaml"
    policy.write_text(text)
    out = _hpcml("scan", "--policy", str(policy), str(tree))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(policy) in lines[0] and "Traceback" not in out.stderr
    if key:
        assert f"key '{key}" in lines[0]            # 'safe' or the item, 'safe[0]'


def test_sarif_log_points_at_file_and_member(tmp_path):
    path = _case("torch_zip_weird_extension", tmp_path) if _has("torch") else _case("second_pickle_after_stop", tmp_path)
    sarif = tmp_path / "scan.sarif"
    out = _hpcml("scan", "--sarif", str(sarif), str(path))
    assert out.returncode == 6
    log = json.loads(sarif.read_text())
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rule_ids = {r["id"] for r in run["tool"]["driver"]["rules"]}
    result = run["results"][0]
    assert result["ruleId"] == "HPCML-SCAN-DANGEROUS" and result["ruleId"] in rule_ids
    assert "os.system" in result["message"]["text"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == path.as_posix()


def test_unreadable_and_truncated_files_are_errors_not_safe(tmp_path):
    good = tmp_path / "t.pkl"
    good.write_bytes(pickle.dumps(list(range(100)), protocol=4)[:-5])
    out = _hpcml("scan", "--json", str(good))
    assert out.returncode == 7
    files = {Path(f["path"]).name: f for f in json.loads(out.stdout)["files"]}
    assert files["t.pkl"]["verdict"] == "error" and files["t.pkl"]["errors"]
    missing = tmp_path / "missing.pt"                 # a path that is not there: bad input, as everywhere
    out = _hpcml("scan", "--json", str(good), str(missing))
    assert out.returncode == 2 and "missing.pt: no such file or directory" in out.stderr


def test_permission_denied_is_listed(tmp_path):
    """A file the scan may not read is listed as an error. Root reads files whatever their
    mode (CAP_DAC_OVERRIDE): as root the scan runs with those capabilities dropped from its
    bounding set (util-linux setpriv), so the file's mode 0 is obeyed as for any user."""
    p = tmp_path / "locked.pkl"
    p.write_bytes(b"\x80\x04N.")
    p.chmod(0)
    argv = [sys.executable, "-m", "hpcml", "scan", "--json", str(p)]
    if os.geteuid() == 0:
        argv = [needs.tool("setpriv", what="util-linux"), "--bounding-set", "-dac_override,-dac_read_search", "--",
                *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 7 and "Permission denied" in out.stdout, out.stderr


def test_human_table_names_the_global(tree):
    out = _hpcml("scan", str(tree))
    assert out.returncode == 6
    assert "os.system" in out.stdout and "dangerous" in out.stdout


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def test_policy_key_typo_names_the_line_and_the_nearest_key(tmp_path, tree):
    """Issue 19: a typo gave pydantic's "Extra inputs are not permitted", with no line."""
    policy = tmp_path / "site.yaml"
    policy.write_text("safe:\n  - mylab.models.*\nblok_unknown: true\n")
    out = _hpcml("scan", "--policy", str(policy), str(tree))
    assert out.returncode == 2
    assert f"{policy}:3: key 'blok_unknown': unknown key; did you mean 'block_unknown'?" in out.stderr
    assert "Extra inputs" not in out.stderr


def test_unknown_files_come_with_the_policy_that_would_allow_them(tree, tmp_path):
    """Issue 19: `unknown`, with no advice on what to allow; the printed lines work as a policy."""
    user = tree / "sub" / "user.pkl"
    out = _hpcml("scan", str(user))
    assert out.returncode == 5
    text = out.stdout
    assert "not on the allowlist" in text and "state_dict()" in text and "--policy" in text
    policy_text = text[text.index("safe:\n"):].split("\nA model saved whole", 1)[0]
    policy = tmp_path / "suggested.yaml"
    policy.write_text(policy_text + "\n")
    assert _hpcml("scan", "--policy", str(policy), str(user)).returncode == 0


def test_a_scan_starts_without_typer_or_pydantic(tmp_path):
    """Issue 20: the start-up floor (0.68 s) was mostly Typer and the pydantic it imports;
    `hpcml scan FILE` now takes a path without them. --help still shows Typer's help."""
    f = tmp_path / "tiny.pkl"
    f.write_bytes(pickle.dumps({"a": 1}))
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpcml", "scan", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    imported = {line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "typer" not in imported and "pydantic" not in imported and "numpy" not in imported
    assert "hpcml.scan.fastscan" in imported
    h = _hpcml("scan", "--help")
    assert h.returncode == 0 and "requirements" in h.stdout
    bad = _hpcml("scan", "--jobs", "0", str(f))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
