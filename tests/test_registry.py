"""hpcml.registry: built-ins imported on first use, site packages added through entry points.

The site package is a fake installed distribution: a ``fake_site-0.1.dist-info`` directory
(METADATA, entry_points.txt) and its modules on sys.path, exactly what pip leaves in
site-packages. It adds a check, a runtime and a scan format, which are then used through
hpcml's own code paths (a protocol run by ``hpcml vet run``, ``hpcml.env.run``, the scanner).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.registry import PluginError, Registry, UnknownName
from hpcml.testing import siteplugin

ENTRY_POINTS = {
    "hpcml.checks": {"ib_port": "fake_site_checks:IbPortCheck",
                     "memory": "fake_site_checks:IbPortCheck",
                     "broken": "fake_site_missing:Nope"},
    "hpcml.runtimes": {"hostrun": "fake_site_runtime:HostRun"},
    "hpcml.scan_formats": {"magic": "fake_site_scan:FORMAT"},
    "hpcml.samplers": {"fakegpu": "fake_site_sampler:open_sampler"},
}

MODULES = {
    "fake_site_checks": '''
        from pydantic import BaseModel, ConfigDict

        from hpcml.vet.checks.base import Check, CheckReport, judge


        class IbPortParams(BaseModel):
            model_config = ConfigDict(extra="forbid")
            port: int = 1


        class IbPortCheck(Check[IbPortParams]):
            """An InfiniBand port is ACTIVE (here: always)."""

            def run(self) -> CheckReport:
                return judge(True, "ACTIVE", threshold=f"port {self.params.port} ACTIVE", message="port up")
    ''',
    "fake_site_runtime": '''
        from hpcml.env.runtimes.base import Launch, Runtime


        class HostRun(Runtime):
            """Runs the command on the host, with the environment's variables."""

            name = "hostrun"

            def available(self):
                return True

            def render(self, env, command, *, environ=None, scratch=None):
                return Launch("hostrun", list(command), environ=dict(env.env))
    ''',
    "fake_site_sampler": '''
        from hpcml.samplers import SamplerUnavailable


        def open_sampler(gpus, interval, env):
            raise SamplerUnavailable("the fake GPU is not in this machine")
    ''',
    "fake_site_scan": '''
        from hpcml.scan.formats import ScanFormat


        def _scan(fs, fh, size, member, name, depth, scan_content):
            fs.set_format("magic")
            fs.error(f"magic file of {size} bytes refused", member)


        FORMAT = ScanFormat(lambda head, size, name: head.startswith(b"MAGIC1"), _scan)
    ''',
}


def _registries() -> list[Registry]:
    from hpcml.centre.collector.store import STORES
    from hpcml.env.runtimes import RUNTIMES
    from hpcml.samplers.choose import SAMPLERS
    from hpcml.scan.formats import FORMATS as SCAN_FORMATS
    from hpcml.score.importers import FORMATS as IMPORTERS
    from hpcml.vet.registry import CHECKS
    return [CHECKS, RUNTIMES, SCAN_FORMATS, IMPORTERS, SAMPLERS, STORES]


def make_site(root: Path) -> Path:
    return siteplugin.write_distribution(root / "site", "fake-site", "0.1", ENTRY_POINTS,
                                         {f"{name}.py": textwrap.dedent(code).lstrip() for name, code in MODULES.items()})


@pytest.fixture
def site(tmp_path):
    """The fake site package, installed on sys.path for one test."""
    path = make_site(tmp_path)
    sys.path.insert(0, str(path))
    importlib.invalidate_caches()
    for reg in _registries():
        reg.rediscover()
    yield path
    sys.path.remove(str(path))
    for name in MODULES:
        sys.modules.pop(name, None)
    for reg in _registries():
        reg.rediscover()


# -- Registry itself --------------------------------------------------------------------

def test_a_builtin_is_imported_on_first_get_only(tmp_path, monkeypatch):
    (tmp_path / "lazy_widget_mod.py").write_text("class Widget:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[type] = Registry("widget", "hpcml.test_widgets", {"w": "lazy_widget_mod:Widget"})
    assert "w" in reg and reg.target("w") == "lazy_widget_mod:Widget" and reg.names() == ["w"]
    assert "lazy_widget_mod" not in sys.modules
    try:
        assert reg.get("w").__name__ == "Widget" and "lazy_widget_mod" in sys.modules
        assert reg.get("w") is reg.get("w")
    finally:
        sys.modules.pop("lazy_widget_mod", None)


def test_hpcml_builtins_are_not_imported_until_used():
    """A vet worker imports only the checks it runs; a runtime module only when chosen."""
    code = textwrap.dedent("""
        import sys
        from hpcml.vet.registry import CHECKS, resolve
        import hpcml.env.runtimes as rt
        assert resolve("compute") == "hpcml.vet.checks.compute:ComputeCheck"
        assert "compute" in CHECKS and "podman" in rt.RUNTIMES
        loaded = [m for m in sys.modules if m.startswith(("hpcml.vet.checks.", "hpcml.env.runtimes."))]
        assert loaded == ["hpcml.env.runtimes.base"], loaded
        assert CHECKS.get("compute").__name__ == "ComputeCheck"
        assert "hpcml.vet.checks.compute" in sys.modules and "hpcml.vet.checks.memory" not in sys.modules
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_unknown_name_lists_the_known_ones():
    reg: Registry[object] = Registry("widget", "hpcml.test_widgets", {"a": "m:A", "b": "m:B"},
                                     hint="or a dotted path")
    with pytest.raises(UnknownName) as info:
        reg.get("c")
    assert str(info.value) == "unknown widget 'c' (known: a, b; or a dotted path)"
    assert isinstance(info.value, UsageError) and isinstance(info.value, LookupError)
    assert info.value.exit_code == 2
    assert "c" not in reg and 3 not in reg


def test_objects_can_be_registered_directly():
    reg: Registry[object] = Registry("widget", "hpcml.test_widgets")
    reg.add("here", Registry)
    assert reg.get("here") is Registry and reg.target("here") == "hpcml.registry:Registry"
    assert dict(reg.items()) == {"here": Registry}


def test_entry_points_come_after_builtins_and_cannot_replace_them(site):
    from hpcml.vet.registry import CHECKS, resolve
    names = CHECKS.names()
    assert names[:2] == ["memory", "load"] and names[-2:] == ["ib_port", "broken"]
    assert resolve("memory") == "hpcml.vet.checks.memory:MemoryCheck"
    assert resolve("ib_port") == "fake_site_checks:IbPortCheck"
    assert "fake_site_checks" not in sys.modules          # still nothing imported


def test_broken_entry_point_names_its_distribution(site):
    from hpcml.vet.protocol import loads
    from hpcml.vet.registry import CHECKS
    with pytest.raises(PluginError) as info:
        CHECKS.get("broken")
    msg = str(info.value)
    assert "check type 'broken' from fake-site 0.1 cannot be loaded" in msg
    assert "entry point 'broken = fake_site_missing:Nope' in group hpcml.checks" in msg
    assert "ModuleNotFoundError" in msg
    with pytest.raises(UsageError) as info2:             # in a protocol: its file, key and line
        loads("name: x\nevals:\n  - name: b\n    type: broken\n", "p.yaml")
    assert str(info2.value).startswith("p.yaml:4: key 'evals[0].type': check type 'broken' from fake-site")


# -- a site package's parts, used by hpcml ----------------------------------------------

def test_site_check_runs_in_a_protocol(site):
    from hpcml.vet.model import Outcome
    from hpcml.vet.protocol import loads
    from hpcml.vet.worker import run_check
    proto = loads("name: site\nevals:\n  - {name: ib, type: ib_port, port: 2}\n", "p.yaml")
    ev = proto.evals[0].to_dict()
    assert ev["check"] == "fake_site_checks:IbPortCheck" and ev["params"] == {"port": 2}
    ctx = {"node": "n1", "nodes": ("n1",), "rank": 0, "workdir": None, "gpus": (), "require_gpus": False}
    r = run_check(ev, ctx, time.time() + 30)
    assert r.outcome is Outcome.PASS and r.threshold == "port 2 ACTIVE" and r.message == "port up"


def test_site_check_through_hpcml_vet_run(tmp_path):
    """A fresh process finds the entry point; its worker imports the class by module path."""
    site = make_site(tmp_path)
    (tmp_path / "p.yaml").write_text("name: site\nevals:\n  - name: ib\n    type: ib_port\n    port: 3\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    p = subprocess.run([sys.executable, "-m", "hpcml", "vet", "run", "p.yaml", "--local", "--json",
                        "--out", str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(p.stdout)
    results = [r for node in report["nodes"].values() for r in node["results"]]
    assert [(r["type"], r["outcome"], r["threshold"]) for r in results] == [("ib_port", "pass", "port 3 ACTIVE")]


def test_site_runtime_runs_a_command_and_takes_site_options(site, tmp_path):
    from hpcml.env import run as env_run
    from hpcml.env.model import Environment
    from hpcml.env.runtimes import PREFERENCE, RUNTIMES, get
    from hpcml.env.site import parse_site
    assert "hostrun" in RUNTIMES and get("hostrun").name == "hostrun"
    assert all("hostrun" not in order for order in PREFERENCE.values())     # auto never picks it
    env = Environment(image=str(tmp_path / "rootfs"), env={"HOSTRUN_CODE": "7"})
    code = env_run.run(env, [sys.executable, "-c", "import os, sys; sys.exit(int(os.environ['HOSTRUN_CODE']))"],
                       runtime="hostrun")
    assert code == 7
    text = "hooks:\n  com.hooks.cxi:\n    options: {hostrun: [--fast]}\n"
    assert parse_site(text, "site.yaml").hooks["com.hooks.cxi"].options == {"hostrun": ["--fast"]}
    with pytest.raises(UsageError, match="expected a runtime .*hostrun.*found 'nosuch'"):
        parse_site(text.replace("hostrun", "nosuch"), "site.yaml")


def test_site_scan_format_is_tried_before_the_pickle_fallback(site, tmp_path):
    from hpcml.scan.model import Verdict
    from hpcml.scan.scanner import scan_file
    f = tmp_path / "x.bin"
    f.write_bytes(b"MAGIC1" + bytes(100))
    r = scan_file(f)
    assert r.format == "magic" and r.verdict is Verdict.ERROR and r.errors == ["magic file of 106 bytes refused"]


@pytest.mark.parametrize("component", ["observe", "score"])
def test_a_site_gpu_sampler_is_taken_by_observe_and_score_record(tmp_path, component):
    """``--gpu-metrics NAME`` of an ``hpcml.samplers`` plug-in: both recorders take the name
    and try the sampler (``score record`` refused every name but its four built-ins)."""
    site = make_site(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CUDA_VISIBLE_DEVICES"] = "0"           # a GPU bound to the task: the sampler is tried on it
    p = subprocess.run([sys.executable, "-m", "hpcml", component, "record", "--dir", str(tmp_path / "rec"),
                        "--gpu-metrics", "fakegpu", "--", "true"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    # chosen by name and unavailable: exit 2, in the plug-in's own words (it was tried)
    assert p.returncode == 2 and "the fake GPU is not in this machine" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
