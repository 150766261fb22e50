"""CONTRIBUTING.md tells the truth: each of its recipes, followed, works.

The document is read here, not restated. From "Pluggable parts": the table (kind, registry,
entry-point group, object) and every ``[project.entry-points."GROUP"]`` recipe of its TOML
blocks. Each group the document names must have both, and must be the group of one
``hpcml.registry.Registry`` in src/ (found by reading the source: every module-level
``X = Registry(...)``), and every such registry must be in the table.

Then each recipe is followed as a site would: a package laid out as pip installs it (its
modules and a ``*.dist-info`` whose ``entry_points.txt`` holds exactly the recipe's lines,
written by ``hpcml.testing.siteplugin.write_distribution``), with the smallest real
implementation of the kind the table describes, put on sys.path. hpcml must resolve the
recipe's NAME through its registry to the plug-in's object, use it in the library, and,
in a fresh process, in the public command the recipe names (``hpcml scan``, ``hpcml score
report --format NAME``, ``hpcml env render --runtime NAME``, ...).

Last, the "Layout" and "Where to add" sections name only packages, modules and names that
exist.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from hpcml.files import load_toml
from hpcml.registry import Registry, _Plugin
from hpcml.testing import siteplugin

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hpcml"
DOC = ROOT / "CONTRIBUTING.md"


# -- reading the document ----------------------------------------------------------------

def section(title: str) -> str:
    """The text of the level-2 section ``## title``, to the next level-2 heading."""
    text = DOC.read_text()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"CONTRIBUTING.md has no section '## {title}'"
    return m.group(1)


def cells(line: str) -> list[str]:
    """A Markdown table row's cells (``\\|`` inside a cell is not a separator)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


@dataclass(frozen=True)
class Row:
    kind: str
    registry: str          # the "Registry (built-ins declared here)" cell
    group: str
    obj: str


@cache
def table() -> dict[str, Row]:
    """The "Pluggable parts" table, by entry-point group."""
    rows: dict[str, Row] = {}
    header: list[str] | None = None
    for line in section("Pluggable parts").splitlines():
        if not line.startswith("|"):
            if header is not None:
                break                  # the end of the first table
            continue
        row = cells(line)
        if header is None:
            header = row
            continue
        if set("".join(row)) <= set("-: "):
            continue
        assert len(row) == len(header) == 4, f"a row of 4 cells expected: {line}"
        group = re.fullmatch(r"`([\w.]+)`", row[2])
        assert group, f"the entry-point group cell is one `group`: {line}"
        assert group.group(1) not in rows, f"group {group.group(1)} is in the table twice"
        rows[group.group(1)] = Row(row[0], row[1], group.group(1), row[3])
    assert header and "Entry-point group" in header, "no table with an 'Entry-point group' column"
    return rows


@cache
def recipes() -> dict[str, dict[str, str]]:
    """Every TOML block's ``[project.entry-points."GROUP"]`` lines: group -> name -> target."""
    out: dict[str, dict[str, str]] = {}
    blocks = re.findall(r"^```toml\n(.*?)^```", section("Pluggable parts"), re.M | re.S)
    assert blocks, "no ```toml recipe in 'Pluggable parts'"
    for block in blocks:
        data = load_toml(block, "CONTRIBUTING.md")
        assert set(data) == {"project"} and set(data["project"]) == {"entry-points"}, block
        for group, entries in data["project"]["entry-points"].items():
            assert group not in out, f"two recipes for {group}"
            assert entries, f"the recipe for {group} declares nothing"
            out[group] = dict(entries)
    return out


