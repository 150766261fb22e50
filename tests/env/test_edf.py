"""EDF parsing and resolution (hpcml.env.edf, expand, mounts) and the show/validate CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcml.env.cli import app as env_app
from hpcml.env.edf import find_edf, load
from hpcml.env.expand import ExpansionError, expand
from hpcml.env.model import Mount
from hpcml.env.mounts import MountError, parse_mount
from hpcml.errors import UsageError


@pytest.fixture
def site(tmp_path: Path):
    """A fake HOME with ~/.edf, a separate caller directory, and an environ mapping."""
    home = tmp_path / "home"
    (home / ".edf").mkdir(parents=True)
    cwd = tmp_path / "work"
    cwd.mkdir()

    class Site:
        edf = home / ".edf"
        work = cwd
        root = tmp_path
        environ = {"HOME": str(home), "USER": "alice", "SCRATCH": "/scratch/alice"}

        def write(self, path: Path, text: str) -> Path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return path

        def load(self, name: str, **kw):
            kw.setdefault("environ", self.environ)
            kw.setdefault("cwd", str(self.work))
            return load(name, **kw)

        def error(self, name: str, **kw) -> UsageError:
            with pytest.raises(UsageError) as info:
                self.load(name, **kw)
            return info.value

    return Site()


# ---------------------------------------------------------------- inheritance

def test_two_files_scalars_override_mounts_and_env_accumulate(site):
    base = site.write(site.edf / "base.toml", """
image = "ubuntu:24.04"
workdir = "/base"
mounts = ["/a:/a"]
[env]
A = "1"
B = "base"
""")
    top = site.write(site.work / "top.toml", """
