"""One CLI convention and one error path, for every component.

(a) Every component has a ``hpcml.<component>.cli`` package whose ``app`` is mounted by
    ``hpcml.cli_app`` and built on ``hpcml.cli_support.Group``.
(b) Library code raises ``HpcmlError`` subclasses and never prints-and-exits on one, nor names
    a command-line flag as the key of an error: only the CLI layer does (AST and grep over
    src/, each with a probe that shows the check can fail).
(c) Bad input through several components' commands ends in one stderr line
    ``hpcml <component> <command>: error: ...``, exit code 2, no traceback.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import hpcml.cli
import hpcml.cli_app
from hpcml.cli import report
from hpcml.cli_support import Group
from hpcml.errors import HpcmlError, SlurmError, UsageError

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hpcml"
#: every package with a cli/ package, found the way ``hpcml`` finds them (not a list here)
COMPONENTS = hpcml.cli.components()
#: components whose commands are ``hpcml``'s own (``hpcml run``, ``hpcml report``)
TOP = set(hpcml.cli.TOP_LEVEL.values())


def test_the_components_are_found_on_disk():
    on_disk = sorted(p.parent.name for p in SRC.glob("*/cli") if p.is_dir())
    assert list(COMPONENTS) == on_disk and {"run", "vet", "farm"} <= set(COMPONENTS)

# -- (a) the same shape everywhere --------------------------------------------------------


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_has_a_cli_package_with_its_app(component):
    package = SRC / component / "cli"
    assert (package / "__init__.py").is_file()
    leftovers = sorted(p.name for p in (SRC / component).glob("cli*.py")
                       if p.stem == "cli" or p.stem.startswith("cli_"))     # not centre/client.py
    assert leftovers == [], f"CLI modules outside {component}/cli/: {leftovers}"
    module = importlib.import_module(f"hpcml.{component}.cli")
    assert Path(module.__file__) == package / "__init__.py"
    assert isinstance(module.app, typer.Typer)
    assert isinstance(typer.main.get_command(module.app), Group)
    mounted = {g.name: g.typer_instance for g in hpcml.cli_app.app.registered_groups}
    if component in TOP:
        top = {c.callback for c in hpcml.cli_app.app.registered_commands}
        assert {c.callback for c in module.app.registered_commands} <= top
    else:
        assert mounted.get(component) is module.app


def test_every_mounted_group_is_a_component_and_the_top_level_is_a_group():
    assert sorted(g.name for g in hpcml.cli_app.app.registered_groups) == sorted(set(COMPONENTS) - TOP)
    assert isinstance(typer.main.get_command(hpcml.cli_app.app), Group)


# -- (b) the CLI layer alone turns errors into messages and names flags --------------------

def _is_cli_layer(path: Path) -> bool:
    rel = path.relative_to(SRC)
    return "cli" in rel.parts[:-1] or str(rel) in ("cli.py", "cli_app.py", "cli_support.py")


# Programs of their own, not the hpcml command: their argparse main reports its own errors.
STANDALONE = {"testing/localslurm.py": "the local Slurm cluster's own `python -m` tool"}


def _error_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """HpcmlError and every class in src that derives from it (by name, to a fixpoint)."""
    names = {"HpcmlError"}
    while True:
        more = {node.name for tree in trees.values() for node in ast.walk(tree)
                if isinstance(node, ast.ClassDef) and node.name not in names
                and any((b.id if isinstance(b, ast.Name) else getattr(b, "attr", None)) in names
                        for b in node.bases)}
        if not more:
            return names
        names |= more


def _caught(handler: ast.ExceptHandler) -> set[str]:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in types if t is not None}


def _prints_and_exits(handler: ast.ExceptHandler) -> bool:
    """The handler reports the error itself: prints it, or exits with it."""
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if name in ("print", "fail", "echo", "exit", "Exit", "SystemExit"):
                return True
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if getattr(target, "attr", getattr(target, "id", "")) in ("Exit", "SystemExit"):
                return True
        if isinstance(node, ast.Return) and node.value is not None and any(
                isinstance(n, ast.Attribute) and n.attr == "exit_code" for n in ast.walk(node.value)):
            return True
    return False


def _main_blocks(tree: ast.Module) -> list[range]:
    """``if __name__ == "__main__":`` blocks: a module's own little program may report."""
    return [range(n.lineno, (n.end_lineno or n.lineno) + 1) for n in tree.body
            if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]


def handlers_that_report(source: str, errors: set[str]) -> list[int]:
    """Lines of ``except <an HpcmlError>`` handlers that print or exit instead of raising."""
    tree = ast.parse(source)
    mains = _main_blocks(tree)
    return [h.lineno for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler)
            and h.type is not None and _caught(h) & errors and _prints_and_exits(h)
            and not any(h.lineno in block for block in mains)]


KEY_IS_A_FLAG = re.compile(r"""\bkey\s*=\s*f?["']--""")