@cache
def src_registries() -> dict[str, tuple[str, str]]:
    """Every ``hpcml.registry.Registry`` at module level in src/: its group -> (module, attribute)."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Registry"):
                continue
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            assert isinstance(target, ast.Name), f"{path}:{node.lineno}"
            parts = path.relative_to(SRC.parent).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            reg = getattr(importlib.import_module(module), target.id)
            assert isinstance(reg, Registry), f"{module}.{target.id}"
            assert reg.group not in found, f"{reg.group} is the group of two registries"
            found[reg.group] = (module, target.id)
    return found


def documented_groups() -> list[str]:
    """The groups of the table and the recipes, for parametrizing (empty if the document
    cannot be read: the tests of the table and recipes say why)."""
    try:
        return sorted(set(table()) | set(recipes()))
    except AssertionError:
        return []


def registry(group: str) -> Registry:
    module, attr = src_registries()[group]
    return getattr(importlib.import_module(module), attr)


def builtin_names(reg: Registry) -> set[str]:
    """The names a registry declares itself (not discovered from entry points)."""
    return {name for name, entry in reg._entries.items() if not isinstance(entry, _Plugin)}


# -- the document against the source -------------------------------------------------------

def test_each_group_of_the_table_has_a_recipe_and_each_recipe_a_row():
    groups, declared = set(table()), set(recipes())
    assert groups - declared == set(), f"in the table, with no [project.entry-points] recipe: {sorted(groups - declared)}"
    assert declared - groups == set(), f"a recipe for a group the table does not list: {sorted(declared - groups)}"


def test_each_group_named_is_a_registrys_and_each_registry_is_named():
    real = src_registries()
    named = set(table()) | set(recipes()) | set(re.findall(r"\bhpcml\.[a-z_]+s\b(?=`|\")", section("Pluggable parts")))
    assert named - set(real) == set(), f"groups no Registry in src/ has: {sorted(named - set(real))}"
    assert set(real) - set(table()) == set(), f"Registries CONTRIBUTING.md does not list: {sorted(set(real) - set(table()))}"


@pytest.mark.parametrize("group", documented_groups())
def test_the_tables_registry_cell_names_where_that_registry_is(group):
    """``vet/registry.py`` ``BUILTIN``: that module holds the group's Registry, and the name is
    the Registry or the built-ins it declares."""
    assert group in table(), f"{group}: a recipe with no row in the table"
    assert group in src_registries(), f"{group}: no Registry in src/ has this group"
    m = re.fullmatch(r"`([\w/]+\.py)` `(\w+)`.*", table()[group].registry)
    assert m, f"the registry cell is `path.py` `NAME`: {table()[group].registry}"
    path, attr = m.groups()
    module = "hpcml." + path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert src_registries()[group][0] == module, f"{group}'s Registry is in {src_registries()[group][0]}, not {path}"
    obj, reg = getattr(importlib.import_module(module), attr), registry(group)
    assert obj is reg or (isinstance(obj, dict) and set(obj) <= set(reg._entries)), f"{path} {attr}"


def test_recipe_names_are_not_built_in_names():
    """A plug-in cannot replace a built-in: a recipe whose name is taken does nothing."""
    for group, entries in recipes().items():
        taken = set(entries) & builtin_names(registry(group))
        assert not taken, f"{group}: {sorted(taken)} is a built-in name: the recipe's plug-in would never be used"


# -- each recipe followed --------------------------------------------------------------------

CHECK = '''
from pydantic import BaseModel, ConfigDict

from hpcml.vet.checks.base import Check, CheckReport, judge


class IbPortParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = 1


class PLUGIN(Check[IbPortParams]):
    default_timeout = 5.0

    def run(self) -> CheckReport:
        state = "ACTIVE"                 # a site would read /sys/class/infiniband/*/ports/N/state
        return judge(state == "ACTIVE", state, threshold=f"port {self.params.port} ACTIVE")
'''
RUNTIME = '''
from hpcml.env.runtimes.base import Runtime, wrap_command


class PLUGIN(Runtime):
    name = NAME
    executable = "apptainer"
    refuses = {"squashfs": "apptainer runs a SIF file, a directory or a registry image, not {image}"}

    def argv(self, plan, command):
        binds = [f"--bind={m.source}:{m.target}" for m in plan.mounts]
        env = [f"--env={k}={v}" for k, v in plan.variables.items() if v is not None]
        return ["apptainer", "exec", *binds, *env, plan.env.image, *wrap_command(plan.env, command, exports=plan.exports)]
'''
SCAN_FORMAT = '''
from hpcml.scan.formats import ScanFormat


def _scan(fs, fh, size, member, name, depth, scan_content):
    fs.set_format(NAME)
    fs.not_scanned("TFLite flatbuffer", "this site reads no TFLite graph", member)


PLUGIN = ScanFormat(lambda head, size, name: head[4:8] == b"TFL3", _scan)
'''
IMPORTER = '''
from hpcml.score.recording import Recording


def PLUGIN(path, interval=1.0):
    """Lines of ``GPU UTIL%``, one per sample."""
    rec = Recording(source=str(path), temporal_only=True)
    for i, line in enumerate(path.read_text().split("\\n")):
        if line.strip():
            gpu, util = line.split()
            rec.gpu("node1", gpu, "Fake GPU").add(i * interval, "gpu_util", float(util))
    return rec
'''
SAMPLER = '''
from hpcml.samplers import SamplerUnavailable


class Sampler:
    def __init__(self, gpus):
        self.gpus = gpus

    def sample(self, ts):
        return [(ts, "gpu", "power_w", 250.0, None, int(gpu)) for gpu in self.gpus]

    def close(self):
        pass


def PLUGIN(gpus, interval, env):
    if not gpus:
        raise SamplerUnavailable("no GPU is bound to this task")
    return Sampler(list(gpus)), {"kind": NAME, "saturation": False, "note": "power only"}
'''
STORE = '''
from hpcml.centre.collector.sqlite import SqliteStore


class PLUGIN(SqliteStore):
    """A stand-in kept in SQLite: NAME:///PATH is the database file PATH."""

    def __init__(self, url):
        super().__init__("sqlite:///" + url.split(":///", 1)[1])
        self.url = url