base_environment = "base"
workdir = "/top"
mounts = ["/b:/b:ro"]
[env]
B = "top"
C = "3"
""")
    e = site.load("./top.toml").env
    assert e.image == "ubuntu:24.04" and e.origin["image"] == str(base)
    assert e.workdir == "/top" and e.origin["workdir"] == str(top)
    assert e.mounts == [Mount("/a", "/a"), Mount("/b", "/b", ("ro",))]
    assert e.origin["mounts[0]"] == str(base) and e.origin["mounts[1]"] == str(top)
    assert e.env == {"A": "1", "B": "top", "C": "3"}
    assert e.origin["env.A"] == str(base) and e.origin["env.B"] == str(top)
    assert e.chain == [base, top] and e.file == top


def test_three_levels_in_order(site):
    g = site.write(site.edf / "g.toml", 'image = "g"\nwritable = false\nmounts = ["/g:/g"]\n[env]\nX = "g"\nG = "g"\n')
    p = site.write(site.edf / "p.toml", 'base_environment = "g"\nimage = "p"\nentrypoint = true\n'
                                        'mounts = ["/p:/p"]\n[env]\nX = "p"\n')
    t = site.write(site.edf / "t.toml", 'base_environment = ["p"]\nwritable = true\nmounts = ["/t:/t"]\n')
    e = site.load("t").env
    assert e.chain == [g, p, t]
    assert e.image == "p" and e.origin["image"] == str(p)
    assert e.writable is True and e.origin["writable"] == str(t)
    assert e.entrypoint is True and e.origin["entrypoint"] == str(p)
    assert [m.target for m in e.mounts] == ["/g", "/p", "/t"]
    assert e.env == {"X": "p", "G": "g"} and e.origin["env.G"] == str(g)


def test_list_of_bases_applied_in_order(site):
    a = site.write(site.edf / "a.toml", 'image = "a"\nworkdir = "/a"\n[env]\nK = "a"\n')
    b = site.write(site.edf / "b.toml", 'image = "b"\n[env]\nK = "b"\n')
    t = site.write(site.work / "t.toml", 'base_environment = ["a", "b"]\n')
    e = site.load("./t.toml").env
    assert e.chain == [a, b, t]
    assert (e.image, e.workdir, e.env["K"]) == ("b", "/a", "b")
    site.write(t, 'base_environment = ["b", "a"]\n')
    assert site.load("./t.toml").env.image == "a"


def test_string_base_same_as_one_element_list(site):
    site.write(site.edf / "a.toml", 'image = "a"\nmounts = ["/x:/x"]\n')
    site.write(site.work / "s.toml", 'base_environment = "a"\n')
    site.write(site.work / "l.toml", 'base_environment = ["a"]\n')
    s, li = site.load("./s.toml").env, site.load("./l.toml").env
    assert s.image == li.image == "a" and s.mounts == li.mounts == [Mount("/x", "/x")]


def test_diamond_base_applied_once(site):
    site.write(site.edf / "x.toml", 'image = "x"\nmounts = ["/x:/x"]\n')
    site.write(site.edf / "b.toml", 'base_environment = "x"\nimage = "b"\n')
    site.write(site.edf / "c.toml", 'base_environment = "x"\n')
    e = site.load("./../home/.edf/c.toml", cwd=str(site.work)).env
    assert e.image == "x"
    site.write(site.edf / "t.toml", 'base_environment = ["b", "c"]\n')
    e = site.load("t").env
    assert e.image == "b"                         # x not re-applied after b
    assert e.mounts == [Mount("/x", "/x")]
    assert [p.name for p in e.chain] == ["x.toml", "b.toml", "c.toml", "t.toml"]


def test_ten_levels_ok_eleven_not(site):
    site.write(site.edf / "l0.toml", 'image = "deep"\n')
    for i in range(1, 12):
        site.write(site.edf / f"l{i}.toml", f'base_environment = "l{i - 1}"\n')
    assert len(site.load("l10").env.chain) == 11          # l10 -> ... -> l0: ten levels of bases
    err = site.error("l11")
    assert "more than 10 levels" in str(err) and err.key == "base_environment"
    assert err.file == str(site.edf / "l1.toml")


# ---------------------------------------------------------------- finding files

def test_search_path_edf_path_then_home(site):
    d1, d2 = site.root / "d1", site.root / "d2"
    d1.mkdir()
    found = site.write(d2 / "env.toml", 'image = "d2"\n')
    site.write(site.edf / "env.toml", 'image = "home"\n')
    with_path = dict(site.environ, EDF_PATH=f"{d1}:{d2}")
    assert find_edf("env", with_path, str(site.work)) == found
    assert find_edf("env.toml", with_path, str(site.work)) == found
    assert site.load("env", environ=with_path).env.image == "d2"
    assert site.load("env").env.image == "home"           # EDF_PATH unset: ~/.edf of HOME
    assert find_edf("env", site.environ, str(site.work)) == site.edf / "env.toml"


def test_base_environment_found_on_edf_path(site):
    d = site.root / "site-edfs"
    site.write(d / "common.toml", 'image = "common"\n')
    site.write(site.work / "t.toml", 'base_environment = "common"\n')
    assert site.load("./t.toml", environ=dict(site.environ, EDF_PATH=str(d))).env.image == "common"
    err = site.error("./t.toml")
    assert "common" in str(err) and str(site.edf / "common.toml") in str(err)


def test_not_found_says_where_it_looked(site):
    env = dict(site.environ, EDF_PATH=f"/nonexistent/a:{site.root}/b:relative")
    err = site.error("missing", environ=env)
    msg = str(err)
    assert "/nonexistent/a/missing.toml" in msg and f"{site.root}/b/missing.toml" in msg
    assert "relative" in msg
    err = site.error("missing")
    assert str(site.edf / "missing.toml") in str(err)


def test_relative_paths_against_cwd_not_edf_dir(site):
    edf = site.write(site.root / "elsewhere" / "t.toml", """