def _library_modules() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))
            if not _is_cli_layer(p) and str(p.relative_to(SRC)) not in STANDALONE}


def test_only_the_cli_layer_reports_errors():
    modules = _library_modules()
    trees = {p: ast.parse(s) for p, s in modules.items()}
    errors = _error_classes({p: ast.parse(p.read_text(encoding="utf-8")) for p in SRC.rglob("*.py")})
    assert {"UsageError", "SlurmError", "StoreError", "CorruptShardError"} <= errors
    bad = [f"{p.relative_to(SRC)}:{line}" for p, s in modules.items()
           for line in handlers_that_report(s, errors)]
    assert bad == [], f"library code reporting an HpcmlError itself (raise it instead): {bad}"
    assert len(trees) > 100


def test_the_reporting_check_can_fail():
    probe = ("try:\n    load()\nexcept UsageError as exc:\n    print(exc, file=sys.stderr)\n"
             "    raise typer.Exit(exc.exit_code)\n"
             "try:\n    load()\nexcept (OSError, HpcmlError) as exc:\n    return exc.exit_code\n"
             "try:\n    load()\nexcept HpcmlError as exc:\n    fail('hpcml x', exc)\n"
             "try:\n    load()\nexcept HpcmlError as exc:\n    queue.put(str(exc))\n"   # passes it on: fine
             "try:\n    load()\nexcept ValueError:\n    sys.exit(2)\n"                   # not ours: fine
             "if __name__ == '__main__':\n    try:\n        load()\n"
             "    except HpcmlError as exc:\n        sys.exit(str(exc))\n")                # a program: fine
    assert handlers_that_report(probe, {"HpcmlError", "UsageError"}) == [3, 8, 12]


def test_no_library_module_names_a_flag_as_an_error_key():
    bad = [f"{p.relative_to(SRC)}:{n}" for p, s in _library_modules().items()
           for n, line in enumerate(s.splitlines(), 1) if KEY_IS_A_FLAG.search(line)]
    assert bad == [], f"name the setting (key='prometheus_port'), the CLI shows its flag: {bad}"
    for line in ('raise UsageError("x", key="--db")', "UsageError('x', key='--db')", 'key=f"--{name}"'):
        assert KEY_IS_A_FLAG.search(line)
    assert not KEY_IS_A_FLAG.search('raise UsageError("x", key="prometheus_port")')


@pytest.mark.parametrize("module, name, code", [
    ("hpcml.centre.collector.schema", "Invalid", 2),
    ("hpcml.centre.collector.store", "StoreError", 1),
    ("hpcml.vet.registry", "UnknownCheck", 2),
    ("hpcml.vet.checks.base", "MissingDependency", 1),
    ("hpcml.data.stage", "TargetUnavailable", 1),
    ("hpcml.data.reader", "ResumeStateError", 2),
    ("hpcml.data.reader", "CorruptShardError", 2),
    ("hpcml.data.loadbench", "WorkerError", 1),
    ("hpcml.env.mounts", "MountError", 2),
    ("hpcml.env.expand", "ExpansionError", 2),
    ("hpcml.env.venv", "VenvError", 1),
    ("hpcml.samplers.dcgm", "DcgmUnavailable", 1),
    ("hpcml.scan.picklewalk", "PickleError", 7),
])
def test_component_errors_are_hpcml_errors(module, name, code):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, HpcmlError) and cls.exit_code == code


# -- the one error path -------------------------------------------------------------------

def test_report_shows_a_setting_as_its_flag_but_leaves_a_files_key(capsys):
    flags = {"prometheus_port": "--prometheus-port"}
    assert report("hpcml observe record", UsageError("port in use", key="prometheus_port"), flags) == 2
    assert capsys.readouterr().err == "hpcml observe record: error: flag '--prometheus-port': port in use\n"
    report("hpcml x", UsageError("bad", file="p.yaml", key="prometheus_port", line=3), flags)
    assert capsys.readouterr().err == "hpcml x: error: p.yaml:3: key 'prometheus_port': bad\n"
    assert report("hpcml x", SlurmError("srun: timed out\nafter 5 s")) == 1
    assert capsys.readouterr().err == "hpcml x: error: srun: timed out after 5 s\n"


def test_a_group_ends_any_command_that_raises_with_one_line_and_the_exit_code():
    app = typer.Typer(name="demo", cls=Group)

    @app.command("boom")
    def boom(shard_size: str = typer.Option("1 MB", "--shard-size")) -> None:
        if shard_size == "bad":
            raise UsageError(f"expected a size, found {shard_size!r}", key="shard_size")
        raise SlurmError("srun: Slurm is not installed")

    @app.command("other")
    def other() -> None:
        pass

    out = CliRunner().invoke(app, ["boom"])
    assert out.exit_code == 1 and out.stderr == "hpcml demo boom: error: srun: Slurm is not installed\n"
    out = CliRunner().invoke(app, ["boom", "--shard-size", "bad"])
    assert out.exit_code == 2
    assert out.stderr == "hpcml demo boom: error: flag '--shard-size': expected a size, found 'bad'\n"


