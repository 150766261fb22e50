"""hpcml's own collector as a catalogue service (docs/centre.md, "Running the centre"):
``hpcml service up collector`` runs ``hpcml centre serve`` from hpcml's own environment
(nothing built), with the writer token from the caller's environment, never from a file
hpcml writes; it keeps what it was sent across ``down`` and ``up``, and ``down`` leaves
nothing running."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.proctree import command_lines
from hpcml.service.blueprint import load, loads
from hpcml.service.catalogue import find
from tests.service.mlflow_server import hpcml, state
from tests.vet.reports import vet_report

TOKEN = "collector-test-token-0123456789abcdef"


def _serving(root: Path) -> list[int]:
    """The collectors serving a database under ``root``: what is left running, by looking."""
    return [pid for pid, argv in command_lines() if "serve" in argv and any(str(root) in a for a in argv)]


def _call(url: str, path: str, token: str | None = TOKEN, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_the_collector_runs_as_a_service_and_keeps_its_data_across_down_and_up(tmp_path):
    env = {**os.environ, "HPCML_SERVICE_STATE": str(tmp_path / "state"), "HPCML_VET_TOKEN": TOKEN}
    directory = tmp_path / "state" / "collector"
    try:
        out = hpcml(["service", "up", "collector"], env, timeout=120)
        assert out.returncode == 0, out.stderr
        first = state(directory)
        assert _serving(tmp_path) == [first["pid"]]
        assert first["backend"] == "process" and first["ready"]
        assert Path(first["cmdline"][0]).parent == Path(sys.executable).parent   # hpcml's own env
        assert TOKEN not in json.dumps(first)                       # the token is in no file hpcml wrote
        url = first["urls"]["http"]
        assert _call(url, "/readyz", token=None)[0] == 200
        assert _call(url, "/v1/nodes/failing?since=7d", token="wrong")[0] == 401
        code, got = _call(url, "/v1/reports", body=vet_report({"n7": [("gpu", "gpu", "fail")]}))
        assert code == 201 and got["stored"] == 1, got

        assert hpcml(["service", "down", "collector"], env).returncode == 0
        assert not _serving(tmp_path)
        out = hpcml(["service", "up", "collector"], env, timeout=120)
        assert out.returncode == 0, out.stderr
        url = state(directory)["urls"]["http"]
        # the report is kept (a write token's report is stored, and counted as no node's failing)
        code, hist = _call(url, "/v1/nodes/n7/history?limit=5")
        assert code == 200 and [r["results"][0]["outcome"] for r in hist["reports"]] == ["fail"], hist
    finally:
        hpcml(["service", "down", "collector"], env)
    assert not _serving(tmp_path)


def test_without_the_token_it_is_one_line_naming_the_secret(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HPCML_VET_TOKEN"}
    env["HPCML_SERVICE_STATE"] = str(tmp_path / "state")
    out = hpcml(["service", "up", "collector"], env, timeout=60)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "HPCML_VET_TOKEN" in out.stderr, out.stderr


def test_own_installs_nothing_and_needs_no_packages():
    bp = load(find("collector"))
    assert bp.python is not None and bp.python.own and not bp.python.packages
    base = "name: x\ndescription: x\ncommand: [x]\nports: [{name: http, port: 80}]\nhealth: {port: http}\n"
    with pytest.raises(UsageError, match="python.packages"):
        loads(base + "python: {own: true, packages: [mlflow]}\n", "x.yaml")
    with pytest.raises(UsageError, match="python.packages"):
        loads(base + "python: {}\n", "x.yaml")