base_environment = "./base.toml"
image = "./img.sqsh"
mounts = ["./data:/data", "../up:/up:ro"]
""")
    site.write(site.work / "base.toml", '[env]\nFROM_CWD = "yes"\n')
    site.write(site.root / "elsewhere" / "base.toml", '[env]\nFROM_EDF_DIR = "yes"\n')
    e = site.load(str(edf)).env                          # absolute path used as is
    assert e.image == str(site.work / "img.sqsh")
    assert e.mounts[0].source == str(site.work / "data")
    assert e.mounts[1].source == str(site.root / "up")
    assert e.env == {"FROM_CWD": "yes"}
    assert e.chain[0] == site.work / "base.toml"


def test_registry_image_and_absolute_image_untouched(site):
    site.write(site.work / "a.toml", 'image = "nvcr.io#nvidia/pytorch:25.11-py3"\n')
    site.write(site.work / "b.toml", 'image = "/images/x.sqsh"\n')
    assert site.load("./a.toml").env.image == "nvcr.io#nvidia/pytorch:25.11-py3"
    assert site.load("./b.toml").env.image == "/images/x.sqsh"


# ---------------------------------------------------------------- expansion

ENV = {"A": "alpha", "EMPTY": "", "B": "beta"}


@pytest.mark.parametrize("text, want", [
    ("${A}", "alpha"),
    ("$A/x", "alpha/x"),
    ("${A}_$B", "alpha_beta"),
    ("${NOPE:-dflt}", "dflt"),
    ("${NOPE:-}", ""),
    ("${EMPTY:-dflt}", "dflt"),
    ("${EMPTY-dflt}", ""),
    ("${NOPE-dflt}", "dflt"),
    ("${A:-dflt}", "alpha"),
    ("${NOPE:-$B}", "beta"),
    ("${NOPE:-${B}/y}", "beta/y"),
    ("$$", "$"),
    ("$${A}", "${A}"),
    ("$$A", "$A"),
    ("cost 5$", "cost 5$"),
    ("a $ b", "a $ b"),
    ("plain", "plain"),
])
def test_expand_forms(text, want):
    assert expand(text, ENV) == want


@pytest.mark.parametrize("text, var", [("${NOPE}", "NOPE"), ("$NOPE", "NOPE"), ("x${A}${NOPE2}", "NOPE2"),
                                       ("${NOPE:-${ALSO}}", "ALSO")])
def test_expand_undefined_is_error(text, var):
    with pytest.raises(ExpansionError) as info:
        expand(text, ENV)
    assert info.value.variable == var and var in str(info.value)


@pytest.mark.parametrize("text", ["${A", "$(whoami)", "${1}", "${A:?x}"])
def test_expand_malformed_is_error(text):
    with pytest.raises(ExpansionError):
        expand(text, ENV)


def test_expansion_in_every_field_uses_caller_environ(site):
    site.write(site.edf / "base-alice.toml", '[env]\nFROM_BASE = "1"\n')
    site.write(site.work / "t.toml", """
base_environment = "base-${USER}"
image = "reg#${USER}/img:${TAG:-latest}"
workdir = "${SCRATCH}/run"
mounts = ["${SCRATCH}:/scratch:${FLAG:-ro}"]
devices = ["${DEV:-nvidia.com/gpu=all}"]
[env]
OUT = "${SCRATCH}/out"
PRICE = "$$5"
[annotations]
com.hooks.ssh.authorize_ssh_key = "${HOME}/.ssh/k"
""")
    e = site.load("./t.toml").env
    assert e.image == "reg#alice/img:latest"
    assert e.workdir == "/scratch/alice/run"
    assert e.mounts == [Mount("/scratch/alice", "/scratch", ("ro",))]
    assert e.devices == ["nvidia.com/gpu=all"]
    assert e.env == {"FROM_BASE": "1", "OUT": "/scratch/alice/out", "PRICE": "$5"}
    assert e.annotations["com.hooks.ssh.authorize_ssh_key"] == site.environ["HOME"] + "/.ssh/k"
    e = site.load("./t.toml", environ=dict(site.environ, TAG="v2")).env
    assert e.image == "reg#alice/img:v2"


def test_env_empty_string_unsets(site):
    site.write(site.edf / "b.toml", 'image = "i"\n[env]\nGONE = "set"\n')
    site.write(site.work / "t.toml", 'base_environment = "b"\n[env]\nGONE = ""\nNEW = ""\nE = "${NOPE:-}"\n')
    e = site.load("./t.toml").env
    assert e.env["GONE"] is None and e.env["NEW"] is None
    assert e.env["E"] == ""                      # expands to empty: set empty, not unset
    assert e.origin["env.GONE"] == str(site.work / "t.toml")


@pytest.mark.parametrize("name", ["C;touch X;D", "1A", "A-B", "A.B", "A B", "", "É"])
def test_env_names_must_be_posix_variable_names(site, name):
    """Issue 63: any other name is shell code in an ``export`` line; in a base environment too."""
    site.write(site.edf / "b.toml", f'image = "i"\n\n[env]\nOK = "1"\n"{name}" = "v"\n')
    site.write(site.work / "t.toml", 'base_environment = "b"\n')
    err = site.error("./t.toml")
    assert err.file == str(site.edf / "b.toml") and err.key == f"env.{name}" and "not a variable name" in str(err)
    assert err.line == (5 if name else None) and "\n" not in str(err)


def test_env_names_of_every_posix_form_are_kept(site):
    site.write(site.work / "t.toml", 'image = "i"\n[env]\n_ = "1"\n_a1 = "2"\nlower = "3"\nZ9_ = "4"\n')
    assert site.load("./t.toml").env.env == {"_": "1", "_a1": "2", "lower": "3", "Z9_": "4"}


# ---------------------------------------------------------------- annotations

def test_annotations_dotted_equals_table(site):
    site.write(site.work / "dotted.toml", """image = "i"