# -- (c) bad input through the real command -------------------------------------------------

@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "src").mkdir()
    (tmp / "src" / "a.txt").write_text("a\n")
    (tmp / "proto.yaml").write_text("name: t\nevals:\n  - {name: a, type: nosuch}\n")
    (tmp / "bad.toml").write_text('image = "i"\nwritable = "yes"\n')
    (tmp / "ok.toml").write_text('image = "/"\n')
    return tmp


CASES = [
    (["vet", "validate", "{t}/proto.yaml"], "hpcml vet validate: error: ", "unknown check type"),
    (["vet", "{t}/proto.yaml", "--out", "{t}/vet"], "hpcml vet: error: ", "unknown check type"),
    (["scan", "--policy", "{t}/nope.yaml", "{t}/src"], "hpcml scan: error: ", "nope.yaml"),
    (["scan", "requirements", "{t}/nope.txt"], "hpcml scan requirements: error: ", "nope.txt"),
    (["data", "pack", "{t}/src", "{t}/out", "--shard-size", "10GBs"],
     "hpcml data pack: error: flag '--shard-size': ", "10GBs"),
    (["data", "doctor", "{t}/src", "--read-size", "0"], "hpcml data doctor: error: flag '--read-size': ",
     "at least 1 byte"),
    (["env", "validate", "{t}/bad.toml"], "hpcml env validate: error: ", "bad.toml:2: key 'writable'"),
    (["env", "run", "{t}/bad.toml", "--", "true"], "hpcml env run: error: ", "bad.toml:2: key 'writable'"),
    (["env", "render", "--runtime", "nosuch", "{t}/ok.toml", "--", "true"],
     "hpcml env render: error: flag '--runtime': ", "unknown runtime 'nosuch'"),
    (["observe", "summary", "{t}/nope"], "hpcml observe summary: error: ", "not a job directory"),
    (["observe", "record", "--dir", "{t}/obs", "--interval", "0.01", "--", "true"],
     "hpcml observe record: error: flag '--interval': ", "at least"),
    (["score", "report", "{t}/nope", "--no-html"], "hpcml score report: error: ", "nope"),
]


@pytest.mark.parametrize("args, start, words", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_bad_input_is_one_line_naming_the_command_and_exit_2(inputs, args, start, words):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    p = subprocess.run([sys.executable, "-m", "hpcml", *[a.format(t=inputs) for a in args]],
                       capture_output=True, text=True, env=env, cwd=inputs, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(start) and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_help_shows_flags_as_flags():
    """Issue 19: every on/off switch showed `<bool>` in --help, as if it took a value."""
    import subprocess
    import sys
    for args in (["vet", "run"], ["observe", "record"], ["run"], ["data", "pack"]):
        p = subprocess.run([sys.executable, "-m", "hpcml", *args, "--help"], capture_output=True, text=True,
                           timeout=60, env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"})
        assert p.returncode == 0, p.stderr
        assert "<bool>" not in p.stdout and "--" in p.stdout, args


def test_help_prose_is_reflowed_not_wrapped_twice():
    """Issue 19: a docstring's own line breaks plus Rich's wrap at 80 columns left half-lines."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--help"], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    # one docstring paragraph, hard-wrapped in the source, comes out as one line at 200 columns
    line = next(x for x in p.stdout.splitlines() if "Every task gets MASTER_ADDR" in x)
    assert "recorded by hpcml observe. At the end" in line


@pytest.mark.parametrize("argv", [["run", "--help"], ["report", "--help"], ["ckpt", "--help"]])
def test_a_command_loads_its_own_component_s_cli_only(argv):
    """``hpcml run`` used to import every component's CLI (and their numpy, pyarrow, ...)."""
    import subprocess
    import sys
    code = ("import runpy, sys\nsys.argv = ['hpcml', *sys.argv[1:]]\ntry:\n    runpy.run_module('hpcml', run_name='__main__')\n"
            "except SystemExit:\n    pass\n")
    probe = code.replace("runpy.run_module('hpcml', run_name='__main__')",
                         "import atexit; atexit.register(lambda: sys.__stderr__.write('CLIS ' + ' '.join(sorted("
                         "m for m in sys.modules if m.startswith('hpcml.') and m.endswith('.cli') and m != 'hpcml.cli'"
                         ")) + '\\n'))\n    runpy.run_module('hpcml', run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    loaded = [line for line in p.stderr.splitlines() if line.startswith("CLIS ")]
    owner = hpcml.cli.TOP_LEVEL.get(argv[0], argv[0])
    assert loaded == [f"CLIS hpcml.{owner}.cli"], p.stderr