'''
SERVICE_BACKEND = '''
from hpcml.service.backends import Launch


class Host:
    """The blueprint's command as it is, from the node's PATH: services the site installed."""

    name = NAME

    def usable(self, bp):
        return True

    def prepare(self, bp, log):
        return None

    def launch(self, bp, ex, mounts):
        return Launch(list(ex.command), dict(ex.env))


PLUGIN = Host()
'''
BLUEPRINT = """\
name: hello-web
description: a directory over HTTP
image: docker.io/library/python:3.11-slim
command: [{python}, -m, http.server, --bind, "${{host}}", "${{port.http}}"]
ports:
  - {{name: http, port: 8000}}
health: {{port: http, http: /, timeout: 30 s}}
"""
BLUEPRINT_TEXT = BLUEPRINT.format(python=json.dumps(sys.executable))
CATALOGUE = '''
from pathlib import Path

PLUGIN = Path(__file__).with_name("blueprints")
'''
RUN_BACKEND = '''
from typing import ClassVar

from hpcml.run.backends import Local


class PLUGIN(Local):
    """A stand-in: the ranks start here, as local starts them."""

    mode: ClassVar[str] = NAME
    spans_nodes: ClassVar[bool] = False

    @classmethod
    def applies(cls, allocation, in_farm):
        return False

    def where(self, plan):
        return f"{plan.ntasks} ranks by {NAME}"