[annotations]
com.hooks.ssh.enabled = true
com.hooks.ssh.port = 15263
com.hooks.aws_ofi_nccl.variant = "cuda12"
""")
    site.write(site.work / "table.toml", """image = "i"
[annotations.com.hooks.ssh]
enabled = true
port = 15263
[annotations.com.hooks]
aws_ofi_nccl.variant = "cuda12"
""")
    d, t = site.load("./dotted.toml").env, site.load("./table.toml").env
    want = {"com.hooks.ssh.enabled": "true", "com.hooks.ssh.port": "15263",
            "com.hooks.aws_ofi_nccl.variant": "cuda12"}
    assert d.annotations == want and t.annotations == want
    assert t.origin["annotations.com.hooks.ssh.enabled"] == str(site.work / "table.toml")


def test_annotations_merge_by_key(site):
    site.write(site.edf / "b.toml", 'image = "i"\n[annotations]\ncom.hooks.cxi.enabled = "true"\na.b = false\n')
    site.write(site.work / "t.toml", 'base_environment = "b"\n[annotations]\ncom.hooks.cxi.enabled = "false"\n')
    e = site.load("./t.toml").env
    assert e.annotations == {"com.hooks.cxi.enabled": "false", "a.b": "false"}
    assert e.origin["annotations.a.b"] == str(site.edf / "b.toml")


# ---------------------------------------------------------------- mounts

@pytest.mark.parametrize("spec, want", [
    ("/a:/b", Mount("/a", "/b")),
    ("/a:/b:ro", Mount("/a", "/b", ("ro",))),
    ("/x.sqsh:/data:sqsh", Mount("/x.sqsh", "/data", ("sqsh",))),
    ("/a:/b:ro+private+nosuid+rbind", Mount("/a", "/b", ("ro", "private", "nosuid", "rbind"))),
    ("./d:/d", Mount("/cwd/d", "/d")),
    ("/capstor", Mount("/capstor", "/capstor")),                    # pyxis's short form
    ("./d", Mount("/cwd/d", "/cwd/d")),
    ("/a:/b:unbindable+ro", Mount("/a", "/b", ("unbindable", "ro"))),
])
def test_parse_mount(spec, want):
    m = parse_mount(spec, "/cwd")
    assert m == want


@pytest.mark.parametrize("spec, words", [
    ("a", "must be absolute"),
    ("/a:b", "absolute"),
    (":/b", "empty source"),
    ("/a:", "empty destination"),
    ("/a:/b:ro+bogus", "'bogus'"),
    ("/a:/b:ro+", "empty flag"),
    ("/a:/b:ro:x", "too many"),
    ("data:/d", "source must be absolute"),
])
def test_parse_mount_errors(spec, words):
    with pytest.raises(MountError) as info:
        parse_mount(spec, "/cwd")
    assert words in str(info.value)


@pytest.mark.parametrize("spec, words", [
    ("rel", "must be absolute"), ("/a:rel", "absolute"), (":/b", "empty source"), ("/a:/b:ro+bogus", "'bogus'"),
    ("/a:/b:remount", "'remount'"),
])
def test_bad_mount_in_edf_names_file_key_line(site, spec, words):
    site.write(site.work / "t.toml", f'image = "i"\nmounts = [\n  "/ok:/ok",\n  "{spec}",\n]\n')
    err = site.error("./t.toml")
    assert words in str(err)
    assert err.file == str(site.work / "t.toml") and err.key == "mounts[1]" and err.line == 4
    assert "t.toml:4: key 'mounts[1]'" in str(err)


# ---------------------------------------------------------------- bad input

def test_toml_syntax_error_has_line(site):
    site.write(site.work / "t.toml", 'image = "i"\nworkdir = \n')
    err = site.error("./t.toml")
    assert err.line == 2 and "not valid TOML" in str(err) and "t.toml:2" in str(err)


def test_cycle_is_named(site):
    site.write(site.edf / "a.toml", 'base_environment = "b"\n')
    site.write(site.edf / "b.toml", 'base_environment = ["c"]\n')
    site.write(site.edf / "c.toml", 'base_environment = "a"\n')
    err = site.error("a")
    assert "cyclic" in str(err) and err.key == "base_environment"
    assert [Path(p).name for p in str(err).split(": ")[-1].split(" -> ")] == ["a.toml", "b.toml", "c.toml", "a.toml"]


def test_self_cycle(site):
    site.write(site.edf / "a.toml", 'image = "i"\nbase_environment = "./../home/.edf/a.toml"\n')
    err = site.error("a")
    assert "cyclic" in str(err) and err.line == 2


def test_undefined_variable_names_it_and_the_key(site):
    site.write(site.work / "t.toml", 'image = "i"\nworkdir = "${MISSING}/x"\n')
    err = site.error("./t.toml")
    assert "MISSING" in str(err) and err.key == "workdir" and err.line == 2


def test_undefined_variable_in_env_warns_the_image_may_define_it(site):
    """[env] resolves against the container's environment: only the start can tell."""
    site.write(site.work / "t.toml", 'image = "i"\n[env]\nOK = "1"\nOUT = "${MISSING}/x"\n')
    r = site.load("./t.toml")
    assert r.env.env_template == {"OUT": "${MISSING}/x"} and r.env.env["OUT"] == "${MISSING}/x"
    assert len(r.warnings) == 1 and "t.toml:4: key 'env.OUT': MISSING is not set here" in r.warnings[0]


def test_undefined_variable_in_base_environment(site):
    site.write(site.work / "t.toml", 'base_environment = "${NOPE}"\n')
    err = site.error("./t.toml")
    assert "NOPE" in str(err) and err.key == "base_environment"


@pytest.mark.parametrize("text, key, words", [
    ('image = "i"\nwritable = "yes"\n', "writable", "string 'yes'"),
    ('image = "i"\nentrypoint = 1\n', "entrypoint", "number 1"),
    ('image = "i"\nmounts = "a:b"\n', "mounts", "array of strings"),
    ('image = "i"\nmounts = [1]\n', "mounts[0]", "number 1"),
    ('image = "i"\ndevices = "x"\n', "devices", "array of strings"),
    ('image = 3\n', "image", "number 3"),
    ('image = "i"\nworkdir = false\n', "workdir", "boolean false"),
    ('image = "i"\nbase_environment = 3\n', "base_environment", "string or an array"),
    ('image = "i"\n[env]\nN = 3\n', "env.N", "number 3"),
    ('image = "i"\n[env]\nN = true\n', "env.N", "boolean true"),
    ('image = "i"\n[env]\nA.B = "x"\n', "env.A", "a table"),
    ('image = "i"\nenv = "A=1"\n', "env", "a table"),
    ('image = "i"\nannotations = "x"\n', "annotations", "a table"),
    ('image = "i"\n[annotations]\na.b = ["x"]\n', "annotations.a.b", "an array"),
])
def test_wrong_types(site, text, key, words):
    site.write(site.work / "t.toml", text)
    err = site.error("./t.toml")
    assert err.key == key and words in str(err) and err.file == str(site.work / "t.toml")
    assert f"key '{key}'" in str(err)


def test_image_required_unless_not(site):
    site.write(site.work / "t.toml", 'workdir = "/w"\n')
    err = site.error("./t.toml")
    assert err.key == "image" and "no image" in str(err)
    assert site.load("./t.toml", require_image=False).env.image == ""