'''


@dataclass(frozen=True)
class Plugin:
    source: str                                  # the module; NAME is the entry's name, PLUGIN the object
    prove: Callable[..., None]
    files: dict[str, str] | None = None          # more files beside the module


def hpcml(*args: str, site: Path, cwd: Path, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A public command in a fresh process that has the site package installed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_"))}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "hpcml", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=timeout)


def prove_check(name, obj, target, site, tmp_path):
    from hpcml.vet.checks.base import Check
    from hpcml.vet.model import Outcome
    from hpcml.vet.protocol import loads
    from hpcml.vet.registry import CHECKS, resolve
    from hpcml.vet.worker import run_check
    assert issubclass(obj, Check) and CHECKS.get(name) is obj and resolve(name) == target
    assert resolve(target.replace(":", ".")) == target                 # a dotted path works too
    proto = loads(f"name: site\nevals:\n  - {{name: ib, type: {name}, port: 2}}\n", "p.yaml")
    ctx = {"node": "n1", "nodes": ("n1",), "rank": 0, "workdir": None, "gpus": (), "require_gpus": False}
    assert run_check(proto.evals[0].to_dict(), ctx, time.time() + 30).outcome is Outcome.PASS
    (tmp_path / "p.yaml").write_text(f"name: site\nevals:\n  - name: ib\n    type: {name}\n    port: 3\n")
    p = hpcml("vet", "run", "p.yaml", "--local", "--json", "--out", str(tmp_path / "out"), site=site, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    results = [r for node in json.loads(p.stdout)["nodes"].values() for r in node["results"]]
    assert [(r["type"], r["outcome"], r["threshold"]) for r in results] == [(name, "pass", "port 3 ACTIVE")]


def prove_runtime(name, obj, target, site, tmp_path):
    from hpcml.env.model import Environment
    from hpcml.env.runtimes import PREFERENCE, RUNTIMES, Runtime, get
    from hpcml.errors import UsageError
    assert issubclass(obj, Runtime) and RUNTIMES.get(name) is obj and get(name).name == name
    assert all(name not in order for order in PREFERENCE.values())          # auto never picks a plug-in
    with pytest.raises(UsageError, match="apptainer runs a SIF file"):
        get(name).render(Environment(image="/images/x.sqsh"), ["true"])
    (tmp_path / "edf.toml").write_text('image = "/images/pytorch.sif"\n\n[env]\nSITE = "1"\n')
    p = hpcml("env", "render", "--runtime", name, "./edf.toml", "--json", "--", "python", "train.py",
              site=site, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    launch = json.loads(p.stdout)
    assert launch["runtime"] == name and launch["argv"][:2] == ["apptainer", "exec"], launch
    assert "--env=SITE=1" in launch["argv"] and launch["argv"][-3:] == ["/images/pytorch.sif", "python", "train.py"]


def prove_scan_format(name, obj, target, site, tmp_path):
    from hpcml.scan.formats import FORMATS, ScanFormat
    from hpcml.scan.model import Verdict
    from hpcml.scan.scanner import scan_file
    assert isinstance(obj, ScanFormat) and FORMATS.get(name) is obj
    f = tmp_path / "model.tflite"
    f.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))
    r = scan_file(f)
    assert (r.format, r.verdict) == (name, Verdict.NOT_SCANNED), r
    p = hpcml("scan", str(f), "--json", site=site, cwd=tmp_path)
    report = json.loads(p.stdout)
    assert [(x["format"], x["verdict"]) for x in report["files"]] == [(name, "not-scanned")], p.stdout
    assert p.returncode == report["exit_code"] == 8, p.stderr


def prove_importer(name, obj, target, site, tmp_path):
    from hpcml.errors import UsageError
    from hpcml.score.importers import FORMATS, detect, load
    assert FORMATS.get(name) is obj
    f = tmp_path / "profile.txt"
    f.write_text("".join(f"{g} {u}\n" for u in (90, 95, 40, 97) for g in (0, 1)))
    rec = load(f, name, interval=2.0, nodes=3)
    assert rec.meta["format"] == name and sorted(rec.gpus) == [("node1", "0"), ("node1", "1")]
    assert "option(s) nodes do not apply" in rec.notes[-1]                   # what load() does not name is left out
    with pytest.raises(UsageError, match="cannot tell the recording format"):
        detect(f)                                                            # detection knows the built-ins only
    p = hpcml("score", "report", str(f), "--format", name, "--no-html", "--json", site=site, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["meta"]["format"] == name and report["gpus"] == 2 and report["temporal_only"], p.stdout[:2000]


def prove_sampler(name, obj, target, site, tmp_path):
    from hpcml.errors import UsageError
    from hpcml.samplers.choose import AUTO, SAMPLERS, choose_gpu_sampler, modes
    assert SAMPLERS.get(name) is obj and name in modes() and name not in AUTO
    sampler, label = choose_gpu_sampler(name, ["0"], 1.0, {})
    assert label["kind"] == name and sampler.sample(7) == [(7, "gpu", "power_w", 250.0, None, 0)]
    with pytest.raises(UsageError, match=f"{name.upper()} is required but cannot be used: no GPU is bound"):
        choose_gpu_sampler(name, [], 1.0, {})
    out = tmp_path / "rec"
    p = hpcml("observe", "record", "--dir", str(out), "--interval", "0.1", "--gpu-metrics", name, "--",
              # 30 intervals: a command that ends before the recorder's first interval (a loaded
              # machine's start-up can take that long) has no sample, rightly
              sys.executable, "-c", "import time; time.sleep(3)", site=site, cwd=tmp_path,
              env={"CUDA_VISIBLE_DEVICES": "0", "HPCML_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr
    meta = json.loads((out / "rank-00000.json").read_text())
    assert meta["gpu_sampler"]["kind"] == name, meta
    from hpcml.score.importers.store import load as load_store
    rec = load_store(out)
    assert [(g.index, len(g.values["power_usage"]) > 0) for g in rec.gpus.values()] == [("0", True)]  # its rows


def prove_store(name, obj, target, site, tmp_path):
    from hpcml.centre.collector.store import STORES, Store, open_store
    url = f"{name}:///{tmp_path}/centre.db"
    assert issubclass(obj, Store) and STORES.get(name) is obj
    store = open_store(url)
    try:
        assert type(store) is obj and store.count()["reports"] == 0
    finally:
        store.close()
    p = hpcml("centre", "report", "--db", url, "--json", site=site, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert isinstance(json.loads(p.stdout), dict)


def _blueprint(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    bp = where / "hello-web.yaml"
    bp.write_text(BLUEPRINT_TEXT)
    return bp


def prove_service_backend(name, obj, target, site, tmp_path):
    from hpcml.service.backends import BACKENDS, choose
    from hpcml.service.blueprint import load
    bp = load(_blueprint(tmp_path))
    assert BACKENDS.get(name) is obj and choose(bp, name) is obj
    assert choose(bp, "auto") is not obj                                  # auto tries the built-ins only
    state = tmp_path / "state"
    p = hpcml("service", "up", str(tmp_path / "hello-web.yaml"), "--backend", name, "--state-dir", str(state),
              "--json", site=site, cwd=tmp_path)
    try:
        assert p.returncode == 0, p.stderr
        [up] = json.loads(p.stdout)
        assert up["backend"] == name and up["ready"], up
    finally:
        down = hpcml("service", "down", "hello-web", "--state-dir", str(state), site=site, cwd=tmp_path)
    assert down.returncode == 0, down.stderr


def prove_catalogue(name, obj, target, site, tmp_path):
    from hpcml.service.catalogue import CATALOGUES, available, directories
    assert CATALOGUES.get(name) is obj and Path(str(obj)) in directories()
    assert available()["hello-web"] == Path(str(obj)) / "hello-web.yaml"
    p = hpcml("service", "list", "--json", site=site, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    listed = {b["name"]: b["file"] for b in json.loads(p.stdout)["blueprints"]}
    assert listed["hello-web"] == str(Path(str(obj)) / "hello-web.yaml")
    p = hpcml("service", "validate", "hello-web", site=site, cwd=tmp_path)
    assert (p.returncode, p.stdout.strip()) == (0, "ok: hello-web"), p.stderr


def prove_run_backend(name, obj, target, site, tmp_path):
    from hpcml.run.backends import BACKEND_ENV, BACKENDS, choose
    from hpcml.run.jobdir import read_run
    assert BACKENDS.get(name) is obj
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(BACKEND_ENV, name)
        assert choose(None, False) is obj
    out = tmp_path / "ran"
    p = hpcml("run", "--dir", str(tmp_path / "job"), "--no-report", "--ntasks", "2", "--", sys.executable, "-c",
              f"open({str(out)!r}, 'a').write('x')", site=site, cwd=tmp_path, env={BACKEND_ENV: name})
    assert p.returncode == 0, p.stderr
    assert out.read_text() == "xx" and f"2 ranks by {name}" in p.stderr, p.stderr
    assert read_run(tmp_path / "job").mode == name


#: per entry-point group, the smallest real implementation of the table's object, and its proof
PLUGINS = {
    "hpcml.checks": Plugin(CHECK, prove_check),
    "hpcml.runtimes": Plugin(RUNTIME, prove_runtime),
    "hpcml.scan_formats": Plugin(SCAN_FORMAT, prove_scan_format),
    "hpcml.score_importers": Plugin(IMPORTER, prove_importer),
    "hpcml.samplers": Plugin(SAMPLER, prove_sampler),
    "hpcml.stores": Plugin(STORE, prove_store),
    "hpcml.service_backends": Plugin(SERVICE_BACKEND, prove_service_backend),
    "hpcml.service_catalogues": Plugin(CATALOGUE, prove_catalogue, {"blueprints/hello-web.yaml": BLUEPRINT_TEXT}),
    "hpcml.run_backends": Plugin(RUN_BACKEND, prove_run_backend),
}


def site_files(group: str, name: str, target: str) -> dict[str, str]:
    """The modules a recipe's target names (``a.b:OBJ``: a/__init__.py, a/b.py defining OBJ)."""
    plugin = PLUGINS[group]
    module, _, attr = target.partition(":")
    assert attr, f"{group}: {name} = {target!r} names no object (module:attr)"
    parts = module.split(".")
    files = {"/".join(parts[:i]) + "/__init__.py": "" for i in range(1, len(parts))}
    path = "/".join(parts) + ".py"
    files[path] = (f"NAME = {name!r}\n" + textwrap.dedent(plugin.source)
                   + (f"\n\n{attr} = PLUGIN\n" if attr != "PLUGIN" else ""))
    here = path.rpartition("/")[0]
    for rel, text in (plugin.files or {}).items():
        files[f"{here}/{rel}" if here else rel] = text
    return files


@pytest.mark.parametrize("group", documented_groups())
def test_the_recipe_followed_installs_a_part_hpcml_uses(group, tmp_path):
    assert group in PLUGINS, f"{group}: no plug-in here to follow its recipe with: add one to PLUGINS"
    entries = recipes().get(group)
    assert entries, f"{group}: no recipe in CONTRIBUTING.md"
    name, target = next(iter(entries.items()))
    site = siteplugin.write_distribution(tmp_path / "site", "mysite", "1.0", {group: {name: target}},
                                         site_files(group, name, target))
    assert f"[{group}]\n{name} = {target}\n" in next(site.glob("*.dist-info")).joinpath("entry_points.txt").read_text()
    top = target.split(".")[0].split(":")[0]
    regs = [registry(g) for g in src_registries()]
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    for reg in regs:
        reg.rediscover()
    try:
        reg = registry(group)
        assert name in reg and reg.target(name) == target
        obj = reg.get(name)
        assert obj is importlib.import_module(target.partition(":")[0]).__dict__[target.partition(":")[2]]
        PLUGINS[group].prove(name, obj, target, site, tmp_path)
    finally:
        sys.path.remove(str(site))
        for mod in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[mod]
        importlib.invalidate_caches()
        for reg in regs:
            reg.rediscover()
    assert name not in registry(group)                     # the registries are as this test found them


def test_the_installed_form_of_the_check_recipe_is_what_pip_writes(tmp_path):
    """"(installed, that is `entry_points.txt` with `[GROUP]` and `NAME = TARGET`)"."""
    m = re.search(r"`entry_points\.txt` with `\[([\w.]+)\]` and `([^`]+)`", section("Pluggable parts"))
    assert m, "the sentence giving the installed form of the check's recipe"
    group, line = m.groups()
    name, target = next(iter(recipes()[group].items()))
    assert line == f"{name} = {target}"
    site = siteplugin.write_distribution(tmp_path, "mysite", "1.0", {group: {name: target}}, {})
    assert (tmp_path / "mysite-1.0.dist-info" / "entry_points.txt").read_text().splitlines()[:2] == [f"[{group}]", line]
    assert site == tmp_path


# -- the layout names what exists ------------------------------------------------------------

PATHISH = re.compile(r"[\w./-]+(?:/|\.py|\.md|\.ya?ml)")


def _where(token: str, package: str | None) -> Path | None:
    for cand in ([SRC / package / token] if package else []) + [SRC / token, SRC.parent / token, ROOT / token]:
        if cand.exists():
            return cand
    return None


def _layout_rows() -> list[tuple[str | None, str]]:
    """(the package a row is about, or None; the line) for "Layout" and "Where to add"."""
    out = []
    for line in (section("Layout") + section("Where to add")).splitlines():
        m = re.match(r"\| `(\w+)/` \|", line)
        out.append((m.group(1) if m else None, line))
    return out


def test_layout_and_where_to_add_name_only_paths_that_exist():
    missing = []
    for package, line in _layout_rows():
        for token in re.findall(r"`([^`]+)`", line):
            if PATHISH.fullmatch(token) and token not in ("cli/", "cli/__init__.py") and _where(token, package) is None:
                missing.append(f"{token} ({package or 'top'})")
    assert not missing, f"CONTRIBUTING.md names what does not exist: {missing}"


def test_layout_and_where_to_add_name_only_names_their_modules_define():
    """"`path.py` `NAME`" and "`NAME` in `path.py`": the module defines NAME."""
    missing = []
    for package, line in _layout_rows():
        pairs = [(p, n) for p, n in re.findall(r"`([\w./]+\.py)` `(\w+)`", line)]
        pairs += [(p, n) for n, p in re.findall(r"`(\w+)` in `([\w./]+\.py)`", line)]
        for path, name in pairs:
            where = _where(path, package)
            if where is None or not re.search(rf"^\s*(?:async def |def |class )?{name}\b", where.read_text(), re.M):
                missing.append(f"{name} in {path}")
    assert not missing, f"CONTRIBUTING.md names what its module does not define: {missing}"


def test_each_component_and_library_package_is_in_the_layout_and_has_its_cli():
    """Every package under src/hpcml is a row; a component's command line is its ``cli/``."""
    layout = section("Layout")
    components = re.search(r"### Components.*?(?=^### )", layout, re.M | re.S)
    assert components
    listed = {p for p, line in _layout_rows() if p and line in layout}
    packages = {d.name for d in SRC.iterdir() if (d / "__init__.py").is_file()}
    assert packages - listed == set(), f"packages the Layout does not list: {sorted(packages - listed)}"
    assert listed - packages == set(), f"the Layout lists packages that do not exist: {sorted(listed - packages)}"
    for package in re.findall(r"^\| `(\w+)/` \|", components.group(0), re.M):
        assert (SRC / package / "cli" / "__init__.py").is_file(), f"{package}/ has no cli/__init__.py"


def test_every_repository_path_the_document_names_exists():
    """``src/...``, ``tests/...``, ``docs/...``, ``benchmarks/...``, ``scripts/...`` anywhere in
    the text (not the new files of the Python examples, which a contributor is to write)."""
    text = re.sub(r"^```python\n.*?^```", "", DOC.read_text(), flags=re.M | re.S)
    named = set(re.findall(r"(?<![\w/.<-])((?:src|tests|docs|benchmarks|scripts)/[\w./-]*[\w/])", text))
    named |= {link for link in re.findall(r"\]\(([^)#:]+)", text)}
    assert named, "no path found: the pattern is wrong"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"CONTRIBUTING.md names what does not exist: {missing}"