def test_unknown_key_is_an_error_naming_the_nearest_key(site):
    """Issue 19: `mount = [...]` only warned, and the job ran without its mounts."""
    site.write(site.work / "t.toml", 'image = "i"\nmount = ["/a:/b"]\n')
    e = site.error("./t.toml")
    assert "t.toml:2" in str(e) and "key 'mount'" in str(e) and "did you mean 'mounts'?" in str(e)
    site.write(site.work / "t.toml", 'image = "i"\nimgae = "typo"\n')
    r = site.load("./t.toml", lenient=True)                       # --lenient: a warning again
    assert len(r.warnings) == 1 and "imgae" in r.warnings[0] and "t.toml:2" in r.warnings[0]
    assert "did you mean 'image'" in r.warnings[0]
    assert len(site.load("./t.toml", environ={**site.environ, "HPCML_EDF_LENIENT": "1"}).warnings) == 1
    site.write(site.work / "ok.toml", 'image = "i"\n[env]\nX = "1"\n[annotations]\na = "b"\n')
    assert site.load("./ok.toml").warnings == []


# ---------------------------------------------------------------- CLI

@pytest.fixture
def cli(site, monkeypatch):
    monkeypatch.chdir(site.work)
    monkeypatch.setenv("HOME", site.environ["HOME"])
    monkeypatch.delenv("EDF_PATH", raising=False)
    runner = CliRunner()
    return lambda *args: runner.invoke(env_app, list(args), env={"COLUMNS": "400"})


def test_cli_show_table_and_json(site, cli):
    base = site.write(site.edf / "base.toml", 'image = "ubuntu:24.04"\n[env]\nA = "[bold]x"\n')
    site.write(site.work / "t.toml", 'base_environment = "base"\nworkdir = "/w"\nextra = 1\n')
    assert cli("show", "./t.toml").exit_code == 2                   # an unknown key is an error ...
    site.write(site.work / "t.toml", 'base_environment = "base"\nworkdir = "/w"\n')
    r = cli("show", "./t.toml")
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if "ubuntu:24.04" in x)
    assert "image" in line and "base.toml" in line
    assert "[bold]x" in r.stdout                               # values are not Rich markup
    assert "extra" not in r.stdout
    r = cli("show", "./t.toml", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["image"] == "ubuntu:24.04" and data["origin"]["image"] == str(base)
    assert data["origin"]["workdir"] == str(site.work / "t.toml") and data["env"] == {"A": "[bold]x"}
    assert data["warnings"] == []


def test_cli_validate(site, cli):
    site.write(site.work / "good.toml", 'image = "i"\n')
    site.write(site.work / "bad.toml", 'image = "i"\nwritable = "yes"\n')
    r = cli("validate", "./good.toml")
    assert r.exit_code == 0 and r.stdout.strip() == "ok"
    r = cli("validate", "./bad.toml")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("hpcml env validate: error: ") and "bad.toml:2: key 'writable'" in r.stderr


def test_cli_show_bad_edf_one_line_exit_2(site, cli):
    r = cli("show", "nosuch")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "hpcml env show: error:" in r.stderr and str(site.edf / "nosuch.toml") in r.stderr


def test_cli_validate_a_bare_name_of_a_file_here_suggests_its_path(site, cli):
    """Issue 29: 'host.toml' in the current directory gave only "not found on ~/.edf"; a
    bare name stays a name on EDF_PATH / ~/.edf (CSCS's rule), the message gives the path."""
    site.write(site.work / "host.toml", 'image = "i"\n')
    for name in ("host.toml", "host"):
        r = cli("validate", name)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1
        assert "not found on ~/.edf" in r.stderr and "./host.toml (a path needs a '/')" in r.stderr
    assert cli("validate", "./host.toml").exit_code == 0
    assert "this directory" not in cli("validate", "nosuch").stderr


def test_cli_show_without_image_validate_requires_it(site, cli):
    site.write(site.work / "frag.toml", 'mounts = ["/a:/a"]\n')
    r = cli("show", "./frag.toml")
    assert r.exit_code == 0 and "(none)" in r.stdout
    r = cli("validate", "./frag.toml")
    assert r.exit_code == 2 and "key 'image'" in r.stderr


def test_devices_accumulate_without_duplicates(site):
    b = site.write(site.edf / "b.toml", 'image = "i"\ndevices = ["nvidia.com/gpu=all"]\n')
    t = site.write(site.work / "t.toml", 'base_environment = "b"\ndevices = ["nvidia.com/gpu=all", "/dev/gdrdrv"]\n')
    e = site.load("./t.toml").env
    assert e.devices == ["nvidia.com/gpu=all", "/dev/gdrdrv"]
    assert e.origin["devices[0]"] == str(b) and e.origin["devices[1]"] == str(t)


# ---------------------------------------------------------------- CSCS conformance, by class

def test_mount_added_by_two_bases_with_different_flags_is_mounted_once(site):
    """The later mount at a destination covers the earlier: mount it alone, where it comes."""
    a = site.write(site.edf / "a.toml", 'image = "i"\nmounts = ["/capstor", "/x:/x"]\n')
    b = site.write(site.edf / "b.toml", 'mounts = ["/capstor/:/capstor:ro+unbindable", "/y:/y"]\n')
    site.write(site.work / "t.toml", 'base_environment = ["a", "b"]\nmounts = ["/x:/x"]\n')
    e = site.load("./t.toml").env
    assert [m.spec() for m in e.mounts] == ["/capstor/:/capstor:ro+unbindable", "/y:/y", "/x:/x"]
    assert [e.origin[f"mounts[{i}]"] for i in range(3)] == [str(b), str(b), str(site.work / "t.toml")]
    assert "mounts[3]" not in e.origin and str(a) in map(str, e.chain)


def test_env_values_with_variables_are_kept_for_the_container(site):
    site.write(site.work / "t.toml", '''image = "i"
[env]
PATH = "${PATH}:/custom/bin"
LIT = "$${HOME} costs $$5"
DEF = "${NOPE:-fallback}"
PLAIN = "x"
''')
    r = site.load("./t.toml", environ=dict(site.environ, PATH="/login/bin"))
    e = r.env
    assert e.env == {"PATH": "/login/bin:/custom/bin", "LIT": "${HOME} costs $5", "DEF": "fallback", "PLAIN": "x"}
    assert e.env_template == {"PATH": "${PATH}:/custom/bin", "DEF": "${NOPE:-fallback}"}   # escaped $: literal
    assert r.warnings == []


def test_env_later_literal_replaces_a_template(site):
    site.write(site.edf / "b.toml", 'image = "i"\n[env]\nP = "${HOME}/x"\n')
    site.write(site.work / "t.toml", 'base_environment = "b"\n[env]\nP = "fixed"\n')
    e = site.load("./t.toml").env
    assert e.env["P"] == "fixed" and e.env_template == {}


def test_env_bad_substitution_is_still_an_error(site):
    site.write(site.work / "t.toml", 'image = "i"\n[env]\nX = "${A:?no}"\n')
    err = site.error("./t.toml")
    assert err.key == "env.X" and "bad substitution" in str(err)


def test_engines_defaults_and_limits(site):
    site.write(site.work / "t.toml", 'image = "nvcr.io/nvidia/pytorch:25.01-py3"\nmounts = ["/a:/a"]\n')
    assert site.load("./t.toml").env.entrypoint is False                       # CSCS CE (pyxis)
    assert site.load("./t.toml", engine="sarus-suite").env.entrypoint is True  # sarusctl render
    env = dict(site.environ, HPCML_EDF_ENGINE="sarus-suite")
    assert site.load("./t.toml", environ=env).env.entrypoint is True
    site.write(site.work / "off.toml", 'base_environment = "./t.toml"\nentrypoint = false\n')
    assert site.load("./off.toml", engine="sarus-suite").env.entrypoint is False
    site.write(site.work / "short.toml", 'image = "i"\nmounts = ["/capstor"]\n')
    err = site.error("./short.toml", engine="sarus-suite")
    assert err.key == "mounts[0]" and "Sarus Suite needs SRC:DST" in str(err)
    site.write(site.work / "path.toml", 'image = "/img/x.sqsh"\n')
    err = site.error("./path.toml", engine="sarus-suite")
    assert err.key == "image" and "registry references only" in str(err)
    assert site.error("./t.toml", engine="docker").key == "engine"


def test_show_prints_the_engine_default_and_env_template(site, monkeypatch):
    site.write(site.work / "t.toml", 'image = "i"\n[env]\nP = "${HOME}/bin"\n')
    monkeypatch.chdir(site.work)
    monkeypatch.setenv("HOME", site.environ["HOME"])
    out = CliRunner().invoke(env_app, ["show", "./t.toml", "--json", "--engine", "sarus-suite"])
    doc = json.loads(out.output)
    assert doc["entrypoint"] is True and doc["env_template"] == {"P": "${HOME}/bin"}
    assert doc["env"]["P"] == site.environ["HOME"] + "/bin"
